"""Ranks' recent series aligned by step index, for the cross-rank measures (stragglers).

Every rank's history holds its last steps, and a straggler measure compares ranks at the step
indices all of them reported. Built as one ``{step: value}`` map per rank and a set intersection,
that cost ~130 µs per rank per evaluation (4,096 ranks: half a second). But a rank's recent steps
are nearly always one contiguous run of step numbers (the model keeps them increasing; the probe
sends every step), and then the value of step ``s`` is at index ``s - first``: the indices all
ranks reported are one range, found from each rank's first and last step, and each rank's values
there are one slice. :func:`align` takes that path when every rank's run is contiguous, and the
maps otherwise; both give the same steps and values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Callable

#: (steps, values) of one rank, equally long, steps increasing.
Series = tuple[Sequence[int], Sequence[Any]]


class Aligned:
    """The step indices every rank reported (``steps``, ascending) and, per rank, its values there
    (``rows[i][j]`` at ``steps[j]``). The rows are made when first read: the straggler measure
    aligns every rank's receive times for their common steps and reads the rows of its slow ranks
    only, most evaluations none (4,096 ranks' 256 times each: ~30 ms a measure)."""

    def __init__(self, steps: Sequence[int], rows: list[list[Any]] | Callable[[], list[list[Any]]]) -> None:
        self.steps = steps
        self._rows = rows
        self._columns: list[tuple[Any, ...]] | None = None

    @property
    def rows(self) -> list[list[Any]]:
        if callable(self._rows):
            self._rows = self._rows()
        return self._rows

    def columns(self) -> list[tuple[Any, ...]]:
        """Per step, every rank's value in rank order (transposed once, in C)."""
        if self._columns is None:
            self._columns = list(zip(*self.rows)) if self.rows else []
        return self._columns


def run_start(steps: Sequence[int]) -> int | None:
    """The first step of ``steps`` when they are one contiguous run (strictly increasing by 1,
    as the model keeps them increasing: first and last say it), else None."""
    n = len(steps)
    if not n:
        return None
    first = steps[0]
    return first if steps[-1] - first == n - 1 else None


def pairs_of(reached: Any) -> Series:
    """(steps, times) of a history's ``reached`` pairs: the two columns of a model's view
    (flowtop.monitor.compact.PairSeq) as they are, a tuple of pairs (built by hand) split."""
    if hasattr(reached, "a"):
        return reached.a, reached.b
    return tuple(p[0] for p in reached), tuple(p[1] for p in reached)


def flat(seq: Sequence[Any]) -> Sequence[Any]:
    """``seq``'s values as one sequence that indexes and slices in C: a model view's
    (flowtop.monitor.compact.ArraySeq) as one array (a copy, in C), anything else as it is. A
    measure that reads a view's values by index a dozen times a rank over thousands of ranks
    (the straggler's pace: its frame ends) made a Python call of each."""
    values = getattr(seq, "flat", None)
    return values() if values is not None else seq


def align(series: list[Series], last: int | None = None, above: float | None = None) -> Aligned:
    """The step indices every rank of ``series`` reported — with ``above``: where its value is
    greater than that (0.0: a lead the probe did not send) — the last ``last`` of them (all when
    None), and each rank's values there.

    Contiguous runs take the index path (with ``above``: when all their values in the common
    steps pass it; only those are read, not a rank's whole history); else maps."""
    starts = [s for s in (run_start(steps) for steps, _ in series) if s is not None]
    if len(starts) == len(series):
        lo = max(starts)
        hi = min(steps[-1] for steps, _ in series)
        common: Sequence[int] = range(lo, hi + 1) if hi >= lo else range(0)
        if last is not None:
            common = common[-last:] if last else range(0)
        if not common:
            return Aligned(common, [[] for _ in series])
        a, b = common[0], common[-1] + 1
        if above is None:
            return Aligned(common, lambda: [list(values[a - first:b - first])
                                            for (_, values), first in zip(series, starts)])
        rows = []
        for (_, values), first in zip(series, starts):
            row = list(values[a - first:b - first])
            # min() passes over a NaN that is not first; a NaN sum says one is there (the maps
            # leave it out: NaN > above is false)
            if not (min(row) > above and not math.isnan(sum(row))):
                break  # that rank filters some of these steps out: the maps say which
            rows.append(row)
        else:  # the filtered steps' last ``last`` are these when all of them pass (they are the newest)
            return Aligned(common, rows)
    maps = [{s: v for s, v in zip(steps, values) if above is None or v > above} for steps, values in series]
    shared = sorted(set.intersection(*(set(m) for m in maps))) if maps else []
    if last is not None:
        shared = shared[-last:] if last else []
    return Aligned(shared, [[m[s] for s in shared] for m in maps])


def values_at(steps: Sequence[int], series: Series, default: Any = 0.0) -> list[Any]:
    """One rank's values at ``steps`` (ascending), ``default`` where it has none."""
    own, values = series
    first = run_start(own)
    if first is not None and steps:
        lo, hi = steps[0], steps[-1]
        if lo >= first and hi - first < len(values) and isinstance(steps, range):
            return list(values[lo - first:hi - first + 1])
    m = dict(zip(own, values))
    return [m.get(s, default) for s in steps]


def medians_without(ordered: Sequence[float]) -> Callable[[float], float]:
    """For one sorted column of values: ``v -> median of the column with one occurrence of v
    removed`` (``v`` must be in it), in two comparisons instead of a search: only whether the
    removed value sits below or above the middle matters."""
    n = len(ordered) - 1
    if n <= 0:
        return lambda v: 0.0
    k = n // 2
    if n % 2:
        lo_mid, hi_mid = float(ordered[k]), float(ordered[k + 1])
        # removed below or at the middle: the median moves up to ordered[k + 1]
        return lambda v: lo_mid if v > lo_mid else hi_mid
    a, b, c = ordered[k - 1], ordered[k], ordered[k + 1]
    # the two middle values of the remaining n: (a, b) if v > b, (a, c) if a < v <= b, else (b, c)
    ab, ac, bc = (a + b) / 2.0, (a + c) / 2.0, (b + c) / 2.0
    return lambda v: ab if v > b else (ac if v > a else bc)


def medians_without_each(column: Sequence[float]) -> list[float]:
    """``[medians_without(sorted(column))(v) for v in column]``: each value's median of the others,
    the same comparisons written into one comprehension (no call a value: the straggler's leads
    ask it of every rank at every step of its window, 4,096 ranks × the window a measure)."""
    ordered = sorted(column)
    n = len(ordered) - 1
    if n <= 0:
        return [0.0 for _ in column]
    k = n // 2
    if n % 2:
        lo_mid, hi_mid = float(ordered[k]), float(ordered[k + 1])
        return [lo_mid if v > lo_mid else hi_mid for v in column]
    a, b, c = ordered[k - 1], ordered[k], ordered[k + 1]
    ab, ac, bc = (a + b) / 2.0, (a + c) / 2.0, (b + c) / 2.0
    return [ab if v > b else (ac if v > a else bc) for v in column]
