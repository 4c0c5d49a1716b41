"""ReplaySource: serves prepared snapshots to the UI (tests, demos, screenshots).

It implements :class:`flowtop.tui.app.SnapshotSource` without sockets: each
``snapshot()`` call returns the next snapshot of the list and then stays on the
last one, so a test controls exactly what the UI sees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from flowtop.monitor.snapshot import FlopsView, Hint, History, JobSnapshot, MonitorSnapshot, RankSnapshot, TelemetryView

if TYPE_CHECKING:
    from flowtop.monitor.kernels.aggregate import KernelWindowStats
    from flowtop.monitor.kernels.merge import CumulativeRow
    from flowtop.monitor.kernels.trace import KernelWindow


class ReplaySource:
    """A :class:`~flowtop.tui.app.SnapshotSource` over a fixed list of snapshots.

    Args:
        snapshots: What to serve, in order (at least one).
        advance: Move to the next snapshot on every ``snapshot()`` call; when
            False, only :meth:`advance` moves (tests that take several views of
            one snapshot).
    """

    def __init__(self, snapshots: Sequence[MonitorSnapshot], *, advance: bool = True) -> None:
        if not snapshots:
            raise ValueError("ReplaySource needs at least one snapshot")
        self.snapshots = tuple(snapshots)
        self.auto_advance = advance
        self.index = 0
        self._served = False
        self.started = False
        self.stopped = False
        #: Every ``request_kernels`` call, as (job, rank), for tests to inspect.
        self.kernel_requests: list[tuple[str, int]] = []

    async def start(self) -> None:
        """Nothing to open; remembers that it was called."""
        self.started = True

    def snapshot(self) -> MonitorSnapshot:
        """The current snapshot; the first call serves the first one."""
        if self.auto_advance and self._served:
            self.advance()
        self._served = True
        return self.snapshots[self.index]

    def advance(self) -> MonitorSnapshot:
        """Move to the next snapshot (stays on the last) and return it."""
        self.index = min(self.index + 1, len(self.snapshots) - 1)
        return self.snapshots[self.index]

    #: Stands in for a live monitor: a request is recorded (see kernel_requests).
    can_capture = True

    def request_kernels(self, job: str, rank: int) -> None:
        """Record the request (a replay cannot ask a rank for anything)."""
        self.kernel_requests.append((job, rank))

    async def stop(self) -> None:
        """Nothing to close; remembers that it was called."""
        self.stopped = True


# --- synthetic data ------------------------------------------------------------------
# A fixed, deterministic 2-rank job for tests, screenshots and ``--demo`` runs. The
# numbers are shaped like the H200 reference step (docs/design.md; GPT, bf16,
# peak 989.4 TF/s) but are made up: nothing here is a measurement.

H200_PEAK_BF16 = 989.4e12
_PEAK_SOURCE = "datasheet H200 SXM"


def _flops(step_s: float, model: float, executed: float, peak: float, tokens: int) -> FlopsView:

    return FlopsView(
        model_flops_per_step=model,
        executed_flops_per_step=executed,
        estimated_flops_per_step=model * 0.97,
        estimate_source="6N+12LdT (PaLM)",
        flops_per_s=model / step_s,
        executed_flops_per_s=executed / step_s,
        mfu=model / step_s / peak,
        hfu=executed / step_s / peak,
        peak_flops=peak,
        peak_source=_PEAK_SOURCE,
        dtype="bf16",
        attention_convention="full",
        flops_per_token=model / tokens,
        uncounted_ops={"aten::_fused_rms_norm": 8},
        counted_at_step=20,
    )


def synthetic_rank(
    rank: int,
    step: int,
    step_time_s: float,
    *,
    status: str = "live",
    tensor: float = 50.0,
    kernels: KernelWindowStats | None = None,
    kernels_cumulative: tuple[CumulativeRow, ...] | None = None,
    now: float | None = None,
) -> RankSnapshot:
    """One made-up rank of the synthetic job (values depend only on the arguments): heard from
    0.3 s (14 s when not live) before ``now``, the snapshot's time (default 1000 + step)."""
    now = 1000.0 + step if now is None else now

    tokens = 4096
    model = 2.0e12  # FLOPs per step
    f = _flops(step_time_s, model, model * 1.12, H200_PEAK_BF16, tokens)
    n = 16
    steps = tuple(range(step - n + 1, step + 1))
    wobble = tuple(1.0 + 0.04 * ((i * 7 + rank * 3) % 5 - 2) for i in range(n))
    # Keys and units as probe/telemetry/nvml.py and probe/telemetry/hostinfo.py send them (percent for activity).
    tel = TelemetryView(
        device={
            "name": "NVIDIA H200",
            "gpu_util": 100.0,
            "mem_used": 101_000_000_000,
            "mem_total": 143_771_000_000,
            "power_w": 612.0,
            "power_limit_w": 700.0,
            "sm_clock_mhz": 1980,
            "sm_clock_max_mhz": 1980,
            "temp_c": 61,
            "throttle": [],
            "sm_active": 84.0,
            "tensor_active": tensor,
            "dram_bw_util": 28.0,
            "nvlink_tx_bytes_s": None,
        },
        host={"proc_cpu_pct": 104.0, "rss_bytes": 9_800_000_000, "threads": 41, "workers": 4, "host_cpu_pct": 23.5},
        reasons={"nvlink_tx_bytes_s": "GPM metric not supported on this device"},
        received_at=now - 0.4,
    )
    return RankSnapshot(
        rank=rank,
        host=f"gpu-node-{rank // 8:02d}",
        pid=4100 + rank,
        local_rank=rank % 8,
        incarnation=0,
        device="cuda",
        status=status,
        step=step,
        step_time_s=step_time_s,
        device_time_s=step_time_s * 0.97,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step_time_s,
        input_wait_frac=0.012,
        heard_at=now - (0.3 if status == "live" else 14.0),
        lost_messages=0,
        dropped_messages=0,
        probe_overhead_frac=0.0021,
        flops=f,
        telemetry=tel,
        kernels=kernels,
        kernels_cumulative=kernels_cumulative,
        history=History(
            steps=steps,
            step_time_s=tuple(step_time_s * w for w in wobble),
            input_wait_s=tuple(step_time_s * 0.012 for _ in steps),
            mfu=tuple(f.mfu / w for w in wobble),  # type: ignore[operator]
            tensor_active=tuple(min(100.0, tensor / w) for w in wobble),
            power_w=tuple(612.0 * w for w in wobble),
            sm_clock_mhz=tuple(1980.0 - 15 * ((i + rank) % 3) for i in range(n)),
            reached=tuple((s, 1000.0 + s * step_time_s) for s in steps),
        ),
    )


def synthetic_hints() -> tuple[Hint, ...]:
    """Three hints of different severity, deliberately not in display order."""

    return (
        Hint(
            id="straggler", severity="warning", scope="rank", target="rank 1",
            summary="rank 1 is 15 % slower than the other ranks by median step time over the same 20 steps "
            "(0.0046 s vs their median 0.004 s) since step 12",
            evidence={"slower_pct": 15.0, "basis": "step_time", "step_time_s": 0.0046, "others_step_time_s": 0.004,
                      "window_steps": 20, "since_step": 12},
            action="check rank 1's input pipeline, clocks and neighbours",
            impact=0.15,
        ),
        Hint(
            id="info-attn", severity="info", scope="kernel", target="flash_bwd",
            summary="attention backward is 22 % of kernel time",
            evidence={"share": 0.22},
            action="expected for long sequences; consider FlashAttention-3 on Hopper",
            impact=0.05,
        ),
        Hint(
            id="gpu-idle", severity="critical", scope="job", target="",
            summary="GPU idle 45 % of the step",
            evidence={"busy_frac": 0.55, "launches": 44, "idle_gap_us": 954.0},
            action="larger batch, CUDA graphs or torch.compile to cut launches",
            impact=0.45,
        ),
    )


def synthetic_snapshot(
    step: int = 120,
    step_times: tuple[float, ...] = (0.0040, 0.0046),
    *,
    statuses: tuple[str, ...] = ("live", "live"),
    with_kernels: bool = True,
    job: str = "gpt-demo",
) -> MonitorSnapshot:
    """A deterministic one-job snapshot with ``len(step_times)`` ranks."""

    ranks = []
    for i, (t, st) in enumerate(zip(step_times, statuses)):
        kernels = cumulative = None
        if with_kernels:
            kernels, cumulative = synthetic_kernel_stats(i, step, t * 1e6)
        ranks.append(synthetic_rank(i, step - i, t, status=st, tensor=50.0 - 8.0 * i, kernels=kernels,
                                    kernels_cumulative=cumulative, now=1000.0 + step))
    rf = [r.flops for r in ranks if r.flops is not None]
    slowest = max(step_times)
    model = sum(f.model_flops_per_step or 0.0 for f in rf)
    executed = sum(f.executed_flops_per_step or 0.0 for f in rf)
    peak = sum(f.peak_flops or 0.0 for f in rf)
    job_flops = FlopsView(
        model_flops_per_step=model,
        executed_flops_per_step=executed,
        estimated_flops_per_step=model * 0.97,
        estimate_source="6N+12LdT (PaLM)",
        flops_per_s=model / slowest,
        executed_flops_per_s=executed / slowest,
        mfu=model / slowest / peak,
        hfu=executed / slowest / peak,
        peak_flops=peak,
        peak_source=_PEAK_SOURCE,
        dtype="bf16",
        attention_convention="full",
        flops_per_token=rf[0].flops_per_token,
    )
    merged = None
    if with_kernels:
        from flowtop.monitor.kernels.merge import merge_ranks

        merged = merge_ranks({r.rank: r.kernels for r in ranks if r.kernels is not None})
    live = [r.step for r in ranks if r.status == "live"] or [r.step for r in ranks]
    j = JobSnapshot(
        job=job,
        world_size=len(ranks),
        ranks=tuple(ranks),
        step=min(live),
        step_time_s=slowest,
        tokens_per_s=sum(r.tokens_per_s or 0.0 for r in ranks),
        flops=job_flops,
        status="running",
        hints=synthetic_hints(),
        kernels_merged=merged,
    )
    return MonitorSnapshot(taken_at=1000.0 + step, listen="tcp://127.0.0.1:5759", jobs=(j,), received=4000 + step,
                           rejected=0)


def synthetic_stream() -> list[MonitorSnapshot]:
    """Three snapshots of the synthetic job: steps advance, rank 1 then goes stale."""
    return [
        synthetic_snapshot(120, (0.0040, 0.0046)),
        synthetic_snapshot(121, (0.0039, 0.0048)),
        synthetic_snapshot(122, (0.0039, 0.0048), statuses=("live", "stale")),
    ]



# Kernel names as torch 2.11 / cuDNN / NCCL print them on an H200 (docs/design.md, "Kernel names").
_NAMES: tuple[str, ...] = (
    "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
    "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)"
    "::{lambda()#1}, at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
    "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)",
    "void at::native::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4> >()",
    "Memcpy HtoD (Pageable -> Device)",
    "aten::mm",
    "aten::_scaled_dot_product_cudnn_attention",
    "cudaLaunchKernel",
    "aten::embedding",
)
_GEMM, _GEMM_S, _ATT_F, _ATT_B, _NCCL, _GELU, _NORM, _ADAM, _H2D, _MM, _SDPA, _LAUNCH, _EMB = range(13)


def synthetic_window(rank: int, step: int, step_us: float) -> "KernelWindow":
    """A made-up 4-layer transformer step: compute on stream 7, all-reduce on stream 20.

    Rank 1's attention backward runs 1.5x longer and its input gap is wider, so the
    job view has a kernel to flag. Every kernel has a 6 µs launch call (kind 4).
    """
    from flowtop.monitor.kernels.trace import KernelEvent, KernelWindow

    events: list[KernelEvent] = []
    t = 20.0

    def run(name: int, dur: float, *, flops: float = -1.0, op: int = -1, kind: int = 0, gap: float = 4.0) -> None:
        nonlocal t
        events.append(KernelEvent(_LAUNCH, 4, t - 8.0, 6.0, -1, len(events) + 1, -1.0))
        events.append(KernelEvent(name, kind, t, dur, 7, op, flops))
        t += dur + gap

    run(_H2D, 18.0, kind=1, op=_EMB)
    t += 700.0 + 250.0 * rank  # input wait: the host is still embedding/loading
    slow = 1.5 if rank == 1 else 1.0
    for _ in range(4):  # forward
        run(_NORM, 11.0)
        run(_GEMM, 62.0, flops=2 * 4096 * 1024 * 3072, op=_MM)
        run(_ATT_F, 41.0, flops=4 * 4 * 16 * 1024 * 1024 * 64, op=_SDPA)
        run(_GEMM_S, 24.0, flops=2 * 4096 * 1024 * 1024, op=_MM)
        run(_GELU, 3.0)
    for layer in range(4):  # backward: twice the GEMM work, flash backward
        run(_GELU, 3.0)
        run(_GEMM, 118.0, flops=4 * 4096 * 1024 * 3072, op=_MM)
        run(_ATT_B, 96.0 * slow, flops=2.5 * 4 * 4 * 16 * 1024 * 1024 * 64, op=_SDPA)
        run(_GEMM_S, 47.0, flops=4 * 4096 * 1024 * 1024, op=_MM)
        run(_NORM, 19.0)
        if layer in (1, 3):  # bucketed all-reduce, half hidden behind the next layer
            events.append(KernelEvent(_NCCL, 0, t - 150.0, 340.0, 20, -1, -1.0))
    t += 190.0
    run(_ADAM, 84.0)
    return KernelWindow(_NAMES, tuple(events), max(step_us, t + 100.0), "cuda", step=step - 3, window=12)


def synthetic_kernel_stats(rank: int, step: int,
                           step_us: float) -> tuple[KernelWindowStats, tuple[CumulativeRow, ...]]:
    """(KernelWindowStats, cumulative table of 12 such windows) for one synthetic rank."""
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.merge import CumulativeKernels

    stats = aggregate(synthetic_window(rank, step, step_us))
    cumulative = CumulativeKernels()
    for _ in range(12):
        cumulative.add(stats)
    return stats, cumulative.rows()
