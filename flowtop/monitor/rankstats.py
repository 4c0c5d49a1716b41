"""Figures across a job's ranks: the percentile summary line and the rank map's cells.

Pure data (no Textual). The map lays rank numbers out row by row in a grid whose width is a
power of two, so with 8 (or 4, 16 ...) ranks per node every node keeps the same place in
every row and a slow node or a dead rack shows as a shape. When the grid does not fit, each
cell takes several consecutive ranks (a power of two of them) and shows the worst.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from flowtop.monitor.byjob import ByJob
from flowtop.monitor.rankview import JobContext, RankKey, job_context_of, rank_key
from flowtop.monitor.snapshot import ENDED, JobSnapshot, RankSnapshot

#: The percentiles of the summary line.
PERCENTILES = (0.0, 50.0, 95.0, 100.0)


def percentiles(values: Iterable[float], qs: Sequence[float] = PERCENTILES) -> tuple[float, ...] | None:
    """Linear-interpolated percentiles (numpy's default) of ``values``; None when empty."""
    xs = sorted(values)
    if not xs:
        return None
    out = []
    for q in qs:
        pos = (len(xs) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return tuple(out)


@dataclass(frozen=True)
class JobPercentiles:
    """p0/p50/p95/p100 across the running ranks (None where no rank has the figure)."""

    ranks: int  # ranks the figures are over
    step_time_s: tuple[float, ...] | None
    mfu: tuple[float, ...] | None
    input_wait_frac: tuple[float, ...] | None


_PERCENTILES: ByJob[JobPercentiles] = ByJob()  # the TUI's line and the exporter's, per snapshot


def job_percentiles(job: JobSnapshot | None) -> JobPercentiles:
    """Percentiles over the ranks still running (finished ranks would pull the figures toward
    their last steps) and heard (not cut off behind a silent relay). A stalled rank counts with
    MFU 0: it delivers nothing now. Remembered for the same snapshot object (flowtop.monitor.byjob)."""
    if job is None:
        return JobPercentiles(0, None, None, None)
    return _PERCENTILES.get(job.job, job, lambda: _job_percentiles(job))


def _job_percentiles(job: JobSnapshot) -> JobPercentiles:
    # Over the heard ranks: one unheard behind a silent relay has no figures now (JobSnapshot.unheard).
    ranks = [r for r in job.ranks if r.status not in ENDED and r.cut is None] or [
        r for r in job.ranks if r.cut is None]
    # One pass over the ranks for the three figures (twice a second over 4,096 ranks).
    times: list[float] = []
    mfus: list[float] = []
    waits: list[float] = []
    for r in ranks:
        if r.step_time_s is not None:
            times.append(r.step_time_s)
        mfu = r.mfu
        if mfu is not None:
            mfus.append(mfu)
        if r.input_wait_frac is not None:
            waits.append(r.input_wait_frac)
    return JobPercentiles(ranks=len(ranks), step_time_s=percentiles(times), mfu=percentiles(mfus),
                          input_wait_frac=percentiles(waits))


# --- rank map ---------------------------------------------------------------------------------

METRICS = ("mfu", "step_time", "input_wait", "status")
METRIC_LABEL = {"mfu": "MFU", "step_time": "step time", "input_wait": "input wait", "status": "status"}
#: The legend's short name of a metric and its unit ("step÷med": times the job's median).
METRIC_SHORT = {"mfu": "MFU %", "step_time": "step÷med", "input_wait": "wait %", "status": "status"}
#: Cell bins. Real bins run 0 (best) upward, so the worst of several ranks is the highest bin.
NO_VALUE = -1  # ranks present, none with the figure
MISSING = -2  # no rank with these numbers has said hello (a never-started rack is a hole)

#: Bin edges per value metric, best bin first: MFU (absolute, the table's 10 % steps; above
#: 100 % is an accounting error), step time relative to the job's median (a straggler is
#: relative), input wait share of the step (absolute).
_MFU_EDGES = (0.4, 0.3, 0.2, 0.1)  # >= edge: bin index; below the last: 4; above 100 %: 5
_STEP_EDGES = (1.05, 1.15, 1.5, 2.0)  # <= edge x median: bin index; above: 4
_WAIT_EDGES = (0.02, 0.10, 0.25, 0.50)  # < edge: bin index; else 4
#: Status bins: done, live, conflict, missing (never said hello), stalled, stale, stopped (a signal
#: ended it), failed. A cell shows its worst: a crash over a signal's stop, a stop over silence.
STATUS_BINS = {"done": 0, "live": 1, "conflict": 2, "missing": 3, "stalled": 4, "stale": 5, "stopped": 6, "failed": 7}
#: Legend labels per metric, one per bin from 0 up (the lower edge of each value bin).
LEGEND: dict[str, tuple[str, ...]] = {
    "mfu": ("≥40", "30", "20", "10", "<10", ">100"),
    "step_time": ("≤1.05", "1.15", "1.5", "2", ">2"),
    "input_wait": ("<2", "10", "25", "50", "≥50"),
    # hung: stalled (the filter's word too)
    "status": ("done", "live", "confl", "unseen", "hung", "stale", "stop", "failed"),
}


_MFU_UP = tuple(reversed(_MFU_EDGES))  # ascending, for bisect


def _binner(metric: str, ctx: JobContext) -> Callable[[RankSnapshot], int]:
    """Rank -> bin for ``metric``."""
    if metric == "status":
        def status_bin(r: RankSnapshot) -> int:
            if r.conflict and r.status == "live":
                return STATUS_BINS["conflict"]
            return STATUS_BINS.get(r.status, STATUS_BINS["stale"])
        return status_bin
    if metric == "mfu":
        top = len(_MFU_UP)
        bisect_right = bisect.bisect_right

        def mfu_bin(r: RankSnapshot) -> int:  # above 100 %: 5; else by the edges
            mfu = r.mfu
            if mfu is None:
                return NO_VALUE
            return 5 if mfu > 1.0 else top - bisect_right(_MFU_UP, mfu)
        return mfu_bin
    if metric == "input_wait":
        def wait_bin(r: RankSnapshot) -> int:
            w = r.input_wait_frac
            return NO_VALUE if w is None else next((i for i, e in enumerate(_WAIT_EDGES) if w < e), 4)
        return wait_bin
    if metric != "step_time":
        raise ValueError(f"unknown map metric {metric!r}")
    median = ctx.median_step_s

    def step_bin(r: RankSnapshot) -> int:
        if r.cut is not None:
            return NO_VALUE  # unheard behind a silent relay: not known to be slow, only unheard
        if r.status in ("stalled", "stale"):
            return 4  # no step at all: the slowest there is
        if r.step_time_s is None or not median:
            return NO_VALUE
        ratio = r.step_time_s / median
        return next((i for i, e in enumerate(_STEP_EDGES) if ratio <= e), 4)

    return step_bin


@dataclass(frozen=True)
class MapLayout:
    """How rank numbers map to cells and cells to characters.

    ``half`` cells are half a character tall (▀ with a foreground and a background colour:
    two rows of cells per text row); otherwise a cell is two characters wide, one row tall,
    for jobs small enough to afford it."""

    slots: int  # rank numbers laid out (0 .. slots-1)
    per_cell: int  # consecutive rank numbers per cell (a power of two)
    width: int  # cells per row (a power of two)
    cell_rows: int  # rows of cells
    half: bool

    @property
    def cells(self) -> int:
        return math.ceil(self.slots / self.per_cell) if self.slots else 0

    @property
    def text_size(self) -> tuple[int, int]:
        """(columns, text rows) the grid takes."""
        if self.half:
            return self.width, math.ceil(self.cell_rows / 2)
        return self.width * 2, self.cell_rows

    def cell_of_rank(self, rank: int) -> int:
        return rank // self.per_cell


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def map_layout(slots: int, cols: int, rows: int) -> MapLayout:
    """The layout of ``slots`` rank numbers in ``cols`` x ``rows`` characters: the fewest ranks
    per cell that fit, as square as the space allows (else as wide as it allows)."""
    cols, rows = max(1, cols), max(1, rows)
    if slots <= 0:
        return MapLayout(0, 1, 1, 0, False)
    square = _pow2_ceil(math.ceil(math.sqrt(slots)))
    wide = _pow2_floor(cols // 2) if cols >= 2 else 0
    for width in (min(square, wide), wide):  # two characters per cell, one row tall
        if width and math.ceil(slots / width) <= rows:
            return MapLayout(slots, 1, width, math.ceil(slots / width), False)
    per_cell = 1
    while True:
        cells = math.ceil(slots / per_cell)
        for width in (min(_pow2_ceil(math.ceil(math.sqrt(cells))), _pow2_floor(cols)), _pow2_floor(cols)):
            cell_rows = math.ceil(cells / width)
            if math.ceil(cell_rows / 2) <= rows:
                return MapLayout(slots, per_cell, width, cell_rows, True)
        per_cell *= 2


@dataclass(frozen=True)
class RankGrid:
    """One map frame: a bin per cell, and per cell the rank a cursor there selects (its worst)."""

    layout: MapLayout
    metric: str
    job: str
    bins: tuple[int, ...]
    ranks: tuple[RankSnapshot | None, ...]  # the picked rank per cell

    def key_at(self, cell: int) -> RankKey | None:
        """The key of the rank cell ``cell`` selects (None: no rank there)."""
        r = self.ranks[cell]
        return rank_key(self.job, r) if r is not None else None


_SLOTS: ByJob[int] = ByJob()  # map_slots per snapshot


def map_slots(job: JobSnapshot | None) -> int:
    """Rank numbers the map lays out: the world size, or more if higher ranks showed up."""
    if job is None or not job.ranks:
        return 0
    # Asked twice a refresh (whether the map shows, and its layout): one pass over the ranks.
    return _SLOTS.get(job.job, job, lambda: max(job.world_size, max(r.rank for r in job.ranks) + 1))


def rank_grid(job: JobSnapshot | None, metric: str, layout: MapLayout) -> RankGrid:
    """Bin every rank and keep each cell's worst: the highest bin, among equals the lowest
    rank number (a rank with several processes — restarts, conflicts — counts with each)."""
    n = layout.cells
    bins = [MISSING] * n
    picks: list[RankSnapshot | None] = [None] * n
    if job is not None and n:
        bin_of = _binner(metric, job_context_of(job))
        per = layout.per_cell
        for r in job.ranks:
            c = r.rank // per
            if c >= n:
                continue
            b = bin_of(r)
            cur = picks[c]
            if cur is None or b > bins[c] or (b == bins[c] and r.rank < cur.rank):
                bins[c], picks[c] = b, r
        if metric == "status":
            _mark_unseen(job, layout, bins)
    return RankGrid(layout, metric, job.job if job is not None else "", tuple(bins), tuple(picks))


def _mark_unseen(job: JobSnapshot, layout: MapLayout, bins: list[int]) -> None:
    """In the status map a cell holding never-seen rank numbers says "unseen", unless one of
    its ranks is worse (stalled, stale): an unstarted rank is a problem a live one would hide."""
    seen = [0] * len(bins)
    for rank in {r.rank for r in job.ranks}:
        if rank // layout.per_cell < len(bins):
            seen[rank // layout.per_cell] += 1
    for c, count in enumerate(seen):
        expected = min(layout.per_cell, layout.slots - c * layout.per_cell)
        if count < expected and bins[c] < STATUS_BINS["missing"]:
            bins[c] = STATUS_BINS["missing"]

