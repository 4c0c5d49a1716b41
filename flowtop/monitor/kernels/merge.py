"""Kernel windows across ranks (who runs a kernel slower) and over time (a cumulative table).

Split from :mod:`flowtop.monitor.kernels.aggregate`, which builds one window's table; see its docstring
for the definitions. No Textual here.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Sequence, TypeVar

from flowtop.monitor.compact import PairSeq
from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.kernels.table import ColumnRecords, KernelTable

_T = TypeVar("_T")

# merge_ranks flags a kernel when its per-rank time varies by ≥ 20 % of its mean and the
# difference is ≥ 1 % of the mean step: starting points, to be tuned with evidence.
FLAG_SPREAD = 0.2
FLAG_STEP_FRACTION = 0.01
#: ... and, where the ranks' figures are means over windows, when the difference is at least this
#: many standard errors of it (the two ranks' window-to-window scatter): identical CPU ranks of a
#: gloo demo showed spreads of 21-157 % in host operators (one window's preemption inflating an
#: operator's time on one rank), none of them systematic.
FLAG_SIGMAS = 4.0


# --- across ranks ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RankSpread:
    """One kernel's time in each rank's window."""

    name: str
    short: str
    category: str
    #: (rank, µs) of every rank of the merge, in its ``ranks`` order: tuple-like (compares equal to
    #: the tuple of pairs) over the merge's ranks and a column of times (compact.PairSeq).
    per_rank_us: Sequence[tuple[int, float]]
    mean_us: float
    min_us: float
    max_us: float
    min_rank: int
    max_rank: int
    ratio: float | None  # max / min (None when some rank did not run it)
    spread: float  # (max - min) / mean
    flagged: bool
    #: Standard error of max − min from the two ranks' window-to-window scatter (0: one window
    #: each, or none: unknown).
    noise_us: float = 0.0


@dataclass(frozen=True)
class JobKernelStats:
    """Kernels of a job's ranks, the most uneven (max − min µs) first."""

    ranks: tuple[int, ...]
    mean_step_us: float
    kernels: tuple[RankSpread, ...]
    #: Fewest windows behind any rank's figures (1 for a single-window merge).
    min_windows: int = 1


@dataclass(frozen=True, slots=True)
class _RankKernels:
    """One rank's kernels as :func:`_merge` compares them: columns, a kernel at one position in
    each (a window's or a cumulative table's own columns where it has them: no row objects)."""

    names: Sequence[str]
    shorts: Sequence[str]
    categories: Sequence[str]
    us: Sequence[float]  # its time in the rank's window (a mean window's, cumulative)


def merge_ranks(windows: Mapping[int, KernelWindowStats]) -> JobKernelStats:
    """Compare one window per rank: a kernel absent from a rank counts 0 µs there."""
    steps = {r: w.step_us for r, w in windows.items()}
    return _merge(steps, {r: _window_kernels(w) for r, w in windows.items()})


def _window_kernels(w: KernelWindowStats) -> _RankKernels:
    """A window's kernels as columns: its KernelTable's own, else made of its hand-made rows."""
    k = w.kernels
    if isinstance(k, KernelTable):
        return _RankKernels(k.names, k.shorts, k.categories, k.total_us)
    return _RankKernels([s.name for s in k], [s.short for s in k], [s.category for s in k], [s.total_us for s in k])


def merge_cumulative(tables: Mapping[int, "CumulativeKernels"]) -> JobKernelStats:
    """Compare ranks by their *mean window* over every window seen.

    Ranks are sampled at different steps; one window per rank lets a passing hiccup
    (another process on the core, a page fault storm) look like uneven work. Means
    over all windows keep what is systematic."""
    steps: dict[int, float] = {}
    rows: dict[int, _RankKernels] = {}
    errors: dict[int, dict[str, float]] = {}
    for r, t in tables.items():
        if t.windows <= 0:
            continue
        n = t.windows
        steps[r] = t.step_us / n
        c = t.rows()  # its columns: no row objects for every rank's every kernel
        rows[r] = _RankKernels(c.names, c.shorts, c.categories, [us / n for us in c.cum_us])
        if n > 1:  # squared standard error of each mean: sample variance over the windows ÷ n
            errors[r] = {name: max(0.0, sq - us * us / n) / (n - 1) / n
                         for name, us, sq in zip(c.names, c.cum_us, c.cum_sq_us)}
    merged = _merge(steps, rows, errors)
    counts = [t.windows for t in tables.values() if t.windows > 0]
    return dataclasses.replace(merged, min_windows=min(counts) if counts else 0)


def _merge(steps: Mapping[int, float], per_rank: Mapping[int, _RankKernels],
           errors: Mapping[int, Mapping[str, float]] | None = None) -> JobKernelStats:
    ranks = tuple(sorted(per_rank))
    mean_step = sum(steps[r] for r in ranks) / len(ranks) if ranks else 0.0
    # A kernel's short name and category as the first rank that ran it says them.
    shorts: dict[str, str] = {}
    categories: dict[str, str] = {}
    # Each kernel's time on every rank, a column in ``ranks`` order (0.0: a rank that did not run
    # it), kept as its row's per_rank_us: a (rank, µs) tuple a rank and kernel was ~88 bytes, 3.3 KB
    # a rank of a 4,096-rank job's merge (bench/ingest.py --memory), 8 here.
    times: dict[str, array] = {}
    zeros = bytes(8 * len(ranks))
    for i, r in enumerate(ranks):
        k = per_rank[r]
        for name, short, category, us in zip(k.names, k.shorts, k.categories, k.us):
            column = times.get(name)
            if column is None:
                shorts[name] = short
                categories[name] = category
                column = times[name] = array("d", zeros)
            column[i] = us
    rows = []
    for name, short in shorts.items():
        column = times[name]
        per = PairSeq(ranks, column)
        lo_rank, lo_us = min(per, key=lambda p: (p[1], p[0]))
        hi_rank, hi_us = max(per, key=lambda p: (p[1], -p[0]))
        mean = sum(column) / len(ranks)
        spread = (hi_us - lo_us) / mean if mean > 0 else 0.0
        # a kernel a rank never ran has no scatter there (0)
        noise = math.sqrt(sum(errors.get(r, {}).get(name, 0.0) for r in (hi_rank, lo_rank))) if errors else 0.0
        rows.append(RankSpread(
            name=name, short=short, category=categories[name], per_rank_us=per, mean_us=mean,
            min_us=lo_us, max_us=hi_us, min_rank=lo_rank, max_rank=hi_rank,
            ratio=hi_us / lo_us if lo_us > 0 else None, spread=spread,
            flagged=len(ranks) > 1 and spread >= FLAG_SPREAD and hi_us - lo_us >= FLAG_STEP_FRACTION * mean_step
            and hi_us - lo_us >= FLAG_SIGMAS * noise,
            noise_us=noise,
        ))
    rows.sort(key=lambda s: (-(s.max_us - s.min_us), s.name))
    return JobKernelStats(ranks, mean_step, tuple(rows))


# --- over time --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)  # a table holds them as columns (CumulativeTable), made as read
class CumulativeRow:
    """A kernel's totals over every window seen so far."""

    name: str
    short: str
    category: str
    cum_us: float
    cum_calls: int
    windows_seen: int
    share: float  # cum_us ÷ the summed step time of all windows
    cum_sq_us: float = 0.0  # Σ over the windows of the window's time squared (µs²): its scatter


class CumulativeTable(ColumnRecords[CumulativeRow]):
    """A rank's cumulative table, largest cumulative time first, as columns: an immutable sequence
    of :class:`CumulativeRow` made as they are read (the kernel screen reads one rank's).

    Every rank holds one, and its snapshot views share it: as a tuple of rows it was ~40 objects
    a rank for the garbage collector to walk at each full collection (flowtop.monitor.gcpolicy);
    as columns it is the table, three tuples of names (untracked once a collection has seen them:
    they hold only strings) and five arrays."""

    __slots__ = ("names", "shorts", "categories", "cum_us", "cum_calls", "windows_seen", "share", "cum_sq_us")

    TYPECODES = ("", "", "", "d", "q", "q", "d", "d")
    names: tuple[str, ...]
    shorts: tuple[str, ...]
    categories: tuple[str, ...]
    cum_us: array[float]
    cum_calls: array[int]
    windows_seen: array[int]
    share: array[float]
    cum_sq_us: array[float]

    def __init__(self, rows: Iterable[CumulativeRow] = ()) -> None:
        self._fill(rows)

    def _make(self) -> type[CumulativeRow]:
        return CumulativeRow


class CumulativeKernels:
    """Accumulates windows like ``py-spy top``: the UI shows window % beside cumulative time.

    Distinct names are capped at :attr:`max_names`; past it the smallest totals are dropped
    (a long job with generated kernel names must not grow the monitor without bound). The table
    is the immutable :class:`CumulativeTable` that :meth:`rows` hands out (rebuilt at each window,
    which changes every row's share), so a snapshot's copy of the table costs no memory of its own.
    """

    def __init__(self, max_names: int = 10_000) -> None:
        self.max_names = max_names
        self.windows = 0
        self.step_us = 0.0
        # The rows sorted, and no dict by name beside them: 4,096 ranks hold a table each (a
        # dict of ~40 names is ~2 KB), and a name is looked up only when a window is folded in.
        self._sorted = _EMPTY

    def add(self, stats: KernelWindowStats) -> None:
        """Fold one window in."""
        self.windows += 1
        self.step_us += stats.step_us
        totals = _Totals(self._sorted)
        kernels = stats.kernels
        if isinstance(kernels, KernelTable):  # its columns: no KernelStat made for each row
            totals.fold(zip(kernels.names, kernels.shorts, kernels.categories, kernels.total_us, kernels.calls))
        else:  # a tuple of KernelStat made by hand
            totals.fold((k.name, k.short, k.category, k.total_us, k.calls) for k in kernels)
        self._sorted = totals.table(self.step_us, self.max_names)

    def get(self, name: str) -> CumulativeRow | None:
        """The row of one kernel name, if seen (a scan: for the odd lookup, not per row)."""
        names = self._sorted.names
        return self._sorted[names.index(name)] if name in names else None

    def rows(self) -> CumulativeTable:
        """All rows, largest cumulative time first (the same table until the next window)."""
        return self._sorted


class _Totals:
    """A rank's cumulative totals while one window is folded in: a list per column of
    :class:`CumulativeTable` (a kernel at the same position in each), its position by name in
    ``at``. Made from the rank's table and made into its next one at each window: between
    windows the rank holds only the immutable table (CumulativeKernels' docstring)."""

    __slots__ = ("at", "names", "shorts", "categories", "cum_us", "cum_calls", "windows_seen", "cum_sq_us")

    def __init__(self, table: CumulativeTable) -> None:
        self.names: list[str] = list(table.names)
        self.shorts: list[str] = list(table.shorts)
        self.categories: list[str] = list(table.categories)
        self.cum_us: list[float] = table.cum_us.tolist()
        self.cum_calls: list[int] = table.cum_calls.tolist()
        self.windows_seen: list[int] = table.windows_seen.tolist()
        self.cum_sq_us: list[float] = table.cum_sq_us.tolist()
        self.at: dict[str, int] = {name: i for i, name in enumerate(self.names)}

    def fold(self, kernels: Iterable[tuple[str, str, str, float, int]]) -> None:
        """Add a window's kernels (name, short, category, total µs, calls: a row of its columns,
        unpacked at once) to the totals; a name not seen before is appended."""
        at, cum_us, cum_calls, seen, cum_sq = self.at, self.cum_us, self.cum_calls, self.windows_seen, self.cum_sq_us
        for name, short, category, us, calls in kernels:
            i = at.get(name)
            if i is None:
                at[name] = len(self.names)
                self.names.append(name)
                self.shorts.append(short)
                self.categories.append(category)
                cum_us.append(us)
                cum_calls.append(calls)
                seen.append(1)
                cum_sq.append(us * us)
            else:
                cum_us[i] += us
                cum_calls[i] += calls
                seen[i] += 1
                cum_sq[i] += us * us

    def table(self, step_us: float, max_names: int) -> CumulativeTable:
        """The totals as a table, largest cumulative time first (then by name), each share of
        ``step_us``; over ``max_names`` names, the smallest totals dropped down to 4/5 of it."""
        names, cum_us = self.names, self.cum_us
        order = sorted(range(len(names)), key=lambda i: (-cum_us[i], names[i]))
        if len(order) > max_names:
            del order[max_names * 4 // 5:]

        def column(values: Sequence[_T]) -> list[_T]:
            return [values[i] for i in order]

        table = CumulativeTable.__new__(CumulativeTable)
        table._set({
            "names": column(names), "shorts": column(self.shorts), "categories": column(self.categories),
            "cum_us": column(cum_us), "cum_calls": column(self.cum_calls), "windows_seen": column(self.windows_seen),
            "share": [cum_us[i] / step_us if step_us > 0 else 0.0 for i in order],
            "cum_sq_us": column(self.cum_sq_us),
        })
        return table


_EMPTY = CumulativeTable()
