"""The one adapter between ``flowtop.monitor.kernels`` and the kernel widgets.

Widgets render these small view records only (the kernel rows are the data side's
:class:`~flowtop.monitor.kernels.rows.KernelRow`, the type the hints read too); when the aggregate
module renames a field, the change is one line here or in :mod:`flowtop.monitor.kernels.rows`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.kernels.merge import CumulativeRow, JobKernelStats, RankSpread
from flowtop.monitor.kernels.rows import KernelRow, kernel_rows

# cuDNN's generated attention kernels put what they do (sdpa, flash fprop/bprop) between a long
# prefix and a long tuning suffix; an 80-column table cut at the end would show only the prefix.
_DISPLAY_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^cudnn_generated_fort_native_"), "cudnn_"),
    (re.compile(r"_(?:wgmma|knob)_.*$"), ""),
)


def display_name(short: str) -> str:
    """A kernel's short name made to fit a table column (the full name stays the key)."""
    for pattern, repl in _DISPLAY_RULES:
        short = pattern.sub(repl, short)
    return short


@dataclass(frozen=True)
class WindowView:
    """One captured kernel window of a rank."""

    device: str  # "cuda" | "cpu"
    window: int | None
    step: int | None
    step_us: float
    rows: tuple[KernelRow, ...]
    categories: tuple[tuple[str, float], ...]  # (category, µs), largest first
    busy_us: float
    idle_us: float
    comm_us: float
    comm_overlap_us: float
    launches: int | None
    short_kernels: int | None
    short_note: str
    idle_gaps: tuple[tuple[float, float, tuple[str, ...]], ...]  # (start µs, length µs, host ops meanwhile)
    step_basis: str = "host"  # "device": the step is the device work's span (GPU behind the host)


@dataclass(frozen=True)
class JobKernelView:
    """Kernels of a job, merged over the ranks that sent a window."""

    ranks: tuple[int, ...]
    rows: tuple[RankSpread, ...]  # the merge's rows as they are (max_rank: the slowest)


def window_view(stats: KernelWindowStats | None,
                cumulative: Sequence[CumulativeRow] | None = None) -> WindowView | None:
    """View of a rank's latest window and its cumulative rows (``RankSnapshot.kernels`` and
    ``kernels_cumulative``)."""
    if stats is None:
        return None
    a = stats.anatomy
    return WindowView(
        device=stats.device,
        window=stats.window,
        step=stats.step,
        step_us=stats.step_us,
        rows=kernel_rows(stats, cumulative),
        categories=tuple((c.category, c.total_us) for c in stats.categories),
        busy_us=a.busy_us,
        idle_us=a.idle_us,
        comm_us=a.comm_us,
        comm_overlap_us=a.comm_overlap_us,
        launches=a.launches,
        short_kernels=a.short_kernels,
        short_note=a.short_note,
        idle_gaps=tuple((g.start_us, g.dur_us, tuple(g.host_ops)) for g in a.gaps),
        step_basis=a.step_basis,
    )


def job_view(merged: JobKernelStats | None) -> JobKernelView | None:
    """View of a job's ``merge.JobKernelStats``."""
    if merged is None:
        return None
    return JobKernelView(ranks=tuple(merged.ranks), rows=merged.kernels)
