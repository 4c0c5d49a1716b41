"""Each hint rule just above / just below its threshold, with hysteresis, and rule specifics."""

from __future__ import annotations

import dataclasses
import math

import pytest
from typing import Any

from flowtop.monitor.hints import RULES, RULES_BY_ID, HintEngine
from flowtop.monitor.hints.engine import CLAIMANT_RULES, HOLD_S, MEASURES
from flowtop.monitor.relayviews import RelayCut
from flowtop.monitor.snapshot import Hint, JobSnapshot, MonitorSnapshot
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from test_hints_factories import (
    CASES,
    FLASH,
    VARIANT_CASES,
    FUSED_ADAM,
    GEMM_H,
    LOG_SOFTMAX,
    SOFTMAX,
    Case,
    b_attention,
    b_comm,
    b_hang_all,
    b_hang_rank,
    b_input_wait,
    b_launch,
    b_throttle,
    b_uncounted,
    b_util,
    flops,
    history,
    job,
    kwin,
    rank,
    small_hang_rules,
    telemetry,
)


def settle(engine: HintEngine, snap: JobSnapshot, t: float) -> tuple[Hint, ...]:
    """Evaluate twice, 30 s apart, so that time windows (≤ 10 s) are satisfied; the hints as a
    snapshot taken then shows them."""
    engine.evaluate(snap, t)
    return shown(engine.evaluate(snap, t + 30.0), t + 30.0)


def shown(hints: tuple[Hint, ...], now: float) -> tuple[Hint, ...]:
    """``hints`` as a snapshot taken at ``now`` shows them (a hang's seconds as of then: Hint.frozen)."""
    return tuple(h.frozen(now) for h in hints)


def find(hints: tuple[Hint, ...], rule: str) -> Hint | None:
    hits = [h for h in hints if h.id == rule]
    assert len(hits) <= 1
    return hits[0] if hits else None


def at(case: Case, value: float, t: float, engine: HintEngine) -> Hint | None:
    """The case's hint after two evaluations 30 s apart, each with a snapshot built for its time."""
    engine.evaluate(case.build(value, t), t)
    return find(shown(engine.evaluate(case.build(value, t + 30.0), t + 30.0), t + 30.0), case.rule)


def test_every_rule_has_a_case() -> None:
    assert sorted(c.rule for c in CASES) == sorted(r.id for r in RULES)


@pytest.mark.parametrize("case", CASES + VARIANT_CASES, ids=lambda c: c.rule + "-" + c.build.__name__)
def test_fires_just_above_threshold(case: Case) -> None:
    hint = at(case, case.above, 0.0, case.engine())
    assert hint is not None
    rule = RULES_BY_ID[case.rule]
    assert (hint.scope, hint.target) == (rule.scope, case.target)
    assert hint.summary == case.summary
    for key, value in case.evidence.items():
        assert hint.evidence[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    assert hint.action and 0.0 <= hint.impact <= 1.0


@pytest.mark.parametrize("case", CASES + VARIANT_CASES, ids=lambda c: c.rule + "-" + c.build.__name__)
def test_quiet_below_threshold(case: Case) -> None:
    for value in (case.mid, case.low):
        if value is not None:
            assert at(case, value, 0.0, case.engine()) is None, value


@pytest.mark.parametrize("case", CASES + VARIANT_CASES, ids=lambda c: c.rule + "-" + c.build.__name__)
def test_hysteresis(case: Case) -> None:
    engine = case.engine()
    assert at(case, case.above, 0.0, engine) is not None
    if case.mid is not None:  # between clear and threshold: stays, and its evidence says until when
        held = at(case, case.mid, 100.0, engine)
        assert held is not None
        rule = RULES_BY_ID[case.rule]
        assert held.evidence[f"clear_{rule.unit}"] == rule.clear
        assert held.evidence[f"threshold_{rule.unit}"] == rule.threshold
    assert at(case, case.low, 200.0, engine) is None  # past the clear value: gone
    if case.mid is not None:  # and it does not come back between clear and threshold
        assert at(case, case.mid, 300.0, engine) is None
    assert at(case, case.above, 400.0, engine) is not None


# --- windows ---------------------------------------------------------------------------------

def test_input_wait_needs_its_step_window() -> None:
    """With 4 steps of history the 10-step window fills only as the rank advances (from step 14:
    the run's first 3 steps are the loader's start, left out)."""
    engine = HintEngine()

    def snap(step: int) -> JobSnapshot:
        return job(rank(0, step=step, hist=history(4, 0.1, wait_s=0.02, first=step - 3)))

    assert find(engine.evaluate(snap(14), 0.0), "input_wait") is None
    assert find(engine.evaluate(snap(19), 1.0), "input_wait") is None  # evidence covers steps 11-19
    hint = find(engine.evaluate(snap(24), 2.0), "input_wait")  # and now steps 11-24
    assert hint is not None
    assert hint.evidence["input_wait_pct"] == pytest.approx(20.0)
    assert hint.evidence["window_steps"] == 4  # the measure's own window (history length)
    assert hint.evidence["since_step"] == 10  # first crossing at step 14 came with 4 steps of history


def test_input_wait_leaves_out_the_loaders_start() -> None:
    """The run's first 3 steps' wait is the loader starting (workers spawned, files opened): 2 s on
    step 1 of ten 0.1 s steps would read 2.0 / 3.0 = 67 % (critical); left out, steps 4-10 wait
    7 × 2 ms over 7 × 0.1 s = 2 %, under the 5 % threshold."""
    hist = history(10, 0.1, wait_s=0.002)
    hist = dataclasses.replace(hist, step_time_s=(2.1, *hist.step_time_s[1:]),
                               input_wait_s=(2.0, *hist.input_wait_s[1:]))
    measured = MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, step=10, hist=hist)), 0.0)["rank 0"]
    assert measured is not None and measured.evidence["input_wait_pct"] == pytest.approx(2.0)
    assert measured.steps_covered == 7
    early = history(3, 0.1, wait_s=0.05)  # steps 1-3 only: nothing measured yet
    assert MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, step=3, hist=early)), 0.0)["rank 0"] is None
    shown = dataclasses.replace(hist, steps=())  # a large job's history: no step column
    measured = MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, step=10, hist=shown)), 0.0)["rank 0"]
    assert measured is not None and measured.evidence["input_wait_pct"] == pytest.approx(2.0)


def test_input_wait_leaves_out_one_pause_between_steps() -> None:
    """A 25 s pause between two steps (a checkpoint save, an eval: the probe counts the time from a
    step's end to the next forward) is no loader's: steps 11-20 of 0.1 s wait 2 ms each, step 15
    25.1 s of which 25.0 waiting. Read whole: 25.018 / 26.0 = 96 % (critical, "raise num_workers");
    the pause left out: 9 × 2 ms / 9 × 0.1 s = 2 %, under the threshold. Two long waits, each half
    of the window's, are a loader's pattern (every fifth batch late): kept, 0.6 / 1.6 = 37.5 %."""
    hist = history(10, 0.1, wait_s=0.002, first=11)
    hist = dataclasses.replace(hist, step_time_s=(*hist.step_time_s[:4], 25.1, *hist.step_time_s[5:]),
                               input_wait_s=(*hist.input_wait_s[:4], 25.0, *hist.input_wait_s[5:]))
    measured = MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, step=20, hist=hist)), 0.0)["rank 0"]
    assert measured is not None and measured.evidence["input_wait_pct"] == pytest.approx(2.0)
    assert measured.evidence["pause_left_out_s"] == pytest.approx(25.0) and measured.steps_covered == 9
    assert measured.evidence["input_wait_s_per_step"] == pytest.approx(0.002)
    late = history(10, 0.1, wait_s=0.0, first=11)
    late = dataclasses.replace(late, step_time_s=tuple(0.4 if i in (2, 7) else 0.1 for i in range(10)),
                               input_wait_s=tuple(0.3 if i in (2, 7) else 0.0 for i in range(10)))
    measured = MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, step=20, hist=late)), 0.0)["rank 0"]
    assert measured is not None and measured.evidence["input_wait_pct"] == pytest.approx(37.5)
    assert measured.evidence["pause_left_out_s"] is None and measured.steps_covered == 10


def test_input_wait_leaves_out_values_that_are_not_finite() -> None:
    """A history built by hand may hold NaN or inf: each column's sum leaves them out (the model's
    columns are finite, and are summed without a test per value)."""
    hist = history(10, 0.1, wait_s=0.02, first=11)
    hist = dataclasses.replace(hist, step_time_s=(math.nan, math.inf, *hist.step_time_s[2:]),
                               input_wait_s=(*hist.input_wait_s[:9], -math.inf))
    measured = MEASURES["input_wait"](RULES_BY_ID["input_wait"], job(rank(0, hist=hist)), 0.0)["rank 0"]
    # steps: 8 finite of 0.1 s = 0.8 s; waits: 9 finite of 0.02 s = 0.18 s
    assert measured is not None and measured.evidence["input_wait_pct"] == pytest.approx(100 * 0.18 / 0.8)
    assert measured.evidence["input_wait_s_per_step"] == pytest.approx(0.18 / 10)


def test_input_wait_dip_resets_the_window() -> None:
    engine = HintEngine()
    high = lambda s: job(rank(0, step=s, hist=history(4, 0.1, wait_s=0.02, first=s - 3)))  # noqa: E731
    low = lambda s: job(rank(0, step=s, hist=history(4, 0.1, wait_s=0.001, first=s - 3)))  # noqa: E731
    engine.evaluate(high(4), 0.0)
    engine.evaluate(low(8), 1.0)
    assert find(engine.evaluate(high(14), 2.0), "input_wait") is None  # evidence restarts at step 10
    assert find(engine.evaluate(high(24), 3.0), "input_wait") is not None


def test_input_wait_escalates_to_critical() -> None:
    assert find(settle(HintEngine(), b_input_wait(26.0, 0.0), 0.0), "input_wait").severity == "critical"
    assert find(settle(HintEngine(), b_input_wait(24.0, 0.0), 0.0), "input_wait").severity == "warning"


def test_throttling_needs_five_seconds() -> None:
    engine = HintEngine()
    assert find(engine.evaluate(b_throttle(85.0, 0.0), 0.0), "throttling") is None
    assert find(engine.evaluate(b_throttle(85.0, 0.0), 4.9), "throttling") is None
    hint = find(engine.evaluate(b_throttle(85.0, 0.0), 5.0), "throttling")
    assert hint is not None and hint.evidence["window_s"] == 5.0


# --- gates -----------------------------------------------------------------------------------

def test_comm_gate_on_overlap() -> None:
    def snap(overlap_frac: float) -> JobSnapshot:
        from test_hints_factories import NCCL
        return job(rank(0, kernels=kwin([(NCCL, 4, 1500.0), (GEMM_H, 10, 3000)], overlap_us=overlap_frac * 1500)))

    assert find(settle(HintEngine(), snap(0.55), 0.0), "comm_exposed") is None  # well overlapped
    engine = HintEngine()
    assert find(settle(engine, snap(0.2), 0.0), "comm_exposed") is not None
    assert find(settle(engine, snap(0.55), 100.0), "comm_exposed") is not None  # gate clear is 60 %
    assert find(settle(engine, snap(0.65), 200.0), "comm_exposed") is None


def test_launch_bound_needs_short_kernels() -> None:
    from test_hints_factories import ADD
    few_short = job(rank(0, kernels=kwin([(ADD, 200, 2000.0)], launches=200, short=90)))
    assert find(settle(HintEngine(), few_short, 0.0), "launch_bound") is None
    assert find(settle(HintEngine(), b_launch(19.0, 0.0), 0.0), "launch_bound").severity == "critical"


def test_launch_bound_skips_cpu_windows() -> None:
    from test_hints_factories import ADD
    cpu = job(rank(0, device="cpu (x86_64)", kernels=kwin([(ADD, 200, 2000.0)], launches=200, short=190, device="cpu")))
    assert find(settle(HintEngine(), cpu, 0.0), "launch_bound") is None


def test_attention_unfused_quiet_with_fused_attention_or_only_log_softmax() -> None:
    fused = job(rank(0, kernels=kwin([(SOFTMAX, 4, 80.0), (GEMM_H, 20, 500.0), (FLASH, 4, 100.0)])))
    assert find(settle(HintEngine(), fused, 0.0), "attention_unfused") is None
    loss_only = job(rank(0, kernels=kwin([(LOG_SOFTMAX, 3, 90.0), (GEMM_H, 20, 500.0)])))
    assert find(settle(HintEngine(), loss_only, 0.0), "attention_unfused") is None
    hint = find(settle(HintEngine(), b_attention(4.0, 0.0), 0.0), "attention_unfused")
    assert hint.evidence["softmax_pct_of_step"] == pytest.approx(0.8)  # 80 µs of 10 ms


def test_attention_unfused_counts_batched_matmuls_not_a_routers_linear() -> None:
    """An MoE layer with no attention read "computes attention unfused: 2 softmax kernels per
    step" (its router: Linear, softmax, top-k; a new user's trial, CPU windows, whose rows are
    operators): a row that is a plain mm/addmm/linear operator no longer counts, nor matmul's or
    einsum's (they dispatch to mm or bmm, rows of their own). A GPU kernel row counts whatever
    its op: one cuBLAS kernel serves addmm and bmm, and the row names only the op with the most
    time — attention's bmm calls on a Linear's kernel, through the real aggregate (a review)."""
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.trace import KernelEvent, KernelWindow

    def cpu(*ops: tuple[int, str]) -> JobSnapshot:
        rows = [("aten::_softmax", 2, 40.0, "aten::_softmax")] + [(op, n, 500.0, op) for n, op in ops]
        return job(rank(0, device="cpu", kernels=kwin(rows, device="cpu")))

    router = cpu((30, "aten::mm"), (10, "aten::linear"), (10, "aten::matmul"), (4, "aten::addmm"))
    assert find(settle(HintEngine(), router, 0.0), "attention_unfused") is None
    by_hand = cpu((30, "aten::mm"), (8, "aten::bmm"), (8, "aten::matmul"))  # q@kᵀ, p@v: bmm
    hint = find(settle(HintEngine(), by_hand, 0.0), "attention_unfused")
    assert hint is not None and hint.evidence["gemm_calls_per_step"] == 8.0
    # GPU: 4 layers of 4 Linear GEMMs (addmm, 400 µs) and 2 bmm (100 µs) on one kernel name
    names = (GEMM_H, SOFTMAX, "aten::addmm", "aten::bmm", "aten::_softmax")
    events, t = [], 0.0
    for _ in range(4):
        for kernel, dur, op in [(0, 400.0, 2)] * 4 + [(0, 100.0, 3), (1, 20.0, 4), (0, 100.0, 3)]:
            events.append(KernelEvent(kernel, 0, t, dur, 7, op, -1))
            t += dur
    window = aggregate(KernelWindow(names, tuple(events), t, "cuda", 100, 1))
    assert [(k.calls, k.op) for k in window.kernels if k.name == GEMM_H] == [(24, "aten::addmm")]
    hint = find(settle(HintEngine(), job(rank(0, kernels=window)), 0.0), "attention_unfused")
    assert hint is not None and hint.evidence["gemm_calls_per_step"] == 24.0


def test_optimizer_unfused_quiet_when_fused_kernel_ran() -> None:
    from test_hints_factories import ADDCDIV
    fused = job(rank(0, kernels=kwin([(ADDCDIV, 40, 800.0, "aten::addcdiv_"), (FUSED_ADAM, 1, 80.0)])))
    assert find(settle(HintEngine(), fused, 0.0), "optimizer_unfused") is None
    few = job(rank(0, kernels=kwin([(ADDCDIV, 9, 800.0, "aten::addcdiv_")])))
    assert find(settle(HintEngine(), few, 0.0), "optimizer_unfused") is None


def test_throttling_gate_on_reason() -> None:
    not_power = job(rank(0, tel=telemetry(sm_clock_mhz=1500.0, sm_clock_max_mhz=2000.0, throttle=["sync_boost"])))
    assert find(settle(HintEngine(), not_power, 0.0), "throttling") is None
    engine = HintEngine()
    assert find(settle(engine, b_throttle(80.0, 0.0), 0.0), "throttling") is not None
    gone = job(rank(0, tel=telemetry(sm_clock_mhz=1600.0, sm_clock_max_mhz=2000.0, throttle=[])))
    assert find(settle(engine, gone, 100.0), "throttling") is None


def test_power_cap_at_the_power_limit_is_information() -> None:
    """An H200 under bf16 GEMMs: 701 of 700 W, 1575 of 1980 MHz, sw_power_cap (measured)."""
    at_limit = job(rank(0, tel=telemetry(sm_clock_mhz=1575.0, sm_clock_max_mhz=1980.0, throttle=["sw_power_cap"],
                                         power_w=701.0, power_limit_w=700.0)))
    hint = find(settle(HintEngine(), at_limit, 0.0), "throttling")
    assert hint is not None and hint.severity == "info"
    assert hint.summary == ("rank 0 runs at its power limit (701 of 700 W), SM clock 1575 of 1980 MHz: usual "
                            "under dense tensor-core work, and the datasheet peak behind MFU assumes the boost clock")
    # an instant reading swings around the capped average (629-706 W measured): 85 % of the limit
    # still counts; just below it, or with a thermal reason too, a slowed GPU is a warning
    swing = job(rank(0, tel=telemetry(sm_clock_mhz=1575.0, sm_clock_max_mhz=1980.0, throttle=["sw_power_cap"],
                                      power_w=629.0, power_limit_w=700.0)))
    assert find(settle(HintEngine(), swing, 0.0), "throttling").severity == "info"
    below = job(rank(0, tel=telemetry(sm_clock_mhz=1575.0, sm_clock_max_mhz=1980.0, throttle=["sw_power_cap"],
                                      power_w=590.0, power_limit_w=700.0)))
    assert find(settle(HintEngine(), below, 0.0), "throttling").severity == "warning"
    hot = job(rank(0, tel=telemetry(sm_clock_mhz=1575.0, sm_clock_max_mhz=1980.0,
                                    throttle=["sw_power_cap", "sw_thermal"], power_w=701.0, power_limit_w=700.0)))
    assert find(settle(HintEngine(), hot, 0.0), "throttling").severity == "warning"


def test_input_wait_is_silent_while_the_gpu_is_busy() -> None:
    """A GPU-bound job's host blocks wherever the launch queue fills — between steps too (seen on
    an H200: 9 % "input wait" at GPU-Util 100 %). That wait costs nothing; 10 % idle re-arms it."""
    busy = job(rank(0, hist=history(20, 0.1, wait_s=0.02), tel=telemetry(gpu_util=100.0)))
    assert find(settle(HintEngine(), busy, 0.0), "input_wait") is None
    idle = job(rank(0, hist=history(20, 0.1, wait_s=0.02), tel=telemetry(gpu_util=89.0)))
    hint = find(settle(HintEngine(), idle, 0.0), "input_wait")
    assert hint is not None and hint.evidence["device_idle_pct"] == pytest.approx(11.0)
    assert hint.impact == pytest.approx(0.11)  # no more than the device's idle share is at stake
    # no telemetry: the kernel window's busy share decides; a CPU rank always counts as idle
    gpu_window = job(rank(0, hist=history(20, 0.1, wait_s=0.02), kernels=kwin([(GEMM_H, 1, 9_600.0)])))
    assert find(settle(HintEngine(), gpu_window, 0.0), "input_wait") is None
    cpu = job(rank(0, device="cpu (x86_64)", hist=history(20, 0.1, wait_s=0.02), tel=telemetry(gpu_util=100.0)))
    assert find(settle(HintEngine(), cpu, 0.0), "input_wait") is not None
    # a reading that stopped coming (NVML died) does not keep the hint silent
    stale = dataclasses.replace(telemetry(gpu_util=100.0), received_at=-30.0)
    dead = job(rank(0, hist=history(20, 0.1, wait_s=0.02), tel=stale))
    assert find(settle(HintEngine(), dead, 0.0), "input_wait").evidence["device_idle_pct"] == 100.0
    # a paced rank's reading (one every 10 s at most, its frame held up to the 2 s pace and a
    # backlog's seconds) is not a dead NVML's: 15 s old at each look, the GPU is busy and the hint
    # stays silent
    from flowtop.monitor.hints.measures_time import FRESH_TELEMETRY_S
    from flowtop.monitor.pacing import PACED_TELEMETRY_S
    from probe.wire import MAX_PACE_S

    assert FRESH_TELEMETRY_S >= 2 * (PACED_TELEMETRY_S + MAX_PACE_S)
    engine = HintEngine()
    for t in (0.0, 15.0, 30.0):
        paced = dataclasses.replace(telemetry(gpu_util=100.0), received_at=t - 15.0)
        busy_paced = job(rank(0, hist=history(20, 0.1, wait_s=0.02), tel=paced))
        assert find(engine.evaluate(busy_paced, t), "input_wait") is None


def test_a_rank_between_its_turns_has_telemetry_as_fresh_as_its_view() -> None:
    """A large job's rank between two of its turns has its step brought up to date at each tick,
    its history and telemetry only at its turn, up to a round (32 s) before. Read at the snapshot's
    time, its GPU-Util of 100 % looked like a dead NVML's and its host's waits like an idle GPU's:
    it is read as of its history's newest step (2.0 s here, the reading taken at 1.5 s)."""
    hist = history(20, 0.1, wait_s=0.02)  # steps 1-20, the last reached at 2.0 s; 20 % input wait
    tel = dataclasses.replace(telemetry(gpu_util=100.0), received_at=1.5)
    between = job(rank(0, step=400, hist=hist, tel=tel))  # stepped on since its history
    assert find(settle(HintEngine(), between, 30.0), "input_wait") is None
    # a history that reaches its step: the same reading, 58.5 s old at 60 s, is a dead NVML's
    current = job(rank(0, step=20, hist=hist, tel=tel))
    assert find(settle(HintEngine(), current, 30.0), "input_wait").evidence["device_idle_pct"] == 100.0


def test_util_vs_mfu_gate_and_wording_without_tensor_data() -> None:
    low_util = job(rank(0, fl=flops(mfu=0.1), tel=telemetry(gpu_util=80.0)))
    assert find(settle(HintEngine(), low_util, 0.0), "util_vs_mfu") is None
    no_tensor = job(rank(0, fl=flops(mfu=0.1), tel=telemetry(gpu_util=100.0)))
    hint = find(settle(HintEngine(), no_tensor, 0.0), "util_vs_mfu")
    assert hint.summary == ("rank 0 shows GPU-Util 100 % but does only 10 % of the peak FLOP/s (MFU): "
                            "GPU-Util only says some kernel was running")
    assert hint.impact == pytest.approx(1 - 10 / 30)
    assert find(settle(HintEngine(), b_util(29.0, 0.0), 0.0), "util_vs_mfu") is not None


# --- rule specifics --------------------------------------------------------------------------

def test_fp32_from_flop_dtype_without_kernels() -> None:
    snap = job(rank(0, fl=flops(dtype="fp32")))
    hint = find(settle(HintEngine(), snap, 0.0), "fp32_matmul")
    assert hint.evidence["fp32_gemm_pct"] == 100.0 and hint.evidence["dtype"] == "fp32"
    assert hint.impact == pytest.approx(0.3)
    assert "FLOP count dtype fp32" in hint.summary
    cpu = job(rank(0, device="cpu (x86_64)", fl=flops(dtype="fp32")))
    assert find(settle(HintEngine(), cpu, 0.0), "fp32_matmul") is None


def test_fp32_ignores_tf32_and_tensor_op_gemms() -> None:
    names = ["sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16", "cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4"]
    snap = job(rank(0, fl=flops(dtype="tf32"), kernels=kwin([(n, 5, 500.0) for n in names])))
    assert find(settle(HintEngine(), snap, 0.0), "fp32_matmul") is None


def test_straggler_says_since_when_it_fell_behind() -> None:
    ranks = [rank(r, hist=history(100, 0.1, slow_from=50 if r == 3 else None, slow_step_s=0.125)) for r in range(4)]
    hint = find(settle(HintEngine(), job(*ranks), 0.0), "straggler")
    assert hint.target == "rank 3"
    assert hint.evidence["slower_pct"] == pytest.approx(25.0)
    assert hint.evidence["since_step"] == 49  # steps 1..49 on time; step 50 was the first slow one
    assert hint.evidence["lag_s"] == pytest.approx(51 * 0.025)
    assert hint.impact == pytest.approx(0.025 / 0.125)


def test_of_two_ranks_only_one_is_the_straggler() -> None:
    """Each rank's worst measure over its own windows: in a 2-rank job both read slower than the
    other at once (rank 0 by its late forwards, rank 1 by its step times; a new user's trial saw it
    in a 2-rank DDP job in lockstep, 14 % and 9 %). The larger claim stands."""
    late = history(100, 0.1, lead_s=0.05, late_from=60, late_lead_s=0.08)  # lead lag 30 % of a step
    slow = history(100, 0.1, lead_s=0.05, slow_from=60, slow_step_s=0.12)  # steps 20 % slower
    hints = settle(HintEngine(), job(rank(0, hist=late), rank(1, hist=slow)), 0.0)
    assert [(h.target, h.evidence["basis"]) for h in hints if h.id == "straggler"] == [("rank 0", "lead")]
    steady = history(100, 0.1, lead_s=0.05)
    three = settle(HintEngine(), job(rank(0, hist=late), rank(1, hist=slow), rank(2, hist=steady)), 0.0)
    assert len([h for h in three if h.id == "straggler"]) == 2  # more than two: several may hold the rest up


class _Stepping:
    """Ranks of one job on a real Model, fed wire frames: each rank sends a frame a step as it
    ends it, every ``walls[rank]`` seconds (read at each step: a change takes effect at the next
    one), on a 0.05 s grid; the model ticks every 0.5 s, as a live monitor does."""

    def __init__(self, walls: list[float]) -> None:
        self.model = make_model()
        self.walls = list(walls)
        self.keys = [RankKey("swap", f"h{r}", 100 + r, r, 0) for r in range(len(walls))]
        self.n = 0  # grid slots of 0.05 s so far
        self.seq = [0] * len(walls)
        self.steps = [0] * len(walls)
        self.last = [0] * len(walls)  # the slot of each rank's last step
        for key in self.keys:
            self._send(key, "hello", {"local_rank": 0, "world_size": len(walls), "device": "cpu (test)",
                                      "probe_version": "test"})

    def _send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
        self.seq[key.rank] += 1
        now = self.n * 0.05
        self.model.ingest(wire.decode(wire.encode(kind, key, self.seq[key.rank], now, fields)), now)

    def run(self, seconds: float) -> list[MonitorSnapshot]:
        """Each tick's snapshot over the next ``seconds``."""
        snaps = []
        for _ in range(round(seconds / 0.05)):
            self.n += 1
            for key in self.keys:
                r = key.rank
                if self.n - self.last[r] >= round(self.walls[r] / 0.05):
                    self.last[r], self.steps[r] = self.n, self.steps[r] + 1
                    self._send(key, "step", {"step": self.steps[r], "wall_s": self.walls[r], "tokens": 64, "drops": 0})
            if self.n % 10 == 0:
                snaps.append(self.model.tick(self.n * 0.05))
        return snaps


def _stragglers(snap: MonitorSnapshot) -> list[Hint]:
    return [h for h in snap.jobs[0].hints if h.id == "straggler"]


def _is_straggler(hint: Hint, target: str, since_step: int, lag_s: float | None = None) -> None:
    """``hint`` names ``target``, 25 % slower: 0.25 s a step against the others' 0.2 s, by its
    median step time and by its pace alike (the two read the same here); the others wait
    0.05 of its 0.25 s a step (impact 0.2)."""
    assert hint.target == target and not hint.ended
    assert hint.evidence["basis"] in ("step_time", "pace")
    assert hint.evidence["slower_pct"] == pytest.approx(25.0)
    assert hint.evidence["step_time_s"] == pytest.approx(0.25)
    assert hint.evidence["others_step_time_s"] == pytest.approx(0.2)
    assert hint.impact == pytest.approx(0.2)
    assert hint.evidence["since_step"] == since_step
    if lag_s is not None:
        assert hint.evidence["lag_s"] == pytest.approx(lag_s)


@pytest.mark.parametrize(("n_ranks", "first", "second", "lag_s"), [(2, 1, 0, 4.0), (3, 2, 1, 6.0), (8, 5, 2, 8.0)],
                         ids=["2-ranks", "3-ranks", "8-ranks"])
def test_a_straggler_that_swaps_with_another_rank_is_named_alone(n_ranks: int, first: int, second: int,
                                                                   lag_s: float) -> None:
    """A new user's trial: on a 2-rank job whose ranks swapped speeds, two straggler hints at once,
    "rank 0 is slower than the others" beside "rank 1 is slower than the others": the old one
    held for HOLD_S after its measure fell back. A hint held past its clear value goes once another
    rank is named; a job whose ranks step alike shows none once the hold is over.

    By hand (0.05 s grid, steps from 0 s): rank ``first`` steps every 0.25 s, the others every
    0.2 s, for 20 s: it is at step 80, they at 100. It is 25 % slower (0.25 vs 0.2 s), late from
    its first step (its lag behind the others' median reach time grows by 0.05 s a step: smallest
    at step 1, "since step 1"), 80 × 0.05 = 4 s behind at step 80, the newest all ranks reached.
    Then rank ``second`` steps every 0.25 s and ``first`` every 0.2 s for 40 s: ``second`` reaches
    step 100 + 160 = 260, ``first`` 80 + 200 = 280. The steps all ranks reached end at ``first``'s
    newest until 20 s after the swap (both at step 180): ``first``'s step-time median is 0.2 s
    from 11 of its new steps on (2.2 s), ``second``'s 0.25 s from 11 of its slow ones in that
    window (step 111: 6.2 s), all of its window slow from step 120 (8 s): 25 % slower again, now
    ``second``. Its reach lag: flat from step 80 to 100 (both at 0.2 s a step), growing 0.05 s a
    step after: "since step 100"; at step 260, 60 s against the others' median: 2 ranks: rank 1
    at 56 s (80 steps of 0.25 s, 180 of 0.2), 4 s; 3 ranks: the median of 56 s and 52 s (rank 0,
    0.2 s a step throughout), 54 s, 6 s; 8 ranks: 52 s (6 of the 7 others at 0.2 s throughout), 8 s.
    Then every rank at 0.2 s: ``second``'s last 20 steps hold 15 new ones at 3 s (pace 6.25 %:
    still shown, above the 5 % clear), 17 at 3.5 s (3.75 %): held for HOLD_S from 3 s, gone at 13 s."""
    walls = [0.2] * n_ranks
    walls[first] = 0.25
    job = _Stepping(walls)
    snaps = job.run(20.0)
    (hint,) = _stragglers(snaps[-1])
    _is_straggler(hint, f"rank {first}", 1, 4.0)
    assert hint.evidence["window_steps"] == 20

    job.walls[first], job.walls[second] = 0.2, 0.25
    swapped = job.run(40.0)
    assert job.steps[second] == 260 and job.steps[first] == 280
    # Never two straggler hints: the held one goes at the tick that names the other rank.
    assert [s.taken_at for s in swapped if len(_stragglers(s)) > 1] == []
    named = [s.taken_at for s in swapped if [h.target for h in _stragglers(s)] == [f"rank {second}"]]
    assert named and named == [s.taken_at for s in swapped if s.taken_at >= named[0]]  # from then on, alone
    settled = [s for s in swapped if s.taken_at >= 20.0 + 8.0]
    for snap in settled:
        (hint,) = _stragglers(snap)
        _is_straggler(hint, f"rank {second}", 100)
    _is_straggler(_stragglers(swapped[-1])[0], f"rank {second}", 100, lag_s)

    job.walls[second] = 0.2
    alike = job.run(30.0)
    assert all(len(_stragglers(s)) <= 1 for s in alike)
    assert [s.taken_at for s in alike if _stragglers(s)][-1] < 60.0 + 3.0 + HOLD_S
    assert [s for s in alike if s.taken_at >= 60.0 + 3.0 + HOLD_S and _stragglers(s)] == []


def test_a_later_pipeline_stage_is_neither_input_bound_nor_a_straggler_by_its_lead() -> None:
    """Stage 1 of a 2-stage pipeline waits for stage 0's activations before its forward (the
    bubble) and so ends its forward later: it read "waits for input 23 % of each step" and
    "finishes its forward 9 ms after the others" on every GPipe and 1F1B run (a new user's
    trial). Leads compare within a stage; the wait of a stage that does not read the data is
    not its input's. The same ranks without pipeline coordinates still get both hints."""
    def stage(r: int, pp: bool, lead_s: float, wait_s: float) -> Any:
        snap = rank(r, hist=history(100, 0.1, lead_s=lead_s, wait_s=wait_s))
        return dataclasses.replace(snap, coords={"pp": (r, 2)}, pp_stages=(r,)) if pp else snap

    pipelined = job(stage(0, True, 0.03, 0.0), stage(1, True, 0.06, 0.025))
    hints = settle(HintEngine(), pipelined, 0.0)
    assert [h.id for h in hints if h.id in ("straggler", "input_wait")] == []
    flat = job(stage(0, False, 0.03, 0.0), stage(1, False, 0.06, 0.025))
    hints = settle(HintEngine(), flat, 0.0)
    assert sorted((h.id, h.target) for h in hints if h.id in ("straggler", "input_wait")) == [
        ("input_wait", "rank 1"), ("straggler", "rank 1")]
    # two data-parallel replicas of each stage: a late forward within stage 1 is still found
    late = history(100, 0.1, lead_s=0.06, wait_s=0.0, late_from=60, late_lead_s=0.09)
    four = [stage(0, True, 0.03, 0.0), stage(1, True, 0.06, 0.0),
            dataclasses.replace(rank(2, hist=history(100, 0.1, lead_s=0.03)), coords={"pp": (0, 2)}, pp_stages=(0,)),
            dataclasses.replace(rank(3, hist=late), coords={"pp": (1, 2)}, pp_stages=(1,))]
    hints = settle(HintEngine(), job(*four), 0.0)
    assert [(h.target, h.evidence["basis"]) for h in hints if h.id == "straggler"] == [("rank 3", "lead")]
    # ranks of no known stage in a pipelined job (hellos without coordinates yet) are not
    # compared by lead: they may be of any stage (a review)
    unknown = [rank(4, hist=history(100, 0.1, lead_s=0.03)), rank(5, hist=history(100, 0.1, lead_s=0.06))]
    hints = settle(HintEngine(), job(*four[:2], *unknown), 0.0)
    assert [h.target for h in hints if h.id == "straggler"] == []


def test_straggler_needs_two_ranks_and_ignores_done_ranks() -> None:
    one = job(rank(0, hist=history(30, 0.2)))
    assert find(settle(HintEngine(), one, 0.0), "straggler") is None
    done = job(rank(0, hist=history(30, 0.1)), rank(1, status="done", hist=history(30, 0.2)))
    assert find(settle(HintEngine(), done, 0.0), "straggler") is None


def test_a_dead_nodes_ranks_are_named_as_a_range_with_their_host() -> None:
    """A dead node's 8 ranks read "ranks 720, 721, 722, 723, 724, 725, 726, 727" (a new user's
    trial at 1,024 ranks): runs of rank numbers are ranges, and the host is named when few."""
    from flowtop.monitor.hints.measures_time import rank_list

    node = [dataclasses.replace(rank(r), host="node0090") for r in range(720, 728)]
    assert rank_list(node) == "ranks 720-727 (node0090)"
    assert rank_list(node[:1]) == "rank 720 (node0090)"
    spread = [dataclasses.replace(rank(r), host=f"n{r % 3}") for r in (3, 40, 41, 42, 96, 97)]
    assert rank_list(spread) == "ranks 3,40-42,96-97 (3 hosts)"
    assert rank_list(spread, width=8) == "ranks 3,40-42… (3 hosts)"


def test_hang_default_floor_is_thirty_seconds() -> None:
    assert find(shown(HintEngine().evaluate(b_hang_rank(29.0, 0.0), 0.0), 0.0), "hang_rank") is None
    hint = find(shown(HintEngine().evaluate(b_hang_rank(31.0, 0.0), 0.0), 0.0), "hang_rank")
    assert hint.evidence["limit_s"] == 30.0 and hint.severity == "critical"


def test_hang_limit_scales_with_the_usual_step() -> None:
    slow = job(rank(0, step=10, hist=history(10, 5.0, t0=-50.0 - 40.0)))  # 5 s steps, last 40 s ago
    engine = HintEngine()
    assert find(shown(engine.evaluate(slow, 9.0), 9.0), "hang_all") is None  # limit 10 x 5 s; stalled 49 s
    hint = find(shown(engine.evaluate(slow, 11.0), 11.0), "hang_all")  # 51 s
    assert hint.evidence["limit_s"] == 50.0 and hint.evidence["stalled_s"] == pytest.approx(51.0)


def test_hang_all_hides_hang_rank() -> None:
    hints = settle(HintEngine(small_hang_rules()), b_hang_all(2.0, 0.0), 0.0)
    assert [h.id for h in hints if h.id.startswith("hang")] == ["hang_all"]


def test_a_held_hang_rank_does_not_surface_when_hang_all_ends() -> None:
    """Two ranks hung; rank 0 steps again at t=1, rank 1 at t=2. hang_all (measured at t=0 last
    beyond) holds until t=10, hang_rank of rank 1 (beyond at t=1) until t=11: at t=10.5 it showed
    "has not finished a step" for a rank stepping again (a trial's frozen node, one tick)."""
    from test_hints_factories import _stalled

    engine = HintEngine(small_hang_rules())
    hangs = lambda snap, t: [h.id for h in engine.evaluate(snap, t) if h.id.startswith("hang")]  # noqa: E731
    assert hangs(b_hang_all(2.0, 0.0), 0.0) == ["hang_all"]
    assert hangs(job(_stalled(0, 0.05, 1.0), _stalled(1, 3.0, 1.0)), 1.0) == ["hang_all"]  # held, hiding
    for t in (2.0, 6.0, 9.5):
        assert hangs(job(_stalled(0, 0.05, t), _stalled(1, 0.05, t)), t) == ["hang_all"]
    assert hangs(job(_stalled(0, 0.05, 10.5), _stalled(1, 0.05, 10.5)), 10.5) == []


def test_one_off_slow_steps_are_no_spike_pattern() -> None:
    """Two slow steps of 2 s among 200 of 0.1 s lose 18 % of the time, but one-off ones (the probe's
    kernel window and FLOP count, a checkpoint) are no pattern: no hint; a third makes one. Within
    the first 20 steps (warm-up, compilation) none either."""
    from flowtop.monitor.hints.measures_spikes import step_spikes

    rule = RULES_BY_ID["step_spikes"]

    def spiked(at: tuple[int, ...], first: int = 21) -> JobSnapshot:
        h = history(200, 0.1, first=first)
        times = [2.0 if i in at else t for i, t in enumerate(h.step_time_s)]
        return job(rank(0, hist=dataclasses.replace(h, step_time_s=tuple(times))))

    assert step_spikes(rule, spiked((50, 150)), 0.0) == {}
    three = step_spikes(rule, spiked((50, 100, 150)), 0.0)[""]
    # 3 × (2.0 − 0.3) of 197 × 0.1 + 3 × 2.0 = 25.7 s
    assert three is not None and three.value == pytest.approx(100 * 5.1 / 25.7)
    assert step_spikes(rule, spiked((50, 100, 150), first=1), 0.0) == {}  # the window holds steps 1-20


def test_no_hang_when_job_or_rank_is_done() -> None:
    engine = HintEngine(small_hang_rules())
    snap = b_hang_all(5.0, 0.0)
    assert not [h for h in settle(engine, dataclasses.replace(snap, status="done"), 0.0) if h.id.startswith("hang")]
    done_rank = job(rank(0, step=10, status="done", hist=history(10, 0.1, t0=-10)))
    assert not [h for h in settle(engine, done_rank, 0.0) if h.id.startswith("hang")]


def test_a_hang_after_a_rank_failed_names_the_failed_rank() -> None:
    """One rank crashed and the others wait for it in a collective: the hint said "the 2 running
    ranks (of 3; the other ended) stopped" and had the stacks dumped, while the cause — the rank
    whose bye named its exception — went unsaid (a reviewer's find)."""
    from test_hints_factories import _stalled

    crashed = dataclasses.replace(_stalled(2, 5.0, 0.0), status="failed",
                                  bye_reason="error: RuntimeError: CUDA out of memory")
    snap = job(_stalled(0, 5.0, 0.0), _stalled(1, 5.5, 0.0), crashed)
    hint = find(settle(HintEngine(small_hang_rules()), snap, 0.0), "hang_all")
    assert hint is not None and hint.evidence["failed_ranks"] == [2]
    assert "since rank 2 (node1) failed (RuntimeError: CUDA out of memory); they likely wait for it" in hint.summary
    assert hint.summary.startswith("the 2 running ranks (of 3; the other ended) stopped at step 10")


def test_a_hang_after_a_signal_stopped_a_rank_names_the_stopped_ranks() -> None:
    """NCCL's usual hang: one node scancel'd or preempted (its ranks' byes "SIGTERM": stopped),
    the others block in the collective it left, heartbeats going on. The hint said only that
    they stopped; the ranks the signal ended, the ones they wait for, went unnamed."""
    from test_hints_factories import _stalled

    gone = dataclasses.replace(_stalled(2, 5.0, 0.0), status="stopped", bye_reason="SIGTERM")
    snap = job(_stalled(0, 5.0, 0.0), _stalled(1, 5.5, 0.0), gone)
    hint = find(settle(HintEngine(small_hang_rules()), snap, 0.0), "hang_all")
    assert hint is not None and hint.evidence["stopped_ranks"] == [2]
    assert "since a signal (SIGTERM) ended rank 2 (node1); they likely wait for it" in hint.summary
    assert hint.summary.startswith("the 2 running ranks (of 3; the other ended) stopped at step 10")
    # a crash beside it is the cause named
    crashed = dataclasses.replace(_stalled(3, 5.0, 0.0), status="failed", bye_reason="error: ValueError: x")
    hint = find(settle(HintEngine(small_hang_rules()), job(*snap.ranks, crashed), 0.0), "hang_all")
    assert hint is not None and "since rank 3 (node1) failed (ValueError: x)" in hint.summary


def test_hang_counts_silence_of_a_rank() -> None:
    """A rank that stopped sending entirely is stalled by its age even with a recent step."""
    silent = job(rank(0, step=10, age_s=2.0, hist=history(10, 0.1, t0=-1.1)))
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(silent, 0.0), 0.0), "hang_all")
    assert hint.evidence["stalled_s"] == pytest.approx(2.0)


def test_uncounted_attention_is_a_warning_with_its_time_share() -> None:
    fl = flops(uncounted={"aten::_scaled_dot_product_flash_attention_for_cpu": 8})
    snap = job(rank(0, fl=fl, kernels=kwin([(FLASH, 4, 100.0), (GEMM_H, 10, 900.0)])), fl=fl)
    hints = settle(HintEngine(), snap, 0.0)
    hint = find(hints, "uncounted_ops")
    assert hint.severity == "warning"
    assert hint.evidence["uncounted_time_pct"] == pytest.approx(10.0)
    assert hint.summary.endswith("those attention ops run 10 % of GPU time")
    assert find(hints, "attention_flops_note") is None  # not counted: no "counted by formula" note
    assert find(settle(HintEngine(), b_uncounted(2.0, 0.0), 0.0), "uncounted_ops").severity == "info"


def test_uncounted_calls_are_per_rank_not_summed_over_ranks() -> None:
    per_rank = flops(uncounted={"aten::my_custom_op": 3})
    summed = flops(uncounted={"aten::my_custom_op": 6})  # what the job's aggregate view holds
    snap = job(rank(0, fl=per_rank), rank(1, fl=per_rank), fl=summed)
    hint = find(settle(HintEngine(), snap, 0.0), "uncounted_ops")
    assert hint.evidence["uncounted_calls"] == 3.0


def test_comm_escalates_beyond_thirty_percent() -> None:
    assert find(settle(HintEngine(), b_comm(31.0, 0.0), 0.0), "comm_exposed").severity == "critical"
    hint = find(settle(HintEngine(), b_comm(20.0, 0.0), 0.0), "comm_exposed")
    assert hint.impact == pytest.approx(0.16)  # 80 % of 20 % exposed


def test_hang_rank_action_names_the_pid() -> None:
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(b_hang_rank(3.0, 0.0), 0.0), 0.0), "hang_rank")
    assert "py-spy dump --pid 4001" in hint.action


# --- straggler by lead time (synchronous data parallelism) -------------------------------------

def _lead_job(leads: dict[int, float], late: dict[int, tuple[int, float]] | None = None, n: int = 30) -> JobSnapshot:
    """Four ranks in lockstep (equal step and reach times, 0.1 s), with the given leads."""
    late = late or {}
    return job(*(rank(r, step=n, hist=history(n, 0.1, lead_s=leads[r], late_from=late.get(r, (None, None))[0],
                                              late_lead_s=late.get(r, (None, None))[1])) for r in range(4)))


def test_lead_straggler_says_since_when_its_forward_ends_late() -> None:
    snap = _lead_job({0: 0.01, 1: 0.01, 2: 0.01, 3: 0.01}, late={1: (12, 0.05)})
    hint = find(settle(HintEngine(), snap, 0.0), "straggler")
    assert hint.target == "rank 1" and hint.severity == "warning"
    assert hint.evidence["basis"] == "lead"
    assert hint.evidence["lag_pct_of_step"] == pytest.approx(40.0)
    assert hint.evidence["since_step"] == 11  # steps 1..11 on time, step 12 the first late one
    assert hint.impact == pytest.approx(0.4)
    assert hint.summary.startswith("rank 1 finishes its forward 40 ms after the others each step (40 % ")


def test_lead_straggler_escalates_past_half_the_step() -> None:
    hint = find(settle(HintEngine(), _lead_job({0: 0.01, 1: 0.01, 2: 0.07, 3: 0.01}), 0.0), "straggler")
    assert hint.target == "rank 2" and hint.severity == "critical"
    assert hint.evidence["slower_pct"] == pytest.approx(60.0)


def test_lead_uses_the_median_step_not_a_spike() -> None:
    """One step where rank 3's forward ended 90 ms late is not a straggler; 11 of 20 steps are."""
    spike = _lead_job({0: 0.01, 1: 0.01, 2: 0.01, 3: 0.01}, late={3: (30, 0.1)})
    assert find(settle(HintEngine(), spike, 0.0), "straggler") is None
    most = _lead_job({0: 0.01, 1: 0.01, 2: 0.01, 3: 0.01}, late={3: (20, 0.1)})
    assert find(settle(HintEngine(), most, 0.0), "straggler").target == "rank 3"


def test_lead_unknown_on_one_rank_is_no_evidence() -> None:
    """A rank whose probe sends no lead (0.0) leaves the lead measure out; lockstep ranks with
    equal step times then show no straggler."""
    snap = _lead_job({0: 0.0, 1: 0.01, 2: 0.09, 3: 0.01})
    assert find(settle(HintEngine(), snap, 0.0), "straggler") is None


def test_step_time_basis_wins_when_larger() -> None:
    ranks = [rank(r, hist=history(30, 0.13 if r == 0 else 0.1, lead_s=0.03 if r == 0 else 0.01)) for r in range(4)]
    hint = find(settle(HintEngine(), job(*ranks), 0.0), "straggler")
    assert hint.target == "rank 0" and hint.evidence["basis"] in ("step_time", "pace")
    assert hint.evidence["slower_pct"] == pytest.approx(30.0)
    assert hint.evidence["lag_pct_of_step"] == pytest.approx(100 * 0.02 / 0.13)  # lead still reported
    assert hint.summary.startswith("rank 0 is 30 % slower than the other ranks")


# --- hang: who went silent -----------------------------------------------------------------------

def test_hang_all_names_the_silent_rank() -> None:
    """Rank 1 was stopped (no message for 6 s, stale); rank 0 waits in a collective and still
    sends heartbeats."""
    waiting = rank(0, step=10, age_s=0.4, hist=history(10, 0.1, t0=-7.0))
    stopped = rank(1, step=10, status="stale", age_s=6.0, hist=history(10, 0.1, t0=-7.0))
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(job(waiting, stopped), 0.0), 0.0), "hang_all")
    assert hint.evidence["silent_ranks"] == [1] and hint.evidence["silent_s"] == 6.0
    assert hint.summary == ("all 2 ranks stopped at step 10: no step for 6 s; nothing heard from rank 1 (node1) "
                            "for 6 s (stopped, dead or its host is down) while the others wait")
    both = job(dataclasses.replace(waiting, status="stale", heard_at=-6.0), stopped)
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(both, 0.0), 0.0), "hang_all")
    assert hint.evidence["silent_ranks"] == [0, 1]
    assert hint.summary == ("all 2 ranks stopped at step 10: no step for 6 s; nothing heard from ranks 0-1 "
                            "(node1) for 6 s (stopped, dead or its host is down)")  # nobody waits: no "others"
    # A SIGKILLed rank whose peer already ended: named, and not "all 1 ranks".
    done = dataclasses.replace(waiting, status="done")
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(job(done, stopped), 0.0), 0.0), "hang_all")
    assert hint.summary == ("the 1 running rank (of 2; the other ended) stopped at step 10: no step for 6 s; "
                            "nothing heard from rank 1 (node1) for 6 s (stopped, dead or its host is down)")


def _cut_off(snap: JobSnapshot, target: str, t: float) -> JobSnapshot:
    """``snap`` with the rank of ``target`` (every row of it) unheard behind relay node9, silent
    for 5 s at ``t``: stale, marked cut off, as flowtop.monitor.relays marks it."""
    n = int(target.split()[1])
    return dataclasses.replace(snap, ranks=tuple(
        dataclasses.replace(r, status="stale", cut=RelayCut("node9", t - 5.0)) if r.rank == n else r
        for r in snap.ranks))


@pytest.mark.parametrize("case", [c for c in CASES if RULES_BY_ID[c.rule].scope == "rank"], ids=lambda c: c.rule)
def test_a_rank_hint_is_not_active_while_its_rank_is_unheard_and_comes_back_after(case: Case) -> None:
    """Every rank rule but rank_conflict: a rank unheard behind a silent relay (a new user's
    trial: its input_wait and kernel hints stayed active, their evidence from before the cut read
    as current beside relay_silent) has none of its hints active while it is unheard, whatever the
    data from before the cut says, even held (HOLD_S): the one shown is kept marked ended, as last
    measured (a finished run's final snapshot states it); heard again, its hint comes back from
    its data. rank_conflict (every process claiming the rank, one of them perhaps heard) stays."""
    engine = case.engine()
    assert at(case, case.above, 0.0, engine) is not None
    claimants = case.rule in CLAIMANT_RULES
    for t in (31.0, 32.0):
        hints = engine.evaluate(_cut_off(case.build(case.above, t), case.target, t), t)
        mine = {h.id: h.ended for h in hints if h.target == case.target}
        assert mine[case.rule] is not claimants
        assert all(mine[other] for other in mine if other not in CLAIMANT_RULES)  # none active
    hint = at(case, case.above, 40.0, engine)
    assert hint is not None and not hint.ended


def test_hang_all_leaves_out_ranks_cut_off_behind_their_relay() -> None:
    """Ranks 2-3 are stale behind a silent relay (marked cut off by flowtop.monitor.relays): unheard,
    not known to have stopped. The hang reads the heard ranks alone and counts the others; with
    every rank cut off there is nothing to judge."""
    waiting = [rank(r, step=10, age_s=0.4, hist=history(10, 0.1, t0=-7.0)) for r in (0, 1)]
    cut = [dataclasses.replace(rank(r, step=10, status="stale", age_s=6.0, hist=history(10, 0.1, t0=-7.0)),
                               cut=RelayCut("node2", -6.0)) for r in (2, 3)]
    hint = find(shown(HintEngine(small_hang_rules()).evaluate(job(*waiting, *cut), 0.0), 0.0), "hang_all")
    assert hint.evidence["silent_ranks"] == []
    assert hint.summary.startswith("the 2 heard ranks (of 4; 2 unheard behind a silent relay) stopped at step 10")
    assert find(shown(HintEngine(small_hang_rules()).evaluate(job(*cut), 0.0), 0.0), "hang_all") is None


def test_a_pace_without_step_times_beside_it_says_none() -> None:
    """Ranks whose window holds receive times but no step times (a reviewer's case): rank 2's
    steps reach the monitor every 0.13 s, the others' every 0.1 s (30 % slower over its last 20
    steps, 2.6 s); the pace's summary leaves the step-time clause out (the base: "median step
    times n/a s vs n/a s")."""
    def hist(r: int) -> Any:
        pace = 0.13 if r == 2 else 0.1
        return dataclasses.replace(history(30, 0.1), step_time_s=(), steps=(),
                                   reached=tuple((s, pace * s) for s in range(1, 31)))
    hint = find(settle(HintEngine(), job(*(rank(r, hist=hist(r)) for r in range(4))), 0.0), "straggler")
    assert hint is not None and hint.evidence["step_time_s"] is None
    assert hint.summary == ("rank 2 reaches its steps 30 % slower than the other ranks: 0.13 s per step vs their "
                            "median 0.1 s, on the monitor's receive clock over its last 20 steps (2.6 s); since step 1")
