"""Factories of real snapshot dataclasses for the hint tests (no mocks), and one builder per rule.

Each builder turns a value of the rule's measure into a JobSnapshot whose measure is exactly that
value, so the tests can place it just above, between the clear value and the threshold, or below.
This module holds no tests itself; test_hints_rules.py and test_hints_engine.py import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flowtop.monitor.hints import RULES, HintEngine
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.kernels.aggregate import CategoryStat, KernelStat, KernelWindowStats, StepAnatomy
from flowtop.monitor.kernels.merge import merge_ranks
from flowtop.monitor.kernels.classify import classify, short_name
from flowtop.monitor.relayviews import RelayCut
from flowtop.monitor.snapshot import Claimant, FlopsView, History, JobSnapshot, RankSnapshot, StageView, TelemetryView

GIB = float(1 << 30)
#: ``heard_at``/``received_at`` of a record that is fresh at any evaluation time (age 0).
FRESH = float("inf")
GEMM_H = "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_TNT"
SGEMM = "ampere_sgemm_128x64_tn"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 8, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"
LOG_SOFTMAX = "void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue, long, 8>(float*, float const*, long)"
ADDCDIV = "void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::addcdiv_cuda_kernel(at::TensorIteratorBase&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda(float, float, float)#1}, std::array<char*, 4ul> >(int, float, std::array<char*, 4ul>)"
FUSED_ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float const*>(int)"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
FLASH = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"


# --- records -----------------------------------------------------------------------------------

def history(n: int, step_s: float = 0.1, wait_s: float = 0.0, first: int = 1, t0: float = 0.0,
            slow_from: int | None = None, slow_step_s: float | None = None,
            lead_s: float = 0.0, late_from: int | None = None, late_lead_s: float | None = None) -> History:
    """n steps from ``first``; reach times accumulate step times from t0 (monitor clock).
    From step ``slow_from`` on, steps take ``slow_step_s``; each step's lead (boundary → end of
    forward) is ``lead_s`` (0: unknown), and ``late_lead_s`` from step ``late_from`` on."""
    steps, times, reached, leads = [], [], [], []
    t = t0
    for s in range(first, first + n):
        dt = slow_step_s if slow_from is not None and s >= slow_from and slow_step_s else step_s
        t += dt
        steps.append(s)
        times.append(dt)
        reached.append((s, t))
        leads.append(late_lead_s if late_from is not None and s >= late_from and late_lead_s else lead_s)
    return History(steps=tuple(steps), step_time_s=tuple(times), input_wait_s=tuple([wait_s] * n),
                   lead_s=tuple(leads), reached=tuple(reached))


def flops(mfu: float | None = 0.4, dtype: str = "bf16", uncounted: dict[str, int] | None = None,
          model: float | None = 1e12, estimated: float | None = None,
          uncounted_size: dict[str, int] | None = None) -> FlopsView:
    """A FLOP view with the fields the hints read."""
    return FlopsView(
        model_flops_per_step=model, executed_flops_per_step=model, estimated_flops_per_step=estimated,
        estimate_source="6N+12LdT" if estimated else None, flops_per_s=None, executed_flops_per_s=None,
        mfu=mfu, hfu=mfu, peak_flops=989.4e12, peak_source="table", dtype=dtype,
        attention_convention="full", flops_per_token=None, uncounted_ops=uncounted or {},
        uncounted_size=uncounted_size or {},
    )


def telemetry(**device: Any) -> TelemetryView:
    """Device telemetry with the probe's key names, fresh whenever it is evaluated."""
    return TelemetryView(device=device, host={}, reasons={}, received_at=FRESH)


def rank(r: int = 0, *, step: int = 100, status: str = "live", device: str = "NVIDIA H200",
         age_s: float | None = None, hist: History | None = None, fl: FlopsView | None = None,
         tel: TelemetryView | None = None, kernels: KernelWindowStats | None = None,
         incarnation: int = 0, input_wait_frac: float | None = None) -> RankSnapshot:
    """A rank snapshot; the median step time comes from its history (0.1 s by default). It was
    heard from ``age_s`` before monitor time 0 (where the tests evaluate), or — by default —
    just now whenever it is evaluated."""
    hist = hist if hist is not None else History()
    return RankSnapshot(
        rank=r, host="node1", pid=4000 + r, local_rank=r, incarnation=incarnation, device=device,
        status=status, step=step, step_time_s=0.1, device_time_s=None, tokens_per_step=4096,
        tokens_per_s=None, input_wait_frac=input_wait_frac,
        heard_at=FRESH if age_s is None else -age_s, lost_messages=0,
        dropped_messages=0, probe_overhead_frac=None, flops=fl, telemetry=tel, kernels=kernels,
        history=hist,
    )


def job(*ranks: RankSnapshot, status: str = "running", fl: FlopsView | None = None,
        merged: Any = None, name: str = "job1") -> JobSnapshot:
    """A job of the given ranks."""
    return JobSnapshot(job=name, world_size=len(ranks), ranks=tuple(ranks), step=min(r.step for r in ranks),
                       step_time_s=0.1, tokens_per_s=None, flops=fl, status=status, kernels_merged=merged)


def kwin(rows: Sequence[tuple[Any, ...]], step_us: float = 10_000.0, busy_us: float | None = None,
         overlap_us: float = 0.0, launches: int | None = None, short: int = 0,
         device: str = "cuda") -> KernelWindowStats:
    """A kernel window from rows (name, calls, total_us[, op]), with the real aggregate records.
    Busy defaults to the summed kernel time (one stream); launches to the summed calls."""
    kernels = []
    for row in rows:
        name, calls, total = row[0], int(row[1]), float(row[2])
        op = row[3] if len(row) > 3 else ""
        kernels.append(KernelStat(name, short_name(name), classify(name), calls, total,
                                  total / step_us, None, None, op))
    cats: dict[str, list[float]] = {}
    for k in kernels:
        c = cats.setdefault(k.category, [0, 0.0])
        c[0] += k.calls
        c[1] += k.total_us
    categories = tuple(CategoryStat(c, int(v[0]), v[1], v[1] / step_us, None) for c, v in cats.items())
    total_us = sum(k.total_us for k in kernels)
    busy = total_us if busy_us is None else busy_us
    comm = sum(k.total_us for k in kernels if k.category == "communication")
    anatomy = StepAnatomy(
        step_us=step_us, busy_us=busy, idle_us=max(0.0, step_us - busy), busy_frac=busy / step_us,
        comm_us=comm, comm_overlap_us=overlap_us, comm_overlap_frac=overlap_us / comm if comm else None,
        launches=sum(k.calls for k in kernels) if launches is None else launches, short_kernels=short,
        short_kernel_us=None, short_note="", gaps=(), flops=None, tflops=None,
    )
    return KernelWindowStats(device, 100, 1, step_us, tuple(kernels), categories, anatomy, None)


# --- per-rule builders: (measure value, now) -> JobSnapshot ------------------------------------

Builder = Callable[[float, float], JobSnapshot]


def b_input_wait(v: float, now: float) -> JobSnapshot:
    # steps 11-20: past the run's first steps, whose wait (the loader's start) the rule leaves out
    return job(rank(0, step=20, hist=history(10, 0.1, wait_s=v / 100 * 0.1, first=11)))


def b_straggler(v: float, now: float) -> JobSnapshot:
    ranks = [rank(r, hist=history(30, 0.1 * (1 + v / 100) if r == 2 else 0.1)) for r in range(4)]
    return job(*ranks)


def b_spikes(v: float, now: float) -> JobSnapshot:
    """Two ranks past their first 20 steps, 197 steps of 0.1 s and 3 of x: the time beyond 3 × the
    median (0.1 s), 3 (x − 0.3), is v % of the 19.7 + 3x s of the 200 steps when
    x = (0.9 + 0.197 v) / (3 (1 − v / 100))."""
    x = (0.9 + 0.197 * v) / (3 * (1 - v / 100))
    h = history(200, 0.1, first=21)
    times = list(h.step_time_s)
    for i in (40, 100, 160):
        times[i] = x
    return job(rank(0, hist=dataclasses.replace(h, step_time_s=tuple(times))), rank(1, hist=h))


def b_straggler_lead(v: float, now: float) -> JobSnapshot:
    """Synchronous DDP: equal step times and reach times, rank 2 ends its forward v % of the
    step (0.1 s) later than the others (whose leads are 10 ms and 11 ms)."""
    leads = {0: 0.010, 1: 0.011, 2: 0.0105 + v / 100 * 0.1, 3: 0.0105}
    return job(*(rank(r, hist=history(30, 0.1, lead_s=leads[r])) for r in range(4)))


def b_straggler_pace(v: float, now: float) -> JobSnapshot:
    """Equal step times (0.1 s), but rank 2's steps reach the monitor v % slower: step s at
    0.1 (1 + v / 100) s, the others' at 0.1 s. Its pace from step 10 to 30 (the last frame end
    the 20-step window back, 2.24 s of receive time at v = 12: over PACE_MIN_SPAN_S) is 0.112 s a
    step against the others' 0.1 s; step times 0 % apart."""
    def hist(r: int) -> History:
        h = history(30, 0.1)
        pace = 0.1 * (1 + v / 100) if r == 2 else 0.1
        return dataclasses.replace(h, reached=tuple((s, pace * s) for s in h.steps))
    return job(*(rank(r, hist=hist(r)) for r in range(4)))


def _stalled(r: int, stalled_s: float, now: float) -> RankSnapshot:
    return rank(r, step=10, hist=history(10, 0.1, t0=now - stalled_s - 1.0))


def b_hang_rank(v: float, now: float) -> JobSnapshot:
    # limit = max(10 x 0.1 s, floor 0.5 s) = 1 s with small_hang_rules(): stalled_x = stalled_s
    return job(_stalled(0, 0.05, now), _stalled(1, v, now))


def b_hang_all(v: float, now: float) -> JobSnapshot:
    return job(_stalled(0, v, now), _stalled(1, v + 0.5, now))


def b_comm(v: float, now: float) -> JobSnapshot:
    comm = v / 100 * 10_000
    return job(rank(0, kernels=kwin([(NCCL, 4, comm), (GEMM_H, 10, 3000)], overlap_us=0.2 * comm)))


def b_launch(v: float, now: float) -> JobSnapshot:
    return job(rank(0, kernels=kwin([(ADD, 200, v * 100)], launches=200, short=180)))


def b_memory(v: float, now: float) -> JobSnapshot:
    return job(rank(0, kernels=kwin([(ADD, 50, v * 10), (GEMM_H, 10, (100 - v) * 10)])))


def b_fp32(v: float, now: float) -> JobSnapshot:
    return job(rank(0, fl=flops(dtype="tf32"), kernels=kwin([(SGEMM, 5, v * 10), (GEMM_H, 10, (100 - v) * 10)])))


def b_attention(v: float, now: float) -> JobSnapshot:
    rows = [(LOG_SOFTMAX, 1, 30.0), (GEMM_H, int(4 * v) + 10, 500.0)]
    if v:
        rows.append((SOFTMAX, int(v), 20.0 * v))
    return job(rank(0, kernels=kwin(rows)))


def b_optimizer(v: float, now: float) -> JobSnapshot:
    return job(rank(0, kernels=kwin([(ADDCDIV, 40, v * 100, "aten::addcdiv_"), (GEMM_H, 10, 2000)])))


def _spread_to_ratio(spread_pct: float) -> float:
    """d with (max - min) / mean = s for two ranks at 1 and 1 + d: s = d / (1 + d/2)."""
    s = spread_pct / 100
    return s / (1 - s / 2)


def b_uneven(v: float, now: float) -> JobSnapshot:
    d = _spread_to_ratio(v)
    w0 = kwin([(GEMM_H, 10, 1000.0), (ADD, 10, 500.0)])
    w1 = kwin([(GEMM_H, 10, 1000.0 * (1 + d)), (ADD, 10, 500.0)])
    # As merged from the ranks' cumulative tables after three windows each.
    merged = dataclasses.replace(merge_ranks({0: w0, 1: w1}), min_windows=3)
    return job(rank(0, kernels=w0), rank(1, kernels=w1), merged=merged)


def b_throttle(v: float, now: float) -> JobSnapshot:
    return job(rank(0, tel=telemetry(sm_clock_mhz=v * 20, sm_clock_max_mhz=2000.0, throttle=["sw_power_cap"],
                                     temp_c=84.0, power_w=500.0, power_limit_w=700.0)))


def b_util(v: float, now: float) -> JobSnapshot:
    return job(rank(0, fl=flops(mfu=v / 100), tel=telemetry(gpu_util=100.0, tensor_active=8.0)))


def b_memfull(v: float, now: float) -> JobSnapshot:
    return job(rank(0, tel=telemetry(mem_used=v / 100 * 80 * GIB, mem_total=80 * GIB)))


def b_uncounted(v: float, now: float) -> JobSnapshot:
    """An uncounted op (3 calls) whose FLOP-like size is ``v`` % of the step: size ÷ (1e12 + size)."""
    size = round(1e12 * v / (100.0 - v))
    fl = flops(uncounted={"aten::my_custom_op": 3}, uncounted_size={"aten::my_custom_op": size})
    return job(rank(0, fl=fl), fl=fl)


def b_estimate(v: float, now: float) -> JobSnapshot:
    fl = flops(model=1e12 * (1 - v / 100), estimated=1e12)
    return job(rank(0, fl=fl), fl=fl)


def b_attn_note(v: float, now: float) -> JobSnapshot:
    return job(rank(0, kernels=kwin([(FLASH, 4, v * 10), (GEMM_H, 10, (100 - v) * 10)])), fl=flops())


def b_pipeline(v: float, now: float) -> JobSnapshot:
    """Two pipeline stages around a mean of 1 TFLOP and 0.1 s of compute per step: stage 1 does
    ``v`` % more than the mean (and computes that much longer), stage 0 as much less."""
    stages = tuple(StageView(pp_rank=p, stages=(p,), ranks=(p,), model_flops_per_step=1e12 * (1 + sign * v / 100),
                             flops_share=(1 + sign * v / 100) / 2, stage_time_s=0.1 * (1 + sign * v / 100),
                             step_time_s=0.2) for p, sign in ((0, -1), (1, 1)))
    return dataclasses.replace(job(rank(0), rank(1)), stages=stages)


def b_rank_conflict(v: float, now: float) -> JobSnapshot:
    """``v`` other processes (on node2) claiming rank 0 besides node1's pid 4000."""
    r0 = rank(0, step=12, hist=history(12))
    others = [dataclasses.replace(r0, host="node2", pid=4100 + i, step=10) for i in range(int(v))]
    if not others:
        return job(r0)
    rows = [r0, *others]
    rows = [dataclasses.replace(r, conflict=tuple(Claimant(o.host, o.pid) for o in rows if o is not r))
            for r in rows]
    return job(*rows)


def b_relay_silent(v: float, now: float) -> JobSnapshot:
    """Ranks 0 and 1 heard and stepping; ``v`` more (2, 3 ...) unheard behind relay node2, silent
    for 12 s (RankSnapshot.cut, as flowtop.monitor.relays marks them)."""
    heard = [rank(r, step=12, hist=history(12)) for r in range(2)]
    cut = [dataclasses.replace(rank(2 + i, step=10, hist=history(10)), host="node2", status="stale",
                               cut=RelayCut("node2", now - 12.0)) for i in range(int(v))]
    return job(*heard, *cut)


def b_relay_closed(v: float, now: float) -> JobSnapshot:
    """As b_relay_silent, the relay closed (it said so) and its ranks not back through another."""
    heard = [rank(r, step=12, hist=history(12)) for r in range(2)]
    cut = [dataclasses.replace(rank(2 + i, step=10, hist=history(10)), host="node2", status="stale",
                               cut=RelayCut("node2", None)) for i in range(int(v))]
    return job(*heard, *cut)


def small_hang_rules() -> tuple[Rule, ...]:
    """The table with a 0.5 s hang floor, so tests use small times."""
    out = []
    for r in RULES:
        if r.id.startswith("hang"):
            r = dataclasses.replace(r, params={**r.params, "floor_s": 0.5})
        out.append(r)
    return tuple(out)


@dataclass(frozen=True)
class Case:
    """One rule's test case: measure values and the exact hint expected just above threshold."""

    rule: str
    build: Builder
    above: float  # just beyond the threshold: fires
    mid: float | None  # between clear and threshold: does not fire, does not clear (None: no gap)
    low: float  # past the clear value: quiet, clears
    target: str
    summary: str
    evidence: dict[str, Any]
    engine: Callable[[], HintEngine] = HintEngine


CASES: tuple[Case, ...] = (
    Case("relay_silent", b_relay_closed, 1.0, None, 0.0, "",
         "1 rank unheard behind relay node2 (closed; rank 2) while the other 2 step on: they may "
         "still train; the job's MFU, FLOP/s and tokens/s are over the heard ranks",
         {"unheard_ranks": 1.0, "heard_ranks": 2, "stepping_ranks": 2, "hosts": ["node2"], "silent_s": None,
          "threshold_n": 0.5, "relays": [{"host": "node2", "state": "closed", "ranks": [2]}]}),
    Case("rank_conflict", b_rank_conflict, 1.0, None, 0.0, "rank 0",
         "2 processes claim rank 0 of job job1 (node1 pid 4000, node2 pid 4100): shown as separate "
         "rows, each counted in the job's totals",
         {"other_processes": 1.0, "processes_n": 2, "pids": [4000, 4100], "hosts": ["node1", "node2"],
          "threshold_n": 0.5, "window_steps": 10}),
    Case("input_wait", b_input_wait, 6.0, 4.0, 2.0, "rank 0", "rank 0 waits for input 6 % of each step",
         {"input_wait_pct": 6.0, "threshold_pct": 5.0, "window_steps": 10, "input_wait_s_per_step": 0.006}),
    Case("straggler", b_straggler, 12.0, 7.0, 3.0, "rank 2",
         "rank 2 is 12 % slower than the other ranks by median step time over the same 20 steps "
         "(0.112 s vs their median 0.1 s) since step 1",
         {"slower_pct": 12.0, "basis": "step_time", "step_time_s": 0.112, "others_step_time_s": 0.1,
          "window_steps": 20, "since_step": 1, "threshold_pct": 10.0}),
    Case("step_spikes", b_spikes, 12.0, 7.0, 3.0, "",
         "12 % of the last 200 steps' time went to slow steps (3 of them, up to 1.24 s; a step usually "
         "takes 0.1 s): FLOP/s and MFU, taken over the median step, leave that time out",
         {"spike_pct": 12.0, "spikes": 3, "max_step_s": (0.9 + 0.197 * 12) / (3 * 0.88), "median_step_time_s": 0.1,
          "window_steps": 200, "rank": 0, "threshold_pct": 10.0}),
    Case("hang_rank", b_hang_rank, 1.2, 0.8, 0.3, "rank 1",
         "rank 1 has not finished a step for 1 s (a step usually takes 0.1 s); last step 10",
         {"stalled_x": 1.2, "stalled_s": 1.2, "limit_s": 1.0, "last_step": 10, "threshold_x": 1.0},
         engine=lambda: HintEngine(small_hang_rules())),
    Case("hang_all", b_hang_all, 1.2, 0.8, 0.3, "",
         "all 2 ranks stopped at step 10: no step for 1 s (a step usually takes 0.1 s)",
         {"stalled_x": 1.2, "stalled_s": 1.2, "limit_s": 1.0, "ranks_n": 2, "last_step": 10},
         engine=lambda: HintEngine(small_hang_rules())),
    Case("comm_exposed", b_comm, 11.0, 9.0, 7.0, "rank 0",
         "rank 0 spends 11 % of the step in communication kernels, only 20 % of that overlapped with compute",
         {"comm_pct": 11.0, "overlap_pct": 20.0, "comm_us_per_step": 1100.0, "threshold_pct": 10.0}),
    Case("launch_bound", b_launch, 45.0, 55.0, 65.0, "rank 0",
         "rank 0 GPU is busy only 45 % of the step; 90 % of its 200 kernels per step run shorter than a launch takes",
         {"busy_pct": 45.0, "short_kernel_pct": 90.0, "launches_per_step": 200.0, "threshold_pct": 50.0}),
    Case("memory_bound", b_memory, 51.0, 45.0, 35.0, "rank 0",
         "rank 0: 51 % of GPU time goes to memory-bound kernels (elementwise 51 %)",
         {"memory_pct": 51.0, "memory_us_per_step": 510.0, "kernel_us_per_step": 1000.0}),
    Case("fp32_matmul", b_fp32, 11.0, 7.0, 3.0, "rank 0",
         "rank 0 runs matmuls in plain fp32 (11 % of matmul time; by kernel names): the tensor cores sit idle",
         {"fp32_gemm_pct": 11.0, "fp32_gemm_us_per_step": 110.0, "dtype": "tf32",
          "fp32_kernel": "ampere_sgemm_128x64_tn"}),
    Case("attention_unfused", b_attention, 2.0, 1.0, 0.0, "rank 0",
         "rank 0 computes attention unfused: 2 softmax kernels per step between matmuls and no fused attention kernel",
         {"softmax_calls_per_step": 2.0, "attention_calls_per_step": 0.0, "gemm_per_softmax": 9.0,
          "threshold_calls": 1.0}),
    Case("optimizer_unfused", b_optimizer, 6.0, 4.5, 3.0, "rank 0",
         "rank 0: the optimizer takes 6 % of the step in 40 small kernels (not fused)",
         {"optimizer_pct": 6.0, "optimizer_calls_per_step": 40.0, "fused_calls_per_step": 0.0}),
    Case("uneven_kernel", b_uneven, 22.0, 17.0, 10.0, GEMM_H,
         f"kernel {GEMM_H} takes 1247 µs on rank 1 but 1000 µs on rank 0 (spread 22 % of its mean)",
         {"spread_pct": 22.0, "slowest_rank": 1, "fastest_rank": 0, "min_us": 1000.0}),
    Case("throttling", b_throttle, 85.0, 93.0, 97.0, "rank 0",
         "rank 0 GPU is throttled to 85 % of its max SM clock (1700 of 2000 MHz) by sw_power_cap",
         {"clock_pct": 85.0, "sm_clock_mhz": 1700.0, "power_thermal_reasons": 1, "threshold_pct": 90.0}),
    Case("util_vs_mfu", b_util, 25.0, 32.0, 40.0, "rank 0",
         "rank 0 shows GPU-Util 100 % but does only 25 % of the peak FLOP/s (MFU); tensor cores are "
         "active 8 % of the time: GPU-Util only says some kernel was running",
         {"mfu_pct": 25.0, "gpu_util_pct": 100.0, "tensor_active_pct": 8.0}),
    Case("memory_full", b_memfull, 91.0, 87.0, 80.0, "rank 0",
         "rank 0 GPU memory is 91 % full (72.8 of 80.0 GiB)",
         {"mem_used_pct": 91.0, "mem_total_gib": 80.0}),
    Case("uncounted_ops", b_uncounted, 2.0, 0.7, 0.3, "",
         "the FLOP count misses 1 op type(s) (aten::my_custom_op ×3), ≈2.0 % of the step's FLOPs (a size "
         "bound from shapes): MFU is understated",
         {"uncounted_pct": 2.0, "share_basis": "flop_size", "uncounted_calls": 3.0, "uncounted_types_n": 1,
          "uncounted_ops": {"aten::my_custom_op": 3}}),
    Case("estimate_mismatch", b_estimate, 12.0, 8.0, 5.0, "",
         "counted model FLOPs are 12 % below the model-shape estimate (6N+12LdT)",
         {"estimate_gap_pct": 12.0, "estimate_ratio": 0.88, "estimated_flops_per_step": 1e12}),
    Case("pipeline_imbalance", b_pipeline, 21.0, 15.0, 5.0, "",
         "pipeline stage 1 (pp rank 1, rank 1) computes 21 % more than the stages' mean (1.21TFLOP vs "
         "1.00TFLOP per step); its compute takes 121ms per step, the stages' mean 100ms: the other stages "
         "wait for it every micro-batch",
         {"heavier_pct": 21.0, "heaviest_pp_rank": 1, "heaviest_stages": [1], "heaviest_ranks": [1],
          "stage_flops_per_step": 1.21e12, "mean_stage_flops_per_step": 1e12, "stages_n": 2,
          "stage_time_s": 0.121, "mean_stage_time_s": 0.1, "threshold_pct": 20.0}),
    Case("attention_flops_note", b_attn_note, 2.0, 0.7, 0.3, "",
         "fused attention kernels take 2 % of GPU time; profiler-based FLOP counts (torch.profiler "
         "with_flops) count them as 0 FLOPs, flowtop counts them by formula",
         {"attention_pct": 2.0}),
)

#: Cases of a rule's alternative summary (Rule.variants): same tests, not one per rule.
VARIANT_CASES: tuple[Case, ...] = (
    Case("relay_silent", b_relay_silent, 1.0, None, 0.0, "",
         "1 rank unheard behind relay node2 (rank 2), silent for 12 s, while the other 2 step on: they may "
         "still train; the job's MFU, FLOP/s and tokens/s are over the heard ranks",
         {"unheard_ranks": 1.0, "heard_ranks": 2, "stepping_ranks": 2, "hosts": ["node2"], "silent_s": 12.0,
          "threshold_n": 0.5, "relays": [{"host": "node2", "state": "silent", "ranks": [2]}]}),
    Case("straggler", b_straggler_lead, 12.0, 7.0, 3.0, "rank 2",
         "rank 2 finishes its forward 12 ms after the others each step (12 % of the step); they wait "
         "for it in the gradient all-reduce",
         {"slower_pct": 12.0, "basis": "lead", "lead_s": 0.0225, "others_lead_s": 0.0105,
          "lead_lag_s": 0.012, "lag_pct_of_step": 12.0, "step_time_s": 0.1, "others_step_time_s": 0.1,
          "window_steps": 20, "since_step": 1, "threshold_pct": 10.0}),
    # A pace is said as one, never as step times (which the rank table shows: here equal).
    Case("straggler", b_straggler_pace, 12.0, 7.0, 3.0, "rank 2",
         "rank 2 reaches its steps 12 % slower than the other ranks: 0.112 s per step vs their median "
         "0.1 s, on the monitor's receive clock over its last 20 steps (2.24 s); median step times 0.1 s "
         "vs 0.1 s; since step 1",
         {"slower_pct": 12.0, "basis": "pace", "pace_s_per_step": 0.112, "others_pace_s_per_step": 0.1,
          "pace_steps": 20, "pace_span_s": 2.24, "step_time_s": 0.1, "others_step_time_s": 0.1,
          "window_steps": 20, "since_step": 1, "threshold_pct": 10.0}),
)
