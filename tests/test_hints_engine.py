"""The hint engine: ordering, state handling, table validation, docs in sync, the H200 fixture."""

from __future__ import annotations

import dataclasses
import math
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from flowtop.monitor.hints import RULES, RULES_BY_ID, Gate, HintEngine
from flowtop.monitor.hints.base import Measurement
from flowtop.monitor.hints.doc import rules_markdown
from flowtop.monitor.hints.engine import MEASURES
from flowtop.monitor.kernels.merge import CumulativeKernels, merge_cumulative
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from snapshot_schema import assert_valid_snapshot
from test_hints_factories import (
    b_comm,
    b_input_wait,
    b_throttle,
    b_uneven,
    flops,
    history,
    job,
    kwin,
    rank,
    small_hang_rules,
    telemetry,
)

FIXTURE = Path("/work/shared/fixtures/h200-gpt-small-step.trace.json.gz")
README_SECTION = Path(__file__).resolve().parent.parent / "README.md"


def ids(hints: tuple) -> list[tuple[str, str]]:
    return [(h.id, h.target) for h in hints]


def test_order_is_severity_then_impact() -> None:
    from test_hints_factories import GEMM_H, NCCL

    def snap(now: float) -> JobSnapshot:
        t0 = now - 1.05  # the last of 10 steps of 0.1 s arrived 50 ms ago
        stalled = rank(0, step=10, hist=history(10, 0.1, t0=t0 - 2.0))  # no step for 2 s: hang
        waiting = rank(1, hist=history(10, 0.1, wait_s=0.012, t0=t0, first=4))  # input wait 12 % (past step 3)
        comm = rank(2, hist=history(10, 0.1, t0=t0), kernels=kwin([(NCCL, 4, 2000.0), (GEMM_H, 10, 3000.0)]))
        full = rank(3, hist=history(10, 0.1, t0=t0), tel=telemetry(mem_used=95.0, mem_total=100.0))
        return job(stalled, waiting, comm, full)

    engine = HintEngine(small_hang_rules())
    engine.evaluate(snap(0.0), 0.0)
    hints = engine.evaluate(snap(6.0), 6.0)
    assert ids(hints) == [
        ("hang_rank", "rank 0"),  # critical, impact 1
        ("comm_exposed", "rank 2"),  # warning, impact 0.20
        ("input_wait", "rank 1"),  # warning, impact 0.12
        ("memory_full", "rank 3"),  # info
    ]
    assert [h.severity for h in hints] == ["critical", "warning", "warning", "info"]


def test_missing_data_holds_an_active_hint() -> None:
    engine = HintEngine()
    engine.evaluate(b_throttle(80.0, 0.0), 0.0)
    first = engine.evaluate(b_throttle(80.0, 0.0), 6.0)
    blind = job(rank(0))  # telemetry not there this time
    held = engine.evaluate(blind, 7.0)
    assert [h for h in held if h.id == "throttling"] == [h for h in first if h.id == "throttling"]


def test_vanished_target_starts_over() -> None:
    engine = HintEngine()
    engine.evaluate(b_throttle(80.0, 0.0), 0.0)
    assert ("throttling", "rank 0") in ids(engine.evaluate(b_throttle(80.0, 0.0), 6.0))
    other = job(rank(1, tel=telemetry(sm_clock_mhz=1990.0, sm_clock_max_mhz=2000.0)))
    assert engine.evaluate(other, 7.0) == ()  # rank 0 gone: its state is dropped
    assert ("throttling", "rank 0") not in ids(engine.evaluate(b_throttle(80.0, 0.0), 8.0))
    assert ("throttling", "rank 0") in ids(engine.evaluate(b_throttle(80.0, 0.0), 13.0))


def test_jobs_keep_separate_state() -> None:
    engine = HintEngine()
    a = b_throttle(80.0, 0.0)
    b = dataclasses.replace(a, job="job2")
    engine.evaluate(a, 0.0)
    engine.evaluate(b, 4.0)
    assert ids(engine.evaluate(a, 5.0)) == [("throttling", "rank 0")]
    assert engine.evaluate(b, 5.0) == ()  # job2 crossed 1 s ago
    engine.reset()
    assert engine.evaluate(a, 6.0) == ()


def test_a_failing_measure_is_logged_once_and_its_hints_held(caplog: pytest.LogCaptureFixture) -> None:
    rule = RULES_BY_ID["input_wait"]
    calls = {"n": 0}

    def flaky(r, j, now):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("boom")
        return {"rank 0": Measurement(9.0, {"input_wait_pct": 9.0, "device_idle_pct": 50.0}, 0.09, 100,
                                      steps_covered=10)}

    engine = HintEngine(rules=(rule, RULES_BY_ID["comm_exposed"]),
                        measures={"input_wait": flaky, "comm_exposed": MEASURES["comm_exposed"]})
    snap = b_comm(20.0, 0.0)
    assert ids(engine.evaluate(snap, 0.0)) == [("comm_exposed", "rank 0"), ("input_wait", "rank 0")]
    with caplog.at_level(logging.ERROR, logger="flowtop.hints"):
        assert ids(engine.evaluate(snap, 1.0)) == [("comm_exposed", "rank 0"), ("input_wait", "rank 0")]
        engine.evaluate(snap, 2.0)
    assert sum("input_wait failed" in r.getMessage() for r in caplog.records) == 1


def test_a_phase_measures_its_share_of_the_rules_and_holds_the_others() -> None:
    """evaluate(..., phase=(k, n)): the rules at table index k mod n are measured, the others'
    hints stay as they were (a large job's rules take turns over n ticks)."""
    rules = (RULES_BY_ID["input_wait"], RULES_BY_ID["comm_exposed"])  # index 0 and 1
    value = {"input_wait": 9.0}
    calls: list[str] = []

    def wait(r, j, now):  # type: ignore[no-untyped-def]
        calls.append("input_wait")
        v = value["input_wait"]
        return {"rank 0": Measurement(v, {"input_wait_pct": v, "device_idle_pct": 50.0}, v / 100, 100,
                                      steps_covered=10)}

    def comm(r, j, now):  # type: ignore[no-untyped-def]
        calls.append("comm_exposed")
        return MEASURES["comm_exposed"](r, j, now)

    engine = HintEngine(rules=rules, measures={"input_wait": wait, "comm_exposed": comm})
    snap = b_comm(20.0, 0.0)
    assert ids(engine.evaluate(snap, 0.0)) == [("comm_exposed", "rank 0"), ("input_wait", "rank 0")]
    assert calls == ["input_wait", "comm_exposed"]
    value["input_wait"] = 0.0  # cleared as soon as it is measured again
    calls.clear()
    held = engine.evaluate(snap, 1.0, phase=(7, 2))  # 7 mod 2: index 1 only
    assert calls == ["comm_exposed"]
    assert ids(held) == [("comm_exposed", "rank 0"), ("input_wait", "rank 0")]  # input wait held
    assert [h.evidence["input_wait_pct"] for h in held if h.id == "input_wait"] == [9.0]
    calls.clear()
    cleared = engine.evaluate(snap, 12.0, phase=(8, 2))  # its turn: cleared (12 s: past HOLD_S)
    assert ids(cleared) == [("comm_exposed", "rank 0")]
    assert calls == ["input_wait"]


@pytest.mark.parametrize("relative", [True, False])
def test_a_relative_rules_held_hint_goes_once_another_target_is_named(relative: bool) -> None:
    """The straggler rule compares ranks with one another (params["relative"]): a hint shown only
    by the hold (HOLD_S), its rank measured back past the clear value, stays while no other rank is
    named and goes at the evaluation that shows another rank's hint from its measure; hints
    measured beyond the clear value (between clear and threshold too) stay side by side. A rule
    that is not relative keeps the hold."""
    rule = RULES_BY_ID["straggler"]
    if not relative:
        rule = dataclasses.replace(rule, params={k: v for k, v in rule.params.items() if k != "relative"})
    pct = {"rank 0": 25.0, "rank 1": 0.0, "rank 2": 0.0}

    def slower(r, j, now):  # type: ignore[no-untyped-def]
        return {t: Measurement(v, {"slower_pct": v}, v / 100, 100, steps_covered=20) for t, v in pct.items()}

    engine = HintEngine(rules=(rule,), measures={"straggler": slower})
    snap = job(rank(0), rank(1), rank(2))

    def targets(now: float, **update: float) -> list[int]:
        pct.update({f"rank {r[1:]}": v for r, v in update.items()})
        return sorted(int(h.target.split()[1]) for h in engine.evaluate(snap, now))

    assert targets(0.0) == [0]
    assert targets(1.0, r0=0.0) == [0]  # back past the 5 % clear: held, no other rank named
    assert targets(2.0, r2=7.0) == [0]  # 7 %: not past the 10 % threshold, nothing named
    assert targets(3.0, r1=25.0) == ([1] if relative else [0, 1])
    assert targets(4.0, r1=7.0, r2=25.0) == ([1, 2] if relative else [0, 1, 2])  # rank 1 still 7 % behind
    assert targets(5.0, r0=25.0) == [0, 1, 2]  # rank 0 named again as at first
    assert targets(6.0, r0=0.0, r1=0.0, r2=0.0) == [0, 1, 2]  # none named now: all held (HOLD_S) ...
    assert targets(14.5) == [0, 1, 2] and targets(15.0) == []  # ... until HOLD_S after they last held (5 s)


def test_two_stragglers_named_since_the_same_time_keep_their_hold() -> None:
    """Ranks 0 and 3 both behind since the first evaluation: rank 3 dipping past the 5 % clear
    value for one evaluation is held (HOLD_S) while rank 0 stays named, as for any rule: rank 0's
    hint is no newer than rank 3's, so it says nothing against it (a review: rank 3's hint went at
    the dip and came back with a new "since", and flowtop_job_hints flickered 2 -> 1 -> 2)."""
    pct = {"rank 0": 25.0, "rank 1": 0.0, "rank 2": 0.0, "rank 3": 12.0}
    step = [100]

    def slower(r, j, now):  # type: ignore[no-untyped-def]
        return {t: Measurement(v, {"slower_pct": v}, v / 100, step[0], steps_covered=20) for t, v in pct.items()}

    engine = HintEngine(rules=(RULES_BY_ID["straggler"],), measures={"straggler": slower})
    snap = job(rank(0), rank(1), rank(2), rank(3))

    def shown(now: float, **update: float) -> dict[str, int | None]:
        pct.update({f"rank {r[1:]}": v for r, v in update.items()})
        step[0] += 5
        return {h.target: h.first_step for h in engine.evaluate(snap, now)}

    assert shown(0.0) == {"rank 0": 86, "rank 3": 86}  # at step 105, covering 20: steps 86-105
    assert shown(1.0, r3=4.0) == {"rank 0": 86, "rank 3": 86}  # held through the dip
    assert shown(2.0, r3=8.0) == {"rank 0": 86, "rank 3": 86}  # 8 %: past the clear value again


def test_a_hidden_rule_is_measured_with_the_rule_that_hides_it() -> None:
    """hang_rank (index 1) is hidden by hang_all (index 0): in shares, both are measured in
    hang_all's, or a hung job would show every rank's hang_rank until the other share came."""
    from test_hints_factories import b_hang_all

    engine = HintEngine()
    shown = [ids(engine.evaluate(b_hang_all(100.0, now), now, phase=(k, 2)))
             for k, now in enumerate((1000.0, 1000.5, 1001.0, 1001.5, 1002.0))]
    assert all(h != "hang_rank" for hints in shown for h, _ in hints)
    assert ("hang_all", "") in shown[-1]
    assert ids(HintEngine().evaluate(b_hang_all(100.0, 1000.0), 1000.0, phase=(1, 2))) == []


@pytest.mark.parametrize("values", [[1.0], [1.0, 2.0], [3.0, 1.0, 2.0], [1.0, 1.0, 2.0, 5.0], [4.0, 4.0, 4.0, 1.0, 9.0]])
def test_median_of_the_other_ranks(values: list[float]) -> None:
    import statistics

    from flowtop.monitor.hints.measures_straggler import _median_without

    ordered = sorted(values)
    for i, v in enumerate(values):
        others = values[:i] + values[i + 1:]
        assert _median_without(ordered, v) == (statistics.median(others) if others else 0.0)


def test_identity_memo_forgets_dead_objects() -> None:
    import gc

    from flowtop.monitor.hints.base import IdentityMemo

    calls: list[int] = []
    memo = IdentityMemo(lambda h: calls.append(1) or len(h.steps))
    h = history(7)
    assert (memo(h), memo(h), len(calls), len(memo)) == (7, 7, 1, 1)
    assert memo(history(7)) == 7 and len(calls) == 2  # an equal but different object is computed
    del h
    gc.collect()
    assert len(memo) == 0  # no entry keeps an old snapshot record alive


def test_identity_memo_of_two_objects_needs_both_the_same() -> None:
    from flowtop.monitor.hints.base import IdentityMemo

    memo = IdentityMemo(lambda a, b: len(a.steps) + len(b.steps))
    a, b = history(3), history(4)
    assert memo(a, b) == 7 and memo(a, b) == 7 and len(memo) == 1
    assert memo(a, history(5)) == 8 and len(memo) == 2


@pytest.mark.parametrize(("value", "expected"), [
    (1.0, True), (-0.0, True), (5e-324, True), (1.7e308, True), (7, True), (10**400, True),
    (math.inf, False), (-math.inf, False), (math.nan, False), (True, False), (None, False), ("1", False),
])
def test_finite_means_a_real_finite_number(value: object, expected: bool) -> None:
    from flowtop.monitor.hints.base import finite

    assert finite(value) is expected


def test_table_validation() -> None:
    base = RULES_BY_ID["input_wait"]
    with pytest.raises(ValueError, match="clear must be <="):
        HintEngine((dataclasses.replace(base, clear=6.0),))
    with pytest.raises(ValueError, match="clear must be >="):
        HintEngine((dataclasses.replace(RULES_BY_ID["launch_bound"], clear=40.0),))
    with pytest.raises(ValueError, match="duplicate"):
        HintEngine((base, base))
    with pytest.raises(ValueError, match="gate overlap_pct"):
        HintEngine((dataclasses.replace(RULES_BY_ID["comm_exposed"], gates=(Gate("overlap_pct", "<", 50.0, 40.0),)),))
    with pytest.raises(ValueError, match="no measure"):
        HintEngine((dataclasses.replace(base, id="made_up"),))


def test_thresholds_are_tunable_through_the_table() -> None:
    stricter = tuple(dataclasses.replace(r, threshold=10.0, clear=8.0) if r.id == "input_wait" else r for r in RULES)
    assert [h for h in HintEngine(stricter).evaluate(b_input_wait(9.0, 0.0), 0.0) if h.id == "input_wait"] == []
    assert [h for h in HintEngine().evaluate(b_input_wait(9.0, 0.0), 0.0) if h.id == "input_wait"]


def test_kernel_scope_hint() -> None:
    (hint,) = [h for h in HintEngine().evaluate(b_uneven(30.0, 0.0), 0.0) if h.id == "uneven_kernel"]
    assert hint.scope == "kernel" and hint.severity == "info"
    assert hint.evidence["step_share_pct"] == pytest.approx(100 * (1000 * 0.3 / 0.85) / 10_000)


def test_hints_survive_the_json_snapshot() -> None:
    snap = b_throttle(80.0, 0.0)
    engine = HintEngine()
    engine.evaluate(snap, 0.0)
    hints = engine.evaluate(snap, 6.0)
    doc = to_json(MonitorSnapshot(6.0, "tcp://127.0.0.1:5555", (dataclasses.replace(snap, hints=hints),), 1, 0))
    back = json.loads(json.dumps(doc, allow_nan=False))
    assert_valid_snapshot(back)
    (h,) = back["jobs"][0]["hints"]
    assert h["id"] == "throttling" and h["evidence"]["reasons"] == ["sw_power_cap"]
    assert h["evidence"]["clock_pct"] == pytest.approx(80.0)


def test_readme_section_holds_the_generated_table() -> None:
    assert rules_markdown() in README_SECTION.read_text(encoding="utf-8")


def test_hints_import_neither_torch_nor_textual() -> None:
    code = ("import sys, flowtop.monitor.hints; bad = [m for m in ('torch', 'textual') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == ""


@pytest.mark.skipif(not FIXTURE.exists(), reason="H200 fixture not present")
def test_h200_fixture_is_launch_bound() -> None:
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.chrome import load_trace

    stats = aggregate(load_trace(FIXTURE))
    snap: JobSnapshot = job(rank(0, kernels=stats, fl=flops(mfu=0.02)))
    hints = {h.id: h for h in HintEngine().evaluate(snap, 0.0)}
    launch = hints["launch_bound"]
    busy_pct = 100.0 * stats.anatomy.busy_frac
    assert launch.evidence["busy_pct"] == pytest.approx(busy_pct)
    assert busy_pct == pytest.approx(100 * 890.8105 / 12995.2959, rel=1e-6)  # 6.9 % of the trace's span
    assert launch.evidence["launches_per_step"] == 208
    assert launch.evidence["short_kernel_pct"] == pytest.approx(100 * 189 / 208)
    assert launch.severity == "critical"
    assert launch.summary == ("rank 0 GPU is busy only 7 % of the step; 91 % of its 208 kernels per step "
                              "run shorter than a launch takes")
    # cuDNN flash attention and a fused AdamW ran: neither "unfused" hint may fire.
    assert "attention_unfused" not in hints and "optimizer_unfused" not in hints
    assert "fp32_matmul" not in hints
    assert hints["attention_flops_note"].evidence["attention_pct"] == pytest.approx(100 * 87.7148 / 890.8105, rel=1e-4)


# --- overrides -------------------------------------------------------------------------------------

def test_overrides_by_group_rule_field_and_param() -> None:
    engine = HintEngine(overrides={"hang": {"floor_s": 0.5}, "input_wait": {"threshold": 7.0, "clear": 6.0}})
    by_id = {r.id: r for r in engine.rules}
    assert by_id["hang_all"].params == {"factor": 10.0, "floor_s": 0.5}
    assert by_id["hang_rank"].params == {"factor": 10.0, "floor_s": 0.5, "hidden_by": "hang_all"}
    assert (by_id["input_wait"].threshold, by_id["input_wait"].clear) == (7.0, 6.0)
    assert by_id["straggler"] is RULES_BY_ID["straggler"]  # untouched rows are the table's own
    assert RULES_BY_ID["hang_all"].params["floor_s"] == 30.0  # the table itself is not changed
    assert [r.id for r in engine.rules] == [r.id for r in RULES]
    assert HintEngine(overrides={"hang": {"floor_s": 0.5}}).rules == small_hang_rules()  # = a hand-made copy
    # A rule's own key wins over its group's, whatever the order.
    for order in ({"hang_rank": {"floor_s": 1.0}, "hang": {"floor_s": 4.0}},
                  {"hang": {"floor_s": 4.0}, "hang_rank": {"floor_s": 1.0}}):
        assert [r.params.get("floor_s") for r in HintEngine(overrides=order).rules[:2]] == [4.0, 1.0]
    assert find_hang(HintEngine(overrides={"hang_rank": {"floor_s": 2.0}}), 2.5) == 2.0
    assert find_hang(HintEngine(overrides={"hang_rank": {"floor_s": 2.0}}), 1.5) is None


def find_hang(engine: HintEngine, stalled_s: float) -> float | None:
    """limit_s of rank 1's hang hint after ``stalled_s`` without a step (None: no hint)."""
    from test_hints_factories import b_hang_rank

    hits = [h for h in engine.evaluate(b_hang_rank(stalled_s, 0.0), 0.0) if h.id == "hang_rank"]
    return hits[0].evidence["limit_s"] if hits else None


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hangs": {"floor_s": 1.0}}, "unknown rule or group 'hangs'"),
        ({"hang_all": {"floor": 1.0}}, "hang_all: no field or parameter ['floor']"),
        ({"input_wait": {"clear": 9.0}}, "input_wait: clear must be <= threshold"),
    ],
)
def test_bad_overrides_raise(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        HintEngine(overrides=overrides)


def test_hang_floor_from_the_environment(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from flowtop.monitor.wiring import hint_overrides_from_env, make_model

    assert hint_overrides_from_env({}) == {}
    assert hint_overrides_from_env({"FLOWTOP_HANG_S": " 5 "}) == {"hang": {"floor_s": 5.0}}
    with caplog.at_level(logging.WARNING, logger="flowtop.wiring"):
        for bad in ("soon", "0", "-3", "nan", "inf"):
            assert hint_overrides_from_env({"FLOWTOP_HANG_S": bad}) == {}
    assert caplog.text.count("ignoring FLOWTOP_HANG_S") == 5
    monkeypatch.setenv("FLOWTOP_HANG_S", "5")
    # The model's engine gets the environment's floor; explicit overrides win per key.
    engine = make_model()._hint_engine
    assert {r.id: r.params.get("floor_s") for r in engine.rules if r.id.startswith("hang")} == {
        "hang_all": 5.0, "hang_rank": 5.0}
    engine = make_model(hint_overrides={"hang_rank": {"floor_s": 1.0}, "hang": {"factor": 3.0}})._hint_engine
    rules = {r.id: r for r in engine.rules}
    assert rules["hang_all"].params["floor_s"] == 5.0 and rules["hang_rank"].params["floor_s"] == 1.0
    assert rules["hang_all"].params["factor"] == 3.0 and rules["hang_rank"].params["factor"] == 3.0


def test_uneven_kernel_waits_for_several_windows_per_rank() -> None:
    snap = b_uneven(30.0, 0.0)
    few = dataclasses.replace(snap, kernels_merged=dataclasses.replace(snap.kernels_merged, min_windows=2))
    assert not [h for h in HintEngine().evaluate(few, 0.0) if h.id == "uneven_kernel"]
    assert [h for h in HintEngine().evaluate(snap, 0.0) if h.id == "uneven_kernel"]


def _cumulative(per_window_us: Sequence[float], device: str = "cpu") -> CumulativeKernels:
    """A rank's table over windows whose one operator took ``per_window_us`` of a 10 ms step."""
    table = CumulativeKernels()
    for us in per_window_us:
        table.add(kwin([("aten::addmm", 10, us)], device=device))
    return table


def test_uneven_kernel_needs_a_difference_above_the_ranks_window_scatter() -> None:
    """Identical CPU ranks: one window of rank 0 preempted (3,000 µs instead of 1,000). Mean windows
    1,666.7 vs 1,000 µs: spread 50 %, 6.7 % of the step, which fired before. Rank 0's sample variance
    ((666.7² · 2 + 1,333.3²) / 2 = 1,333,333 µs²) over 3 windows gives its mean a standard error of
    √444,444 = 666.7 µs, rank 1's is 0: the difference (666.7 µs) is 1 standard error, noise_pct 100
    (the gate wants < 25: 4 standard errors). A genuinely slower rank: 1,500/1,480/1,520 µs against
    1,000/1,010/990: difference 500 µs, standard errors² 400/3 and 100/3 µs², so √166.7 = 12.9 µs:
    noise_pct 2.6 -> it fires (spread 40 %, 5 % of the step)."""
    def hints(a: Sequence[float], b: Sequence[float]) -> list[Any]:
        merged = merge_cumulative({0: _cumulative(a), 1: _cumulative(b)})
        snap = job(rank(0, device="cpu"), rank(1, device="cpu"), merged=merged)
        return [h for h in HintEngine().evaluate(snap, 0.0) if h.id == "uneven_kernel"]

    merged = merge_cumulative({0: _cumulative([1000.0, 1000.0, 3000.0]), 1: _cumulative([1000.0] * 3)})
    (k,) = merged.kernels
    assert k.spread == pytest.approx(0.5) and k.noise_us == pytest.approx(666.67, rel=1e-4)
    assert not k.flagged and not hints([1000.0, 1000.0, 3000.0], [1000.0] * 3)
    (h,) = hints([1000.0, 1010.0, 990.0], [1500.0, 1480.0, 1520.0])
    assert h.evidence["noise_pct"] == pytest.approx(100 * (500 / 3) ** 0.5 / 500, rel=1e-6)
    assert (h.evidence["slowest_rank"], h.evidence["spread_pct"]) == (1, pytest.approx(40.0))


def test_kernel_hints_use_the_unprofiled_step() -> None:
    # The H200 fixture: busy 890.8 µs of a 12,995 µs profiled span (6.9 %); the real step was
    # 6.8 ms (docs/design.md, "The H200 reference step"), so the device was busy 13.1 % of it — the
    # figure the hint must use.
    from pathlib import Path

    from flowtop.monitor.hints.facts import kernel_facts
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.chrome import load_trace

    window = load_trace(Path(__file__).parent / "data" / "h200-gpt-small-step.trace.json.gz")
    profiled = kernel_facts(aggregate(window))
    real = kernel_facts(aggregate(dataclasses.replace(window, typical_step_us=6800.0)))
    assert profiled.step_us == pytest.approx(window.step_dur_us)
    assert real.step_us == 6800.0
    assert 100 * real.busy_us / real.step_us == pytest.approx(13.1, abs=0.05)


def test_a_flickering_reason_does_not_make_the_hint_blink() -> None:
    from test_hints_factories import job, rank, telemetry

    def snap(reasons: list[str]):  # type: ignore[no-untyped-def]
        return job(rank(0, tel=telemetry(sm_clock_mhz=1600.0, sm_clock_max_mhz=2000.0, throttle=reasons,
                                         temp_c=84.0, power_w=700.0, power_limit_w=700.0)))  # fmt: skip

    engine = HintEngine()
    shown = [t for t in range(0, 8) if any(h.id == "throttling" for h in engine.evaluate(snap(["sw_power_cap"]), t))]
    assert shown  # fired once its window was covered
    # The power-cap reason comes and goes each second: the hint stays up ...
    for t in range(8, 16):
        reasons = ["sw_power_cap"] if t % 2 else []
        assert any(h.id == "throttling" for h in engine.evaluate(snap(reasons), float(t)))
    # ... and clears once the reason has been gone for longer than the hold time.
    assert not any(h.id == "throttling" for h in engine.evaluate(snap([]), 15.0 + 10.5))


def test_forget_drops_one_jobs_state() -> None:
    engine = HintEngine()
    a = b_throttle(80.0, 0.0)
    b = dataclasses.replace(a, job="job2")
    engine.evaluate(a, 0.0)
    engine.evaluate(b, 0.0)
    engine.forget("job1")
    # job1 starts its 5 s evidence window again; job2 keeps its own
    assert ids(engine.evaluate(a, 5.0)) == [] and ids(engine.evaluate(b, 5.0)) == [("throttling", "rank 0")]


def test_a_window_measure_is_computed_once_per_window_and_follows_the_step() -> None:
    """The window-only measures (memory, launch, comm) are memoized by window: the same window a
    round later gives the same figures at the rank's new step; a new window is measured again."""
    from flowtop.monitor.hints import measures_kernels as mk
    from test_hints_factories import ADD, GEMM_H, job, kwin, rank

    rule = RULES_BY_ID["memory_bound"]
    calls: list[int] = []
    real = mk._memory
    window = kwin([(ADD, 50, 510.0), (GEMM_H, 10, 490.0)])
    mk._memory_of = mk._per_window(lambda ru, f: calls.append(1) or real(ru, f))
    try:
        first = mk.memory_bound(rule, job(rank(0, step=100, kernels=window)), 0.0)["rank 0"]
        later = mk.memory_bound(rule, job(rank(0, step=140, kernels=window)), 0.0)["rank 0"]
        other = mk.memory_bound(rule, job(rank(0, step=150, kernels=kwin([(ADD, 5, 10.0), (GEMM_H, 10, 990.0)]))),
                                0.0)["rank 0"]
    finally:
        mk._memory_of = mk._per_window(mk._memory)
    assert first is not None and later is not None and other is not None
    assert (first.step, later.step, other.step) == (100, 140, 150)
    assert first.value == later.value == pytest.approx(51.0) and other.value == pytest.approx(1.0)
    assert len(calls) == 2


def test_hints_of_many_ranks_share_their_evidence_keys() -> None:
    """A rule that holds for every rank of a large job keeps a hint a rank: the keys of each
    hint's evidence are the same strings for all of them (its threshold and clear value's were
    two new strings a hint, ~120 bytes), and the hint reads as before."""
    from flowtop.monitor.hints.making import make_hint

    rule = RULES_BY_ID["launch_bound"]
    m = Measurement(value=90.0, evidence={"busy_pct": 10.0, "short_kernel_pct": 90.0}, impact=0.9, step=5)
    a, b = (make_hint(rule, f"rank {r}", m, 5, 5, 1, 0.0) for r in (3, 4))
    # its measure (busy_pct) is its value, 90; the rule's limits 50 and 60 (rules_kernels)
    assert a.evidence == {"busy_pct": 90.0, "short_kernel_pct": 90.0, "threshold_pct": 50.0, "clear_pct": 60.0,
                          "window_steps": 1, "since_step": 5}
    assert all(ka is kb for ka, kb in zip(a.evidence, b.evidence))
    assert a.action is b.action and a.target == "rank 3" and b.target == "rank 4"
