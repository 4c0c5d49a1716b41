"""The one adapter between ``flowtop.kernels.aggregate`` and the kernel widgets.

Widgets render these small view records only; when the aggregate module renames
a field, the change is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class KernelRow:
    """One kernel (or CPU operator) of a window, with its cumulative figures."""

    name: str
    short: str
    category: str
    calls: int
    total_us: float
    mean_us: float
    share: float | None  # of the step's wall time (0..1)
    tflops: float | None  # achieved TFLOP/s, when the window carries FLOPs
    cum_us: float | None  # cumulative time over all windows
    cum_calls: int | None
    cum_windows: int | None


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
    idle_gaps: tuple[tuple[float, float], ...]  # (start µs into the step, length µs)


@dataclass(frozen=True)
class JobKernelRow:
    """One kernel merged over the ranks of a job."""

    name: str
    short: str
    category: str
    per_rank_us: Mapping[int, float]
    mean_us: float
    min_us: float
    max_us: float
    spread: float  # (max - min) / mean; what the view sorts and marks by
    slowest_rank: int | None


@dataclass(frozen=True)
class JobKernelView:
    """Kernels of a job, merged over the ranks that sent a window."""

    ranks: tuple[int, ...]
    rows: tuple[JobKernelRow, ...]


def window_view(stats: Any, cumulative: Any = None) -> WindowView | None:
    """View of a ``KernelWindowStats`` (and the rank's cumulative table)."""
    if stats is None or isinstance(stats, WindowView):
        return stats
    raise NotImplementedError("waiting for flowtop.kernels.aggregate")


def job_view(merged: Any) -> JobKernelView | None:
    """View of a ``JobKernelStats``."""
    if merged is None or isinstance(merged, JobKernelView):
        return merged
    raise NotImplementedError("waiting for flowtop.kernels.aggregate")
