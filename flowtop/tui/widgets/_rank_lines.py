"""The rank table's screen lines (flowtop.tui.widgets.rank_table): what a line shows, as a typed
key, the strip drawn of it and the styles it is drawn in; which row a key is on, which column a
click is in. Not a widget: RankTable asks these of its view, its spec, its columns and its styles
(looked up once per paint).

A line is refreshed only when its key changed since it was drawn, and the strip drawn for a key
is kept while the key is the same: equal keys draw equal lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

from flowtop.monitor.rankview import NodeRow, RankView, RowKey, ViewSpec, node_key
from flowtop.tui.widgets._rank_cells import HOST_MAX, Cell, Column, ascending, fit, row_cells, row_width


@dataclass(frozen=True, slots=True)
class LineKey:
    """What one screen line of the rank table shows (equal keys draw equal lines)."""

    kind: str  # "header" | "row" | "blank" (past the last row)
    width: int  # the drawn area's width
    cells: tuple[Cell, ...] = ()  # a row's cells
    node: bool = False  # a node row (its own style)
    cursor: bool = False  # the cursor's row
    odd: bool = False  # an odd row (striped)
    #: The header's: the sort it marks and the columns it names.
    sort: str = ""
    reverse: bool = False
    columns: tuple[Column, ...] = ()


def column_widths(columns: tuple[Column, ...], width: int) -> list[int]:
    """Each column's width in a drawn area ``width`` wide: the host column takes what is spare,
    up to HOST_MAX."""
    spare = max(0, width - row_width(columns))
    return [min(HOST_MAX, c.width + spare) if c.key == "host" else c.width for c in columns]


def column_at(columns: tuple[Column, ...], widths: list[int], x: int) -> str | None:
    """The key of the column at cell ``x`` of a line (columns ``widths`` wide), None between."""
    left = 1
    for col, width in zip(columns, widths):
        if left <= x < left + width + 1:
            return col.key
        left += width + 1
    return None


def row_of(view: RankView, index: Mapping[RowKey, int], key: RowKey | None) -> int | None:
    """The row of ``view`` (``index``: its rows by key) where ``key`` is now; a rank hidden in a
    closed node is found at its node row."""
    if key is None:
        return None
    if key in index:
        return index[key]
    if len(key) == 5:
        return index.get(node_key(key[0], key[1]))
    # A node row gone (the flat view): its first rank in the order shown, its worst under
    # worst-first (the cursor had kept the row's index, landing on another node's rank).
    _, job, host = key
    return next((i for i, row in enumerate(view.rows)
                 if len(row.key) == 5 and row.key[0] == job and row.key[1] == host), None)


def line_styles(base: Style, component: Callable[[str], Style]) -> dict[str, Style]:
    """The styles a paint draws lines in, by name: ``base`` (the widget's) and ``base`` with each
    component's (``component``: the widget's style of "header", "node", "even", "cursor")."""
    styles = {name: base + component(name) for name in ("header", "node", "even", "cursor")}
    styles["base"] = base
    styles["node-cursor"] = styles["node"] + component("cursor")
    return styles


def line_key(view: RankView, spec: ViewSpec, columns: tuple[Column, ...], cursor_row: int, y: int, width: int,
             top: int) -> LineKey:
    """What screen line ``y`` shows (line 0: the header; ``top``: the first row on screen)."""
    if y == 0:
        return LineKey("header", width, sort=spec.sort, reverse=spec.reverse, columns=columns)
    i = top + y - 1
    if i >= len(view.rows):
        return LineKey("blank", width)
    row = view.rows[i]
    return LineKey("row", width, row_cells(row, columns), isinstance(row, NodeRow), i == cursor_row, i % 2 == 1)


def header_label(col: Column, spec: ViewSpec) -> str:
    """A column's header, marked ▲ or ▼ where the view is sorted by it."""
    if col.key != spec.sort:
        return col.header()
    return col.header("▲" if ascending(spec) else "▼")


def draw_line(key: LineKey, spec: ViewSpec, columns: tuple[Column, ...], styles: Mapping[str, Style]) -> Strip:
    """The strip of the line ``key`` says, in the table's ``styles`` (by component name)."""
    width = max(row_width(columns), key.width)
    if key.kind == "blank":
        return Strip.blank(width, styles["base"])
    if key.kind == "header":
        cells: tuple[Cell, ...] = tuple((header_label(c, spec), "") for c in columns)
        line = styles["header"]
    else:
        cells, node = key.cells, key.node
        if key.cursor:
            line = styles["node-cursor" if node else "cursor"]
        else:
            line = styles["node" if node else "even" if key.odd else "base"]
    gap = Segment(" ", line)
    segments = [gap]
    for (text, style), col, w in zip(cells, columns, column_widths(columns, key.width)):
        segments.append(Segment(fit(text, w, col.left), line + Style.parse(style) if style else line))
        segments.append(gap)
    return Strip(segments).adjust_cell_length(width, line)
