"""Kernel top list, step anatomy, rank merge and cumulative table (exact numbers)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from flowtop.monitor.kernels.aggregate import (
    IdleGap,
    KernelWindowStats,
    aggregate,
    intersection_length,
    merge_intervals,
    union_length,
)
from flowtop.monitor.kernels.merge import (
    CumulativeKernels,
    CumulativeRow,
    CumulativeTable,
    merge_cumulative,
    merge_ranks,
)
from flowtop.monitor.kernels.table import KernelStat, KernelTable
from flowtop.monitor.kernels.chrome import load_trace
from flowtop.monitor.kernels.trace import CPU_OP, KERNEL, MEMSET, RUNTIME, KernelEvent, KernelWindow

NAMES = ("gemm_a", "nccl_allreduce", "elementwise_b", "cudaLaunchKernel", "aten::mm", "Memset (Device)")
G, NC, EL, RT, MM, MS = range(6)


def _window(gemm_second_us: float = 100.0, with_elementwise: bool = True) -> KernelWindow:
    ev = [
        KernelEvent(MM, CPU_OP, 40, 100, -1, -1, 4e9),
        KernelEvent(RT, RUNTIME, 50, 30, -1, 2, -1),  # launches the kernel at index 2
        KernelEvent(G, KERNEL, 100, 200, 7, MM, 4e9),
        KernelEvent(NC, KERNEL, 250, 200, 9, -1, -1),  # communication on its own stream
        KernelEvent(G, KERNEL, 400, gemm_second_us, 7, MM, -1),
    ]
    if with_elementwise:
        ev += [
            KernelEvent(RT, RUNTIME, 590, 10, -1, 6, -1),
            KernelEvent(EL, KERNEL, 600, 3, 7, -1, -1),  # shorter than its 10 µs launch call
            KernelEvent(MS, MEMSET, 700, 2, 7, -1, -1),  # no launch call: < 5 µs is short
            KernelEvent(EL, KERNEL, 800, 6, 7, -1, -1),  # no launch call, 6 µs: not short
        ]
    return KernelWindow(NAMES, tuple(ev), 1000.0, "cuda", step=42, window=3, cost_s=0.002)


def test_interval_helpers() -> None:
    assert merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4), (7, 7)]) == [(0, 4), (5, 6)]
    assert union_length([(0, 10), (5, 15), (20, 21)]) == 16
    assert intersection_length([(0, 10), (20, 30)], [(5, 25)]) == 10


def test_top_list() -> None:
    s = aggregate(_window())
    assert (s.device, s.step, s.window, s.step_us, s.cost_s) == ("cuda", 42, 3, 1000.0, 0.002)
    rows = [(k.name, k.category, k.calls, k.total_us, k.mean_us, k.share, k.flops, k.tflops, k.op) for k in s.kernels]
    assert rows == [
        # 4e9 FLOPs over the 200 µs of the call that carries them: 20 TFLOP/s
        ("gemm_a", "gemm", 2, 300.0, 150.0, 0.3, 4e9, 20.0, "aten::mm"),
        ("nccl_allreduce", "communication", 1, 200.0, 200.0, 0.2, None, None, ""),
        ("elementwise_b", "elementwise", 2, 9.0, 4.5, 0.009, None, None, ""),
        ("Memset (Device)", "memory", 1, 2.0, 2.0, 0.002, None, None, ""),
    ]
    assert [(c.category, c.calls, c.total_us, c.share, c.flops) for c in s.categories] == [
        ("gemm", 2, 300.0, 0.3, 4e9),
        ("communication", 1, 200.0, 0.2, None),
        ("elementwise", 2, 9.0, 0.009, None),
        ("memory", 1, 2.0, 0.002, None),
    ]


def test_anatomy() -> None:
    a = aggregate(_window()).anatomy
    # union over both streams: [100, 500] + 3 + 2 + 6 µs
    assert (a.step_us, a.busy_us, a.idle_us, a.busy_frac) == (1000.0, 411.0, 589.0, 0.411)
    # NCCL [250, 450] is hidden by the GEMMs over [250, 300] and [400, 450]
    assert (a.comm_us, a.comm_overlap_us, a.comm_overlap_frac) == (200.0, 100.0, 0.5)
    assert (a.launches, a.short_kernels, a.short_kernel_us) == (6, 2, 5.0)
    assert a.short_note.startswith("device time < its launch call (2 of 6 linked)")
    assert (a.flops, a.tflops) == (4e9, 4.0)
    assert a.gaps == (
        IdleGap(806.0, 194.0, ()),
        IdleGap(0.0, 100.0, ("aten::mm", "cudaLaunchKernel")),  # 60 µs and 30 µs of overlap
        IdleGap(500.0, 100.0, ("cudaLaunchKernel",)),
        IdleGap(702.0, 98.0, ()),
        IdleGap(603.0, 97.0, ()),
    )


def test_idle_never_negative_when_the_queue_runs_past_the_step() -> None:
    w = KernelWindow(("k",), (KernelEvent(0, KERNEL, 0, 1500, 7, -1, -1),), 1000.0, "cuda")
    a = aggregate(w).anatomy
    assert (a.busy_us, a.idle_us, a.gaps) == (1500.0, 0.0, ())


def test_cpu_window_busy_is_the_top_level_operators() -> None:
    ev = (
        KernelEvent(0, KERNEL, 0, 20, -1, 0, -1), KernelEvent(0, CPU_OP, 0, 100, -1, -1, -1),
        KernelEvent(1, KERNEL, 10, 80, -1, 1, 2e6), KernelEvent(2, CPU_OP, 150, 10, -1, -1, -1),
        KernelEvent(2, KERNEL, 150, 10, -1, 2, -1),
    )
    s = aggregate(KernelWindow(("aten::linear", "aten::addmm", "aten::relu"), ev, 200.0, "cpu"))
    a = s.anatomy
    assert (a.busy_us, a.idle_us, a.launches, a.short_kernels) == (110.0, 90.0, None, None)
    assert a.gaps == (IdleGap(100.0, 50.0, ()), IdleGap(160.0, 40.0, ()))
    assert [(k.name, k.total_us, k.tflops) for k in s.kernels] == [
        ("aten::addmm", 80.0, 2e6 / 80 / 1e6), ("aten::linear", 20.0, None), ("aten::relu", 10.0, None)]


def test_merge_ranks() -> None:
    merged = merge_ranks({1: aggregate(_window(gemm_second_us=400.0, with_elementwise=False)), 0: aggregate(_window())})
    assert merged.ranks == (0, 1) and merged.mean_step_us == 1000.0
    rows = [(r.name, r.per_rank_us, r.min_rank, r.max_rank, r.ratio, r.flagged) for r in merged.kernels]
    assert rows == [
        ("gemm_a", ((0, 300.0), (1, 600.0)), 0, 1, 2.0, True),
        ("elementwise_b", ((0, 9.0), (1, 0.0)), 1, 0, None, False),  # uneven, but 9 µs < 1 % of the step
        ("Memset (Device)", ((0, 2.0), (1, 0.0)), 1, 0, None, False),
        ("nccl_allreduce", ((0, 200.0), (1, 200.0)), 0, 0, 1.0, False),  # ties: the lowest rank
    ]
    gemm = merged.kernels[0]
    assert (gemm.mean_us, gemm.min_us, gemm.max_us, gemm.spread) == (450.0, 300.0, 600.0, pytest.approx(2 / 3))


def test_merge_cumulative_compares_mean_windows() -> None:
    # Rank 1 had one slow window (second gemm 400 µs instead of 100) among three; rank 0 none.
    # Per-window means: rank 0 gemm 300 µs, rank 1 (300 + 300 + 600) / 3 = 400 µs.
    steady, slow = CumulativeKernels(), CumulativeKernels()
    for _ in range(3):
        steady.add(aggregate(_window()))
    for g in (100.0, 100.0, 400.0):
        slow.add(aggregate(_window(gemm_second_us=g)))
    merged = merge_cumulative({0: steady, 1: slow})
    gemm = next(r for r in merged.kernels if r.name == "gemm_a")
    assert gemm.per_rank_us == ((0, 300.0), (1, 400.0))
    from flowtop.monitor.snapshot_json import jsonable  # exported as the pairs it stands for
    assert json.loads(json.dumps(jsonable(gemm.per_rank_us))) == [[0, 300.0], [1, 400.0]]
    assert gemm.spread == pytest.approx(100.0 / 350.0)  # the latest windows alone would say 2/3
    assert merged.mean_step_us == 1000.0
    assert merge_cumulative({0: CumulativeKernels()}).ranks == ()


def test_cumulative() -> None:
    cum = CumulativeKernels()
    cum.add(aggregate(_window()))
    cum.add(aggregate(_window(gemm_second_us=400.0, with_elementwise=False)))
    assert (cum.windows, cum.step_us) == (2, 2000.0)
    assert [(r.name, r.cum_us, r.cum_calls, r.windows_seen, r.share) for r in cum.rows()] == [
        ("gemm_a", 900.0, 4, 2, 0.45),
        ("nccl_allreduce", 400.0, 2, 2, 0.2),
        ("elementwise_b", 9.0, 2, 1, 0.0045),
        ("Memset (Device)", 2.0, 1, 1, 0.001),
    ]
    assert cum.get("gemm_a").short == "gemm_a" and cum.get("absent") is None


def test_cumulative_is_bounded() -> None:
    cum = CumulativeKernels(max_names=3)
    cum.add(aggregate(_window()))  # 4 names > 3: keep the largest 3 * 4 // 5 = 2
    assert [r.name for r in cum.rows()] == ["gemm_a", "nccl_allreduce"]


def _reference_fold(windows: list[KernelWindowStats], max_names: int) -> list[CumulativeRow]:
    """What CumulativeKernels' fold must give, row by row as records (the rule, not its speed)."""
    rows: dict[str, CumulativeRow] = {}
    step_us = 0.0
    for w in windows:
        step_us += w.step_us
        for k in w.kernels:
            was = rows.get(k.name, CumulativeRow(k.name, k.short, k.category, 0.0, 0, 0, 0.0, 0.0))
            rows[k.name] = dataclasses.replace(
                was, cum_us=was.cum_us + k.total_us, cum_calls=was.cum_calls + k.calls,
                windows_seen=was.windows_seen + 1, cum_sq_us=was.cum_sq_us + k.total_us * k.total_us)
        ordered = sorted(rows.values(), key=lambda r: (-r.cum_us, r.name))
        if len(ordered) > max_names:
            ordered = ordered[: max_names * 4 // 5]
        rows = {r.name: r for r in ordered}
    return [dataclasses.replace(r, share=r.cum_us / step_us) for r in rows.values()]


@pytest.mark.parametrize("as_tuple", [False, True])
def test_the_cumulative_fold_equals_the_rule_over_random_windows(as_tuple: bool) -> None:
    """Random windows of 1-12 of 16 names (ties in time included), folded in their columns (a
    KernelTable) or as a tuple of KernelStat made by hand; past max_names the smallest dropped."""
    rng = random.Random(3)
    windows = []
    for w in range(40):
        names = rng.sample([f"k{i:02d}" for i in range(16)], rng.randint(1, 12))
        stats = [KernelStat(n, n[:2], "gemm" if n < "k08" else "other", rng.randint(1, 9),
                            float(rng.choice([5, 10, 12.5, 40, rng.random() * 100])), 0.0, None, None, "")
                 for n in names]
        window = aggregate(_window())
        windows.append(dataclasses.replace(window, step_us=1000.0 + w,
                                           kernels=tuple(stats) if as_tuple else KernelTable(stats)))
    for max_names in (10_000, 10):
        cum = CumulativeKernels(max_names=max_names)
        for i, window in enumerate(windows):
            cum.add(window)
            assert list(cum.rows()) == _reference_fold(windows[: i + 1], max_names), (max_names, i)
        assert isinstance(cum.rows(), CumulativeTable) and cum.windows == 40


def test_merge_ranks_reads_a_window_made_by_hand_as_one_built() -> None:
    """A window's kernels as a KernelTable (aggregate's) or a tuple of KernelStat (made by hand):
    the same comparison."""
    built = {0: aggregate(_window()), 1: aggregate(_window(gemm_second_us=400.0, with_elementwise=False))}
    by_hand = {r: dataclasses.replace(w, kernels=tuple(w.kernels)) for r, w in built.items()}
    merged = merge_ranks(built)
    assert merge_ranks(by_hand) == merged and isinstance(built[0].kernels, KernelTable)
    gemm = next(k for k in merged.kernels if k.name == "gemm_a")
    assert (gemm.per_rank_us, gemm.min_rank, gemm.max_rank) == (((0, 300.0), (1, 600.0)), 0, 1)
    assert next(k for k in merged.kernels if k.name == "elementwise_b").per_rank_us == ((0, 9.0), (1, 0.0))


def test_a_tables_columns_are_all_its_slots() -> None:
    table = CumulativeTable.__new__(CumulativeTable)
    with pytest.raises(ValueError, match="are not its slots"):
        table._set({"names": ()})


def test_h200_anatomy() -> None:
    s = aggregate(load_trace(Path(__file__).parent / "data" / "h200-gpt-small-step.trace.json.gz"))
    a = s.anatomy
    # one stream: busy equals the summed kernel + memset time; the GPU idles 93 % of the profiled step
    assert a.busy_us == pytest.approx(884.4111328125 + 6.3994140625, abs=1e-6)
    assert a.launches == 208 and a.short_kernels == 189
    assert a.gaps[0].start_us == 0.0 and a.gaps[0].host_ops == ("aten::embedding", "aten::gather", "cudaLaunchKernel")
    assert sum(k.calls for k in s.kernels) == 208
    assert {c.category for c in s.categories} == {
        "elementwise", "gemm", "norm_softmax", "attention", "optimizer", "reduction", "memory"}


def test_gpu_bound_window_takes_the_device_span_as_its_step() -> None:
    """Seen on an H200: a 180 ms step queued by the host in 75 ms. Shares and busy are taken
    against the device work's span (this step's first kernel to its last), not the host time."""
    ev = (
        KernelEvent(MM, CPU_OP, 0, 50, -1, -1, -1),
        KernelEvent(G, KERNEL, 20_000, 100_000, 7, MM, 4e12),  # starts after the previous step's work
        KernelEvent(EL, KERNEL, 120_000, 50_000, 7, -1, -1),
        KernelEvent(EL, KERNEL, 180_000, 20_000, 7, -1, -1),  # 10 ms idle before it
    )
    s = aggregate(KernelWindow(NAMES, ev, 75_000.0, "cuda"))
    a = s.anatomy
    assert (a.step_basis, a.step_us, s.step_us) == ("device", 180_000.0, 180_000.0)
    assert a.busy_us == 170_000 and a.busy_frac == pytest.approx(170 / 180)
    assert [(k.name, k.share) for k in s.kernels] == [("gemm_a", pytest.approx(100 / 180)),
                                                      ("elementwise_b", pytest.approx(70 / 180))]
    assert a.tflops == pytest.approx(4e12 / 180_000 / 1e6)
    assert [(g.start_us, g.dur_us) for g in a.gaps] == [(170_000, 10_000)]  # none before the first kernel
    # a launch-bound window keeps the host step (device work inside it)
    host = aggregate(_window())
    assert (host.anatomy.step_basis, host.step_us) == ("host", 1000.0)


def test_work_past_the_host_step_end_moves_the_step_to_end_with_it() -> None:
    """Host step 1000 µs, one kernel from 100 to 1050 µs (launched last, it ran past the host's
    end, but its span is within a host step, so the GPU was not behind): the step is the 1000 µs
    ending at 1050 — busy 950, idle 50, the one gap at its start."""
    ev = (KernelEvent(G, KERNEL, 100, 950, 7, -1, -1),)
    a = aggregate(KernelWindow(NAMES, ev, 1000.0, "cuda", typical_step_us=1000.0)).anatomy
    assert (a.step_basis, a.step_us, a.busy_us, a.idle_us) == ("host", 1000.0, 950.0, 50.0)
    assert [(g.start_us, g.dur_us) for g in a.gaps] == [(50.0, 50.0)]
    assert a.busy_frac == 0.95 and a.busy_frac_typical == 0.95


def test_the_step_span_is_continuous_as_device_work_grows() -> None:
    """No jump between bases: with a 100 µs host step, work from 30 to 129 µs and from 30 to
    131 µs give a step of 100 and 101 µs (busy 99 %, then 100 %)."""
    def span(last: float) -> tuple[float, str, float]:
        ev = (KernelEvent(G, KERNEL, 30, last - 30, 7, -1, -1),)
        a = aggregate(KernelWindow(NAMES, ev, 100.0, "cuda")).anatomy
        return a.step_us, a.step_basis, round(a.busy_frac, 3)

    assert span(129.0) == (100.0, "host", 0.99)
    assert span(130.0) == (100.0, "host", 1.0)
    assert span(131.0) == (101.0, "device", 1.0)


def test_a_large_merge_holds_a_kernels_per_rank_times_as_a_column() -> None:
    """1,000 ranks × 4 kernels: a (rank, µs) tuple and a float per rank and kernel were 75 bytes
    (3.3 KB a rank of a 4,096-rank job's merge); a column of doubles is 8, the ranks shared."""
    import tracemalloc

    windows = {r: aggregate(_window(gemm_second_us=100.0 + r % 7)) for r in range(1000)}
    tracemalloc.start()
    try:
        merged = merge_ranks(windows)
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    pairs = len(merged.kernels) * len(merged.ranks)
    assert pairs == 4 * 1000 and kept / pairs < 16, kept / pairs
    gemm = merged.kernels[0]
    assert gemm.name == "gemm_a" and gemm.per_rank_us[:3] == ((0, 300.0), (1, 301.0), (2, 302.0))
    assert gemm.per_rank_us[999] == (999, 300.0 + 999 % 7) and len(gemm.per_rank_us) == 1000
    assert hash(gemm.per_rank_us) == hash(tuple((r, 300.0 + r % 7) for r in range(1000)))
    assert (gemm.min_rank, gemm.min_us, gemm.max_rank, gemm.max_us) == (0, 300.0, 6, 306.0)
