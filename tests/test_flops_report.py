"""RankState.flops is the FlopsReport record (probe.wire.flops), built once when a ``flops`` frame
arrives: what accounting reads of the count, typed; unknown fields ignored, a malformed value
refused at decode (the kept record stays), its text interned across ranks."""

from __future__ import annotations

from typing import Any

import pytest

from flowtop.monitor.recording import feed
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import DtypeFlops, FlopsReport, flops_report

T = 1e12
COUNT: dict[str, Any] = {
    "step": 20, "model_flops": 3e9, "executed_flops": 3.6e9, "estimated_flops": 2.9e9,
    "estimate_source": "6N+12LdT (PaLM)", "attention": "causal", "attention_masking": "causal",
    "dtype": "bf16", "peak_flops": 989 * T, "peak_source": "datasheet H100 SXM",
    "uncounted": {"aten::_fused_rms_norm": 8}, "uncounted_size": {"aten::_fused_rms_norm": 4096},
    "tokens": 1024, "signature": "x" * 300, "cost_s": 0.02, "counted": True, "model_note": "",
    "parallel": "mesh (tp=2)", "flops_by_dtype": {"bf16": [2e9, 2.4e9], "fp32": [1e9, 1.2e9]},
    "peak_by_dtype": {"bf16": 989 * T, "fp32": 67 * T}, "expert_load": {"layers.0": [5, 3, 0, 8]},
    "nonpad_tokens": 1000,
}


def _key(rank: int) -> wire.RankKey:
    return wire.RankKey("j", "h", 100 + rank, rank, 0)


def _frame(rank: int, seq: int, **fields: Any) -> bytes:
    return wire.encode("flops", _key(rank), seq, 1.0, fields)


def test_the_model_keeps_the_counts_record_built_when_it_arrives() -> None:
    model = make_model()
    feed(model, _frame(0, 0, **COUNT, some_future_field=[1, 2]), 10.0)  # a newer minor's field
    st = model.ranks[_key(0)]
    assert st.flops == FlopsReport(
        model_flops=3e9, executed_flops=3.6e9, step=20, tokens=1024, estimated_flops=2.9e9,
        estimate_source="6N+12LdT (PaLM)", attention="causal", attention_masking="causal", dtype="bf16",
        peak_flops=989 * T, peak_source="datasheet H100 SXM", uncounted={"aten::_fused_rms_norm": 8},
        uncounted_size={"aten::_fused_rms_norm": 4096}, counted=True, model_note="", parallel="mesh (tp=2)",
        flops_by_dtype={"bf16": DtypeFlops(model=2e9, executed=2.4e9), "fp32": DtypeFlops(model=1e9, executed=1.2e9)},
        peak_by_dtype={"bf16": 989 * T, "fp32": 67 * T}, expert_load={"layers.0": (5, 3, 0, 8)},
        nonpad_tokens=1000)
    kept = st.flops
    # the same object until the next count: the relays' marks compare it by identity
    feed(model, wire.encode("telemetry", _key(0), 1, 1.0, {"gpu": {}, "proc": {}}), 11.0)
    assert st.flops is kept
    feed(model, _frame(0, 2, **{**COUNT, "step": 40}), 12.0)
    assert st.flops is not kept and st.flops is not None and st.flops.step == 40


def test_a_malformed_value_is_refused_and_the_kept_count_stays() -> None:
    model = make_model()
    feed(model, _frame(0, 0, **COUNT), 10.0)
    kept = model.ranks[_key(0)].flops
    for bad in ({"tokens": -1}, {"flops_by_dtype": {"bf16": [1.0]}}, {"attention": "sliding"},
                {"expert_load": {"layers.0": [-3]}}, {"counted": 1}):
        with pytest.raises(wire.WireError):
            wire.decode(_frame(0, 1, **{**COUNT, **bad}))
        feed(model, _frame(0, 1, **{**COUNT, **bad}), 11.0)
        assert model.ranks[_key(0)].flops is kept
    assert model.rejected == 5


def test_ranks_share_the_counts_text() -> None:
    """Thousands of ranks name the same dtype, peak source and ops: one string each, interned as
    the frame's dict was before (a decoded frame's strings are new objects every time)."""
    model = make_model()
    for rank in (0, 1):
        feed(model, _frame(rank, 0, **COUNT), 10.0)
    a, b = (model.ranks[_key(r)].flops for r in (0, 1))
    assert a is not None and b is not None and a is not b
    assert a.peak_source is b.peak_source and a.dtype is b.dtype and a.parallel is b.parallel
    assert next(iter(a.uncounted)) is next(iter(b.uncounted))
    assert next(iter(a.flops_by_dtype)) is next(iter(b.flops_by_dtype))


def test_a_dtypes_flops_are_a_frozen_slotted_record_not_a_pair() -> None:
    """``flops_by_dtype``'s [model, executed] is read by name (DtypeFlops), never by index."""
    import dataclasses

    r = flops_report({**COUNT, "flops_by_dtype": {"fp8_e4m3": [8e8, 9e8]}})
    fp8 = r.flops_by_dtype["fp8_e4m3"]
    assert isinstance(fp8, DtypeFlops) and (fp8.model, fp8.executed) == (8e8, 9e8)
    assert not hasattr(fp8, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp8.model = 1.0  # type: ignore[misc]


def test_a_counts_missing_optional_fields_read_as_before() -> None:
    """The defaults accounting always read a missing field as (an older probe, a count by hand):
    no step, no tokens, full attention, dtype "?", counted, no mix, no MoE load, no padding."""
    r = flops_report({"model_flops": 1e9, "executed_flops": 1.2e9})
    assert (r.step, r.tokens, r.attention, r.attention_masking, r.dtype, r.peak_flops, r.peak_source) == (
        None, 0, "full", None, "?", None, "")
    assert (r.estimated_flops, r.estimate_source, r.counted, r.model_note, r.parallel, r.nonpad_tokens) == (
        None, None, True, "", "", None)
    assert dict(r.uncounted) == dict(r.flops_by_dtype) == dict(r.expert_load) == {}
    # the shared empty map: no dict of its own per rank
    assert r.uncounted is r.uncounted_size is r.flops_by_dtype is r.peak_by_dtype is r.expert_load
    assert flops_report({**COUNT, "counted": False}).counted is False
    with pytest.raises(KeyError):
        flops_report({"model_flops": 1e9})  # the count itself is required (the schema says so too)
