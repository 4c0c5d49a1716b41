"""accounting.rank_mfu (the sparkline's sample at every telemetry frame) is the MFU of the rank's
view, computed without building the view: the same figure in every case, pinned by hand."""

from __future__ import annotations

from typing import Any

import pytest

from flowtop.monitor.accounting import rank_flops, rank_mfu
from flowtop.monitor.wiring import make_model
from probe.wire import RankKey, decode, encode, flops_report

T = 1e12
PLAIN = {"step": 2, "model_flops": 1e9, "executed_flops": 1.2e9, "attention": "full", "dtype": "bf16",
         "peak_flops": 1 * T, "peak_source": "test", "uncounted": {}, "tokens": 256}
MIXED = {**PLAIN, "model_flops": 14_336, "executed_flops": 14_336,
         "flops_by_dtype": {"bf16": [8_192, 8_192], "fp32": [6_144, 6_144]},
         "peak_by_dtype": {"bf16": 2 * T, "fp32": 0.5 * T}}

CASES: list[tuple[str, dict[str, Any], dict[str, Any], float | None]] = [
    # 1e9 FLOPs per 256 tokens x 5,120 tokens/s = 2e10 FLOP/s of a 1e12 peak
    ("tokens/s", PLAIN, {"step_time_s": 0.05, "tokens_per_s": 5_120.0}, 0.02),
    # no tokens/s: 1e9 per 0.05 s step = 2e10 FLOP/s
    ("step time", PLAIN, {"step_time_s": 0.05}, 0.02),
    # a stalled rank runs at 0 %, whatever else is known
    ("stalled", PLAIN, {"step_time_s": 0.05, "tokens_per_s": 5_120.0, "stalled": 12.0}, 0.0),
    # the override replaces the peak: 2e10 / 4e12
    ("override", PLAIN, {"step_time_s": 0.05, "peak_override": 4 * T}, 0.005),
    # each dtype against its own peak: (8,192 / 2e12 + 6,144 / 0.5e12) s over 1 µs
    ("mix", MIXED, {"step_time_s": 1e-6}, 0.016384),
    ("no peak", {**PLAIN, "peak_flops": None}, {"step_time_s": 0.05}, None),
    ("no step time", PLAIN, {}, None),
]


@pytest.mark.parametrize("name, msg, kw, want", CASES, ids=[c[0] for c in CASES])
def test_rank_mfu_is_the_views_mfu(name: str, msg: dict[str, Any], kw: dict[str, Any], want: float | None) -> None:
    args = {"step_time_s": None, **kw}
    stalled = args.pop("stalled", None)  # the view holds since when, the sample takes how long
    count = flops_report(msg)
    view = rank_flops(count, **args, stalled_since=None if stalled is None else 100.0 - stalled)
    assert view is not None
    got = rank_mfu(count, **args, stalled_s=stalled)
    if want is None:
        assert got is None and view.mfu is None
    else:
        assert got == pytest.approx(want, rel=1e-12) and view.mfu == pytest.approx(want, rel=1e-12)
    assert rank_mfu(None, 0.05) is None


def test_the_mfu_sparkline_sample_equals_the_ranks_view() -> None:
    model = make_model()
    key = RankKey("j", "h", 1, 0, 0)
    seq = iter(range(1000))

    def send(kind: str, now: float, **fields: Any) -> None:
        model.ingest(decode(encode(kind, key, next(seq), 1.0, fields)), now)

    send("hello", 0.0, local_rank=0, world_size=1, device="cpu (test)", probe_version="t")
    send("flops", 0.0, **PLAIN)
    for step in range(1, 21):
        send("step", step * 0.05, step=step, wall_s=0.05, tokens=256, drops=0)
    send("telemetry", 1.0, gpu={}, proc={"cpu_pct": 50.0})
    view = model.tick(1.0).jobs[0].ranks[0]
    # 1e9 / 256 x (256 / 0.05 s) = 2e10 FLOP/s of 1e12: 2 %
    assert view.flops is not None and view.flops.mfu == pytest.approx(0.02)
    assert list(view.history.mfu) == pytest.approx([0.02])


def test_a_jobs_figures_sum_its_ranks_and_unknown_on_one_rank_is_unknown() -> None:
    """Three ranks at 1e9 FLOPs a 0.05 s step: 2e10 FLOP/s each, 6e10 in all, of 3e12 peak:
    2 %; uncounted operators summed by name across the ranks; one rank without a peak: no MFU."""
    from flowtop.monitor.accounting import job_flops

    a = {**PLAIN, "uncounted": {"aten::foo": 3, "aten::bar": 1}, "uncounted_size": {"aten::foo": 10}}
    b = {**PLAIN, "uncounted": {"aten::foo": 2, "aten::baz": 5}}
    views = [rank_flops(flops_report(m), step_time_s=0.05) for m in (a, a, b)]
    job = job_flops(views)
    assert job is not None and job.flops_per_s == pytest.approx(6e10) and job.peak_flops == pytest.approx(3 * T)
    assert job.mfu == pytest.approx(0.02)
    assert dict(job.uncounted_ops) == {"aten::foo": 8, "aten::bar": 2, "aten::baz": 5}
    assert dict(job.uncounted_size) == {"aten::foo": 20}
    no_peak = job_flops(views + [rank_flops(flops_report({**PLAIN, "peak_flops": None}), step_time_s=0.05)])
    assert no_peak is not None and no_peak.peak_flops is None and no_peak.mfu is None
    assert no_peak.flops_per_s == pytest.approx(8e10)


def test_a_jobs_labels_say_its_figures_are_sums() -> None:
    """The job's figures are sums over its ranks, but its labels were rank 0's: "local FLOPs of
    this rank" and "this rank's tensor-parallel share" beside Σ-over-ranks figures, and a
    pipeline job with no estimate (stage 1 has none) kept stage 0's estimate source (a new
    user's trial)."""
    from flowtop.monitor.accounting import job_flops

    tp = {**PLAIN, "estimated_flops": 1.1e9,
          "estimate_source": "6N+12LdT/2 (this rank's tensor-parallel share; N local), shape from model.blocks",
          "parallel": "local FLOPs of this rank; mesh (tp=2); matmuls split 2-way; params [S(0)]×8"}
    job = job_flops([rank_flops(flops_report(tp), step_time_s=0.05)] * 2)
    assert job is not None and job.estimated_flops_per_step == pytest.approx(2.2e9)
    assert job.estimate_source == "6N+12LdT/2 (each rank's tensor-parallel share; N local), shape from model.blocks"
    assert job.parallel == "Σ over the ranks of their local FLOPs; mesh (tp=2); matmuls split 2-way; params [S(0)]×8"
    stage1 = {**PLAIN, "estimated_flops": None, "estimate_source": None}
    piped = job_flops([rank_flops(flops_report(m), step_time_s=0.05) for m in (tp, stage1)])
    assert piped is not None and piped.estimated_flops_per_step is None and piped.estimate_source is None
    # every rank without an estimate for the same reason: the job says it (it said nothing, while
    # each rank's panel read "none: …"; a new user's trial with a ViT and a DiT)
    why = {**PLAIN, "estimated_flops": None, "estimate_source": "none: no tokens counted (no nn.Embedding fed token ids)"}
    same = job_flops([rank_flops(flops_report(why), step_time_s=0.05)] * 2)
    assert same is not None and same.estimate_source == why["estimate_source"]
    mixed = job_flops([rank_flops(flops_report(m), step_time_s=0.05) for m in (why, stage1)])
    assert mixed is not None and mixed.estimate_source is None


def test_the_snapshot_text_says_the_jobs_peak_is_the_ranks_summed() -> None:
    """The job line said 'peak estimated: 1 core × ...' (a rank's source) beside the job's MFU,
    whose peak is the sum over its ranks."""
    import dataclasses

    from flowtop.export.textreport import render
    from flowtop.monitor.accounting import job_flops
    from flowtop.monitor.snapshot import MonitorSnapshot
    from synthetic.cluster import cluster_job

    job = cluster_job(2, job="small")
    source = "estimated: 1 core × 2.4 GHz × 32 FLOP/cycle (AVX-512 FMA)"
    ranks = tuple(dataclasses.replace(r, flops=dataclasses.replace(r.flops, peak_flops=78e9, peak_source=source))
                  for r in job.ranks if r.flops is not None)
    job = dataclasses.replace(job, ranks=ranks, flops=job_flops([r.flops for r in ranks]))
    snap = MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", jobs=(job,), received=0, rejected=0)
    line = render(snap).splitlines()[1]
    assert line.endswith(f"[bf16, attention full, peak 2 × 78.0GFLOP/s (per rank: {source})]"), line
    uneven = (ranks[0], dataclasses.replace(ranks[1], flops=dataclasses.replace(ranks[1].flops, peak_flops=39e9)))
    job = dataclasses.replace(job, ranks=uneven, flops=job_flops([r.flops for r in uneven]))
    line = render(dataclasses.replace(snap, jobs=(job,))).splitlines()[1]
    assert line.endswith(f"peak 117GFLOP/s summed over the ranks (per rank: {source})]"), line


def test_the_snapshot_json_splits_the_jobs_peak_into_its_ranks() -> None:
    """A trial read the job's ``peak_source`` ("estimated: 1 core × ...", one rank's ~78 GFLOP/s)
    beside its ``peak_flops``, the sum over 6 ranks: the JSON says how the sum splits (schema 1.12)."""
    import dataclasses

    from flowtop.monitor.accounting import job_flops
    from flowtop.monitor.snapshot import MonitorSnapshot
    from flowtop.monitor.snapshot_json import json_schema, to_json
    from jsonschema import Draft202012Validator
    from synthetic.cluster import cluster_job

    job = cluster_job(6, job="small")
    source = "estimated: 1 core × 2.45 GHz × 32 FLOP/cycle (AVX-512 FMA)"
    ranks = tuple(dataclasses.replace(r, flops=dataclasses.replace(r.flops, peak_flops=78.25e9, peak_source=source))
                  for r in job.ranks if r.flops is not None)
    job = dataclasses.replace(job, ranks=ranks, flops=job_flops([r.flops for r in ranks]))
    snap = MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", jobs=(job,), received=0, rejected=0)
    data = to_json(snap)
    Draft202012Validator(json_schema()).validate(data)
    (j,) = data["jobs"]
    assert (j["peak_ranks"], j["peak_per_rank_flops"], j["peak_source"]) == (6, 78.25e9, source)
    assert j["peak_flops"] == pytest.approx(6 * 78.25e9)
    uneven = (dataclasses.replace(ranks[0], flops=dataclasses.replace(ranks[0].flops, peak_flops=39e9)), *ranks[1:])
    job = dataclasses.replace(job, ranks=uneven, flops=job_flops([r.flops for r in uneven]))
    (j,) = to_json(dataclasses.replace(snap, jobs=(job,)))["jobs"]
    assert (j["peak_ranks"], j["peak_per_rank_flops"]) == (None, None)
