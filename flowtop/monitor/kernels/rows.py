"""The kernel-row type the kernel views read (no Textual).

A rank's latest window (:class:`~flowtop.monitor.kernels.aggregate.KernelWindowStats`) lists its kernels
as :class:`~flowtop.monitor.kernels.aggregate.KernelStat`; the rank's cumulative table
(:mod:`flowtop.monitor.kernels.merge`) holds each name's totals over every window. A
:class:`KernelRow` is one kernel of the window beside its cumulative figures: the kernel screen
shows and sorts it, built with :func:`kernel_rows`, so a renamed aggregate field changes here only.
The hints' measures scan the window's own ``KernelStat`` rows (the same names, ``low`` too; see
flowtop.monitor.hints.facts): they are held for every rank's window, these only for the screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.kernels.merge import CumulativeRow


@dataclass(frozen=True, slots=True)  # a row per kernel name per rank window: thousands
class KernelRow:
    """One kernel name (or CPU operator) of a rank's window, with its cumulative figures."""

    name: str
    short: str
    category: str
    calls: int
    total_us: float
    mean_us: float
    share: float  # of the step (0..1; the window's step, see flowtop.monitor.kernels.aggregate)
    tflops: float | None  # achieved TFLOP/s, when the window carries FLOPs
    op: str = ""  # the launching host operator with the most time ("" when unknown)
    cum_us: float | None = None  # time over every window seen (None: no cumulative table)
    cum_calls: int | None = None
    cum_windows: int | None = None  # windows the name appeared in

    @property
    def low(self) -> str:
        """The full name lower-cased, for the hints' pattern tests (their scans are memoized per
        window, so this runs a few times per row per window)."""
        return self.name.lower()


def kernel_rows(stats: KernelWindowStats,
                cumulative: Sequence[CumulativeRow] | None = None) -> tuple[KernelRow, ...]:
    """The rows of a window, largest time first (the window's order), each with its cumulative
    figures from ``cumulative`` (a rank's ``CumulativeKernels.rows()``, as snapshots hold it;
    None: no cumulative figures)."""
    by_name = {c.name: c for c in cumulative} if cumulative is not None else {}
    rows = []
    for k in stats.kernels:
        c = by_name.get(k.name)
        rows.append(KernelRow(
            name=k.name, short=k.short, category=k.category, calls=k.calls, total_us=k.total_us,
            mean_us=k.mean_us, share=k.share, tflops=k.tflops, op=k.op,
            cum_us=None if c is None else c.cum_us,
            cum_calls=None if c is None else c.cum_calls,
            cum_windows=None if c is None else c.windows_seen,
        ))
    return tuple(rows)
