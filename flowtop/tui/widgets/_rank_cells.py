"""Cells of the rank table: its columns, a rank row's and a node row's cells, its title.

Cells are (text, style) pairs, plain strings: cheap to build for the rows on screen and to
compare with what a line showed before (the table refreshes only lines that changed).
"""

from __future__ import annotations

from typing import NamedTuple

from rich.cells import cell_len
from rich.text import Text

from flowtop.monitor import telemetry as tm
from flowtop.monitor.format import fmt_coords
from flowtop.monitor.precision import bf16_eq_differs
from flowtop.monitor.rankview import ALL_SORTS, STRAGGLER_LAG, WORST, NodeRow, RankRow, RankView, Row, ViewSpec
from flowtop.monitor.snapshot import ENDED, JobSnapshot
from flowtop.tui.widgets._format import NA, STATUS_STYLE, activity_style, fmt_int, fmt_pct, fmt_si, fmt_time, mfu_style


class Column(NamedTuple):
    key: str  # also the sort key (flowtop.monitor.rankview.SORT_COLUMNS)
    label: str
    width: int
    left: bool = False  # left-justified (text), else right (numbers)
    #: The label behind the sort arrow where the arrow and ``label`` overflow ``width`` (the
    #: header read "▼step " and "▼FLOP/" cut to their width; a rank-view trial).
    short: str = ""

    def header(self, arrow: str = "") -> str:
        """The header label, after the sort ``arrow`` when this column sorts the table."""
        if not arrow:
            return self.label
        return arrow + (self.short if self.short and len(arrow + self.label) > self.width else self.label)


# Widths sum to 68; with a space between columns and one before the first, a row is 79
# columns: an 80-column SSH terminal keeps one for the scrollbar.
COLUMNS: tuple[Column, ...] = (
    Column("rank", "rank", 6),
    Column("host", "host", 11, left=True),
    Column("step", "step", 7),
    Column("lag", "lag", 4),
    Column("step_time", "step t", 6, short="time"),
    Column("input_wait", "wait", 5),
    Column("tokens", "tok/s", 6),
    Column("flops", "FLOP/s", 6, short="FLOPs"),
    Column("mfu", "MFU", 6),
    Column("tensor", "TC%", 4),
    Column("status", "state", 7, left=True),
)


def row_width(columns: tuple[Column, ...]) -> int:
    """Cells of a row: one space before the first column and between columns."""
    return 1 + sum(c.width for c in columns) + len(columns) - 1


ROW_WIDTH = row_width(COLUMNS)
#: Columns a job adds after the fixed ones when it has something for them (after ``state``, so
#: an 80-column terminal keeps the fixed ones in view; wider terminals show these too):
#: the bf16-equivalent MFU when a rank's precision mix is not pure bf16, and the coordinates.
MFU_BF16 = Column("mfu_bf16", "bf16eq", 6, short="bf16")
COORDS_WIDTH = (6, 20)  # a coordinates cell's least and most width (the label "coords", "dp12 tp3 pp1 cp1")
#: The host column takes spare width up to this (long host names on a wide terminal).
HOST_MAX = 24

Cell = tuple[str, str]  # (text, style)


def short_host(host: str) -> str:
    """The first label of a host name (nodes differ there); IP addresses stay whole."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host.split(".")[0]


def _wait(frac: float | None) -> Cell:
    if frac is None:
        return NA, "dim"
    style = "red" if frac >= 0.25 else "yellow" if frac >= 0.10 else ""
    return fmt_pct(frac, 0 if frac >= 0.0995 else 1), style


def columns_for(job: JobSnapshot | None) -> tuple[Column, ...]:
    """:data:`COLUMNS` and the optional columns ``job`` has values for (see :data:`MFU_BF16`).
    The coordinates column is as wide as the first rank's label (every rank has the same roles
    and sizes; a longer label is cut with an ellipsis)."""
    if job is None:
        return COLUMNS
    extra: list[Column] = []
    if any(r.flops is not None and bf16_eq_differs(r.flops.precision, r.flops.mfu_bf16) for r in job.ranks):
        extra.append(MFU_BF16)
    first = next((r for r in job.ranks if r.coords), None)
    if first is not None:
        widest = fmt_coords({role: (size - 1, size) for role, (_, size) in first.coords.items()})
        extra.append(coords_column(len(widest)))
    return COLUMNS + tuple(extra)


def coords_column(widest: int) -> Column:
    """The coordinates column for labels of up to ``widest`` characters (see COORDS_WIDTH)."""
    return Column("coords", "coords", max(COORDS_WIDTH[0], min(COORDS_WIDTH[1], widest)), left=True, short="coord")


def rank_cells(row: RankRow, columns: tuple[Column, ...] = COLUMNS) -> tuple[Cell, ...]:
    """The cells of one rank row, in ``columns`` order (:func:`columns_for`)."""
    r = row.rank
    f = r.flops
    mfu = r.mfu
    dim = "dim" if r.status in ENDED else ""  # a failed rank's last figures too: its status cell says it
    tensor = tm.fraction(r.telemetry, tm.TENSOR)
    rank = str(r.rank) if r.incarnation == 0 else f"{r.rank}.{r.incarnation}"
    # Another process claims this rank too (see the rank_conflict hint): mark both rows.
    rank_cell = (rank + "!", "bold red") if r.conflict else (rank, dim or ("" if row.nested else "bold"))
    lag_style = _lag_style(row.lag) or "dim"
    cells = (
        rank_cell,
        (short_host(r.host), "dim" if (dim or row.nested) else ""),
        (fmt_int(r.step), "yellow" if r.status == "stale" else dim),
        (NA if row.lag is None else str(row.lag), lag_style),  # None: unheard, behind a silent relay
        (fmt_time(r.step_time_s), dim),
        _wait(r.input_wait_frac) if not dim else (fmt_pct(r.input_wait_frac), dim),
        (fmt_si(r.tokens_per_s), dim),
        (fmt_si(f.flops_per_s if f else None), dim),
        (fmt_pct(mfu), dim or mfu_style(mfu)),
        (NA if tensor is None else f"{tensor * 100:.0f}", dim or activity_style(tensor)),
        (r.status, STATUS_STYLE.get(r.status, "yellow")),
    )
    if len(columns) == len(COLUMNS):
        return cells
    extra = {
        "mfu_bf16": (fmt_pct(f.mfu_bf16 if f else None), dim),
        "coords": (fmt_coords(r.coords), dim),
    }
    return cells + tuple(extra[c.key] for c in columns[len(COLUMNS):])


def _lag_style(lag: int | None) -> str:
    """A step lag's colour: red ten straggler lags behind, yellow one; "" else (and unknown)."""
    if lag is None:
        return ""
    return "red" if lag >= 10 * STRAGGLER_LAG else "yellow" if lag >= STRAGGLER_LAG else ""


def _whole_pct(frac: float) -> str:
    """A node's MFU in whole percents (two of them fill the column), "<1" for one under half a
    percent that is not zero: a CPU job's or a launch-bound one's 0.4 % read "0", as if nothing ran."""
    pct = frac * 100
    return "<1" if 0 < pct < 1 and round(pct) == 0 else f"{pct:.0f}"  # 0.5 rounds to even: 0


def node_cells(row: NodeRow, columns: tuple[Column, ...] = COLUMNS) -> tuple[Cell, ...]:
    """The cells of one node row: its rank count, and the aggregates a node is judged by."""
    g = row.group
    mfu = NA
    if g.mfu_min is not None and g.mfu_median is not None:
        mfu = f"{_whole_pct(g.mfu_min)}/{_whole_pct(g.mfu_median)}%"
    lag_style = _lag_style(g.max_lag)
    return (
        # A rank claimed twice marks its node as it marks the rank's own row (rank_cells).
        (f"{'▾' if row.open else '▸'} {len(g.ranks)}" + ("!" if g.conflict else ""),
         "bold red" if g.conflict else "bold"),
        (short_host(g.host), "bold"),
        (fmt_int(g.step_min), ""),
        (NA if g.max_lag is None else str(g.max_lag), lag_style),
        (fmt_time(g.step_time_max), ""),
        _wait(g.input_wait_max),
        (fmt_si(g.tokens_per_s), ""),
        (fmt_si(g.flops_per_s), ""),
        (mfu, mfu_style(g.mfu_min)),
        ("", ""),
        (g.worst_status, STATUS_STYLE.get(g.worst_status, "yellow")),
    ) + (("", ""),) * (len(columns) - len(COLUMNS))  # a node has no one bf16 figure or coordinate


def row_cells(row: Row, columns: tuple[Column, ...] = COLUMNS) -> tuple[Cell, ...]:
    return node_cells(row, columns) if isinstance(row, NodeRow) else rank_cells(row, columns)


#: Header labels by sort key, the optional columns' included (the sort may name a column the
#: job no longer shows).
LABELS = {c.key: c.label for c in (*COLUMNS, MFU_BF16)} | {"coords": "coords"}


def view_title(view: RankView, spec: ViewSpec) -> str:
    """The table's title: what is shown, how it is ordered, and the filter in force."""
    noun = "rank" if view.total == 1 else "ranks"
    parts = [f"{view.shown:,} of {view.total:,} {noun}" if spec.filter.active else f"{view.total:,} {noun}"]
    if view.grouped:
        parts.append(f"{view.nodes:,} nodes")
    elif spec.grouped is False and view.nodes > 1:
        parts.append("flat")
    if spec.sort == WORST:
        parts.append("worst first" + (", reversed" if spec.reverse else ""))
    else:
        label = LABELS[spec.sort]
        parts.append(f"by {label} {'▲' if ascending(spec) else '▼'}")
    if spec.filter.active:
        parts.append(f"filter: {spec.filter.text}")
    return " · ".join(parts)


def ascending(spec: ViewSpec) -> bool:
    """Whether the spec's column sort runs from low to high values."""
    return ALL_SORTS[spec.sort] == spec.reverse


def fit(text: str, width: int, left: bool) -> str:
    """``text`` padded (or cut, with an ellipsis) to ``width`` cells."""
    n = cell_len(text)
    if n > width:
        t = Text(text)
        t.truncate(width, overflow="ellipsis")
        return t.plain + " " * (width - t.cell_len)
    pad = " " * (width - n)
    return text + pad if left else pad + text

