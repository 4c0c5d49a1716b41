"""RankMap: one cell per rank (or per few ranks), coloured by a metric, with a cursor.

Rank numbers run row by row through a grid (see :mod:`flowtop.monitor.rankstats`): 4,096 ranks are
a 64 x 64 block drawn as 32 lines of ▀ (each character holds two cells, foreground over
background); on a short terminal each cell takes several ranks and shows the worst. A key
legend sits to the right. Only lines whose cells changed are redrawn on a new snapshot.
"""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from flowtop.monitor.rankstats import (
    LEGEND,
    METRIC_LABEL,
    METRIC_SHORT,
    METRICS,
    MISSING,
    NO_VALUE,
    MapLayout,
    RankGrid,
    map_layout,
    map_slots,
    rank_grid,
)
from flowtop.monitor.rankview import RankKey
from flowtop.monitor.snapshot import JobSnapshot, RankSnapshot

_GREEN, _LIME, _YELLOW, _ORANGE, _RED = "#00c853", "#9ccc65", "#fdd835", "#fb8c00", "#e53935"
#: Colour per bin (0 = best), per metric. Five steps from green to red read on any terminal
#: theme; MFU above 100 % (an accounting error) is magenta.
PALETTE: dict[str, tuple[str, ...]] = {
    "mfu": (_GREEN, _LIME, _YELLOW, _ORANGE, _RED, "#d500f9"),
    "step_time": (_GREEN, _LIME, _YELLOW, _ORANGE, _RED),
    "input_wait": (_GREEN, _LIME, _YELLOW, _ORANGE, _RED),
    "status": ("#607d8b", _GREEN, "#d500f9", "#2979ff", _YELLOW, _RED, _ORANGE, "#ff80ab"),
}
NO_VALUE_COLOUR = "#757575"  # ranks there, no figure (no FLOP count yet)
MISSING_COLOUR = "#303030"  # no rank with these numbers seen
CURSOR_COLOUR = "#ffffff"
LEGEND_WIDTH = 16  # columns right of the grid (one of them a gap)


def bin_colour(metric: str, b: int) -> str:
    if b == MISSING:
        return MISSING_COLOUR
    if b == NO_VALUE:
        return NO_VALUE_COLOUR
    return PALETTE[metric][b]


def legend_lines(metric: str, per_cell: int, width: int) -> list[list[tuple[str, str]]]:
    """The legend as lines of (text, colour) pieces, ``width`` columns at most: the metric and
    ranks per cell, then a swatch per bin (values are each bin's lower edge)."""
    lines: list[list[tuple[str, str]]] = [[(f"{METRIC_SHORT[metric]} {per_cell}/cell", "")]]
    items = [(label, PALETTE[metric][i]) for i, label in enumerate(LEGEND[metric])]
    if metric != "status":
        items.append(("n/a", NO_VALUE_COLOUR))
    else:  # worst first: a short map (80x24: 4 rows) cuts the last lines, and "done" matters least
        items.reverse()
    line: list[tuple[str, str]] = []
    used = 0
    for label, colour in items:
        need = len(label) + 1 + (1 if line else 0)
        if line and used + need > width:
            lines.append(line)
            line, used, need = [], 0, len(label) + 1
        if line:
            line.append((" ", ""))
        line.extend((("■", colour), (label, "")))
        used += need
    if line:
        lines.append(line)
    return lines


class RankMap(Widget, can_focus=True):
    """The job's ranks as coloured cells; ``m`` (on the screen) cycles the metric."""

    DEFAULT_CSS = """
    RankMap { height: auto; }
    """
    BINDINGS = [
        Binding("left", "move(-1, 0)", "Left", show=False),
        Binding("right", "move(1, 0)", "Right", show=False),
        Binding("up", "move(0, -1)", "Up", show=False),
        Binding("down", "move(0, 1)", "Down", show=False),
        Binding("home", "home", "First", show=False),
        Binding("end", "end", "Last", show=False),
        Binding("enter", "pick", "Select", show=False),
    ]

    class CursorMoved(Message):
        """The cursor is on another cell; ``key``: the rank that cell selects (None: empty)."""

        def __init__(self, key: RankKey | None, rank: RankSnapshot | None) -> None:
            self.key = key
            self.rank = rank
            super().__init__()

    class RankPicked(Message):
        """Enter or a click on a cell: show that rank in the table."""

        def __init__(self, key: RankKey, rank: RankSnapshot) -> None:
            self.key = key
            self.rank = rank
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.metric = METRICS[0]
        #: The rank number under the cursor (a number, not a cell: cells change with the size).
        self.cursor_rank = 0
        self.grid: RankGrid = rank_grid(None, self.metric, map_layout(0, 1, 1))
        self._job: JobSnapshot | None = None
        self._drawn: dict[int, tuple] = {}
        self._titles: tuple[str, str] | None = None  # (title, subtitle) shown; None: none set yet
        self._strips: dict[int, tuple[tuple, Strip]] = {}
        #: Lines the last :meth:`show` refreshed (bench and tests read it).
        self.lines_refreshed = 0

    # --- data in -------------------------------------------------------------------------------

    def show(self, job: JobSnapshot | None) -> None:
        """Colour the cells for ``job``; only the lines that changed are redrawn."""
        self._job = job
        self._regrid()

    def cycle_metric(self) -> str:
        """The next metric (MFU, step time, input wait, status); returns its name."""
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]
        self._regrid()
        return self.metric

    @property
    def cursor(self) -> int:
        """The cell under the cursor."""
        return max(0, min(self.grid.layout.cells - 1, self.grid.layout.cell_of_rank(self.cursor_rank)))

    def mark_rank(self, rank: int | None) -> None:
        """Put the cursor on rank number ``rank`` (the table's selection)."""
        if rank is None or rank == self.cursor_rank:
            return
        self.cursor_rank = rank
        self._refresh_changed()
        self._update_title()

    def _grid_cols(self) -> int:
        width = self.size.width
        return width - LEGEND_WIDTH if width >= LEGEND_WIDTH + 8 else width

    def _layout(self) -> MapLayout:
        return map_layout(map_slots(self._job), self._grid_cols(), self.size.height)

    def _regrid(self) -> None:
        self.grid = rank_grid(self._job, self.metric, self._layout())
        self._refresh_changed()
        self._update_title()

    def _update_title(self) -> None:
        lay = self.grid.layout
        title = f"rank map · {METRIC_LABEL[self.metric]}"
        rank = self.grid.ranks[self.cursor] if lay.cells else None
        sub = ""
        if rank is not None:
            first = self.cursor * lay.per_cell
            span = f"ranks {first}-{min(lay.slots, first + lay.per_cell) - 1}, worst " if lay.per_cell > 1 else ""
            sub = f"{span}rank {rank.rank} · {rank.host.split('.')[0]} · {rank.status}"
        # Set only when changed: setting a title repaints every line of the map (Textual).
        old = self._titles
        if old is None or title != old[0]:
            self.border_title = Content(title)
        if old is None or sub != old[1]:
            self.border_subtitle = Content(sub)
        self._titles = (title, sub)

    # --- cursor ----------------------------------------------------------------------------------

    def _set_cursor(self, cell: int) -> None:
        lay = self.grid.layout
        if not lay.cells:
            return
        cell = max(0, min(lay.cells - 1, cell))
        if cell == self.cursor:
            return
        rank = self.grid.ranks[cell]
        self.cursor_rank = rank.rank if rank is not None else cell * lay.per_cell
        self._refresh_changed()
        self._update_title()
        self.post_message(self.CursorMoved(self.grid.key_at(cell), self.grid.ranks[cell]))

    def action_move(self, dx: int, dy: int) -> None:
        lay = self.grid.layout
        if not lay.cells:
            return
        col = max(0, min(lay.width - 1, self.cursor % lay.width + dx))
        row = max(0, min(lay.cell_rows - 1, self.cursor // lay.width + dy))
        self._set_cursor(min(lay.cells - 1, row * lay.width + col))

    def action_home(self) -> None:
        self._set_cursor(0)

    def action_end(self) -> None:
        self._set_cursor(self.grid.layout.cells - 1)

    def action_pick(self) -> None:
        if not self.grid.layout.cells:
            return
        key, rank = self.grid.key_at(self.cursor), self.grid.ranks[self.cursor]
        if key is not None and rank is not None:
            self.post_message(self.RankPicked(key, rank))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        cell = self.cell_at(offset.x, offset.y) if offset is not None else None
        if cell is None:
            return
        event.stop()
        self._set_cursor(cell)
        self.action_pick()

    def cell_at(self, x: int, y: int) -> int | None:
        """The cell under character (x, y); of a ▀'s two cells, the worse one."""
        lay = self.grid.layout
        if lay.half:
            cands = [2 * y * lay.width + x, (2 * y + 1) * lay.width + x] if 0 <= x < lay.width else []
        else:
            cands = [y * lay.width + x // 2] if 0 <= x < 2 * lay.width else []
        cands = [c for c in cands if 0 <= c < lay.cells]
        return max(cands, key=lambda c: self.grid.bins[c]) if cands else None

    # --- drawing ---------------------------------------------------------------------------------

    def _line_key(self, y: int) -> tuple:
        lay, bins = self.grid.layout, self.grid.bins
        rows = (2 * y, 2 * y + 1) if lay.half else (y,)
        cells = tuple(tuple(bins[r * lay.width:(r + 1) * lay.width]) for r in rows)
        # The cursor as (which of this line's cell rows, column), None when not on this line.
        cursor = next(((i, self.cursor - r * lay.width) for i, r in enumerate(rows)
                       if r * lay.width <= self.cursor < (r + 1) * lay.width), None)
        return (cells, cursor, self.metric, lay, self.size.width)

    def _refresh_changed(self) -> None:
        count = 0
        for y in range(self.size.height):
            key = self._line_key(y)
            if self._drawn.get(y) != key:
                self._drawn[y] = key
                self.refresh(Region(0, y, self.size.width, 1))
                count += 1
        self.lines_refreshed = count

    def on_resize(self, event: events.Resize) -> None:
        self._drawn.clear()
        self._regrid()

    def render_line(self, y: int) -> Strip:
        key = self._line_key(y)
        self._drawn[y] = key
        cached = self._strips.get(y)
        if cached is None or cached[0] != key:
            cached = (key, self._draw(y, key))
            self._strips[y] = cached
        return cached[1]

    def _draw(self, y: int, key: tuple) -> Strip:
        cells, cursor = key[0], key[1]
        lay = self.grid.layout
        base = self.rich_style
        segments: list[Segment] = []
        if lay.half:
            top, bottom = cells
            for x, b in enumerate(top):
                fg = CURSOR_COLOUR if cursor == (0, x) else bin_colour(self.metric, b)
                bg = None
                if x < len(bottom):
                    bg = CURSOR_COLOUR if cursor == (1, x) else bin_colour(self.metric, bottom[x])
                segments.append(Segment("▀", base + Style(color=fg, bgcolor=bg)))
        else:
            for x, b in enumerate(cells[0]):
                colour = CURSOR_COLOUR if cursor == (0, x) else bin_colour(self.metric, b)
                segments.append(Segment("██", base + Style(color=colour)))
        strip = Strip(segments).simplify()
        grid_cols = self._grid_cols()
        strip = strip.extend_cell_length(grid_cols, base)
        if grid_cols < self.size.width:
            strip = Strip.join([strip, Strip([Segment(" ", base)]), self._legend_strip(y, lay)])
        return strip.adjust_cell_length(self.size.width, base)

    def _legend_strip(self, y: int, lay: MapLayout) -> Strip:
        lines = legend_lines(self.metric, lay.per_cell, LEGEND_WIDTH - 1)
        base = self.rich_style
        if y >= len(lines):
            return Strip.blank(LEGEND_WIDTH - 1, base)
        segs = [Segment(text, base + (Style(color=colour) if colour else Style(dim=True) if y == 0 else Style()))
                for text, colour in lines[y]]
        return Strip(segs).adjust_cell_length(LEGEND_WIDTH - 1, base)
