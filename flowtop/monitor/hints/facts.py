"""The one place that reads :mod:`flowtop.monitor.kernels` records for the hints.

The measures see a window as the small :class:`KernelFacts` below, its kernels as the window's own
table (:class:`~flowtop.monitor.kernels.table.KernelTable`: its rows are the ``KernelStat`` records,
made as a scan reads them, with the fields of :mod:`flowtop.monitor.kernels.rows` the hints read,
``low`` included; a per-rank loop reads its columns). A copy as ``KernelRow`` per kernel per rank
was ~40 objects a rank for the garbage collector to walk, held by the memo for the window's life.
If the aggregate module renames a field, the change is one line in :func:`kernel_facts` or in the
measures that read it. The job's comparison
across ranks they read as it is (``JobKernelStats``, rows ``RankSpread``: the job kernel screen
reads the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from flowtop.monitor.hints.base import IdentityMemo
from flowtop.monitor.kernels.aggregate import KernelTable, KernelWindowStats, WeakSlotted


@dataclass(frozen=True, slots=True)  # one a rank window, held by the memo below (a memo key too)
class KernelFacts(WeakSlotted):
    """What the hints need from one kernel window (totals over ``steps`` steps)."""

    device: str  # "cuda" | "cpu"
    steps: int
    step_us: float  # wall time of the window
    busy_us: float  # union of device-work intervals
    comm_us: float
    comm_overlap_us: float
    launches: int | None  # None on a CPU window
    short_kernels: int | None
    category_us: Mapping[str, float]
    rows: KernelTable  # the window's, largest time first (its columns for a hot loop)

    @property
    def kernel_us(self) -> float:
        """Summed device time of all kernels (streams running at once both count)."""
        return sum(self.category_us.values())


def kernel_facts(stats: KernelWindowStats | None) -> KernelFacts | None:
    """:class:`KernelFacts` of a rank's latest window (None without one); memoized per window."""
    return None if stats is None else _facts_memo(stats)


def _adapt_window(stats: KernelWindowStats) -> KernelFacts:
    """Adapter: ``flowtop.monitor.kernels.aggregate.KernelWindowStats`` -> :class:`KernelFacts`."""
    a = stats.anatomy
    # The profiler stretches host time (docs/design.md, "Overheads"), not device time: shares of the step
    # are taken against the unprofiled step when the probe measured one.
    step_us = float(a.typical_step_us or stats.step_us)
    return KernelFacts(
        device=str(stats.device),
        steps=1,  # a window is one profiled step
        step_us=step_us,
        busy_us=min(float(a.busy_us), step_us),
        comm_us=float(a.comm_us),
        comm_overlap_us=float(a.comm_overlap_us),
        launches=a.launches,
        short_kernels=a.short_kernels,
        category_us={c.category: float(c.total_us) for c in stats.categories},
        rows=stats.kernels if isinstance(stats.kernels, KernelTable) else KernelTable(stats.kernels),
    )


_facts_memo = IdentityMemo(_adapt_window)


def category_share_of_busy(f: KernelFacts | None, category: str) -> float | None:
    """A category's share of the summed kernel time (None without a window or kernels)."""
    if f is None or f.kernel_us <= 0:
        return None
    return f.category_us.get(category, 0.0) / f.kernel_us
