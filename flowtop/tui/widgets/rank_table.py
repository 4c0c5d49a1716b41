"""RankTable: the rank view — node rows over their ranks, worst first, drawn line by line.

Thousands of ranks do not fit a table that keeps a cell object per rank (4,096 ranks x 11
columns is 45 k cells to rebuild every half second), so this is a Line API widget: the rows
come from :func:`flowtop.monitor.rankview.build_view` and only the rows on screen are formatted.
On a new snapshot only the screen lines whose text or style changed are refreshed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.content import Content
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from flowtop.monitor.rankfilter import RankFilter
from flowtop.monitor.rankview import NodeRow, RankKey, RankView, RowKey, ViewSpec, build_view, node_key, rank_key
from flowtop.monitor.snapshot import JobSnapshot, RankSnapshot
from flowtop.tui.widgets._rank_cells import (  # noqa: F401  (COLUMNS, row_cells, short_host: the table's API)
    COLUMNS,
    Column,
    columns_for,
    row_cells,
    row_width,
    short_host,
    view_title,
)
from flowtop.tui.widgets._rank_lines import (
    LineKey,
    column_at,
    column_widths,
    draw_line,
    line_key,
    line_styles,
    row_of,
)

_short_host = short_host  # the name older tests import


class RankTable(ScrollView, can_focus=True):
    """Rows of :class:`flowtop.monitor.rankview.RankView`; the cursor stays on its row's key."""

    COMPONENT_CLASSES = {"rank-table--header", "rank-table--cursor", "rank-table--node", "rank-table--even"}
    DEFAULT_CSS = """
    RankTable {
        background: $surface;
        & > .rank-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .rank-table--node { background: $boost; }
        & > .rank-table--even { background: $surface-lighten-1 50%; }
        & > .rank-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus > .rank-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "choose", "Open", show=False),
        Binding("space", "toggle_node", "Open/close node", show=False),
        Binding("right", "open_node(True)", "Open node", show=False),
        Binding("left", "open_node(False)", "Close node", show=False),
    ]

    class RankChosen(Message):
        """Enter (or a second click) on a rank row."""

        def __init__(self, key: RankKey, rank: RankSnapshot) -> None:
            self.key = key
            self.rank = rank
            super().__init__()

    class Highlighted(Message):
        """The cursor moved to another row (``rank``: the rank it selects, None if none)."""

        def __init__(self, key: RowKey | None, rank: RankSnapshot | None) -> None:
            self.key = key
            self.rank = rank
            super().__init__()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = ViewSpec()
        self.view = RankView()
        self.cursor_row = 0
        self._job: JobSnapshot | None = None
        #: The columns shown: the fixed ones and those the job has values for (columns_for).
        self.columns: tuple[Column, ...] = COLUMNS
        self._index: dict[RowKey, int] = {}
        self._cursor_key: RowKey | None = None
        self._drawn: dict[int, LineKey] = {}  # screen line -> what was drawn there
        self._strips: dict[int, tuple[LineKey, Strip]] = {}
        self._styles: dict[str, Style] = {}
        #: What each screen line shows under this view at one (width, top, cursor row): y -> its
        #: key. A refresh asks it of every line to find those that changed and again of each line
        #: it paints: the row's cells are formatted once. One screen's only (cleared with each new
        #: view, and when the cursor or the scroll moves): a view held while the cursor went
        #: through 4,096 rows kept 37 keys a move (50 KB), none of them asked again.
        self._keys: dict[int, LineKey] = {}
        self._keys_at: tuple[int, int, int] | None = None  # the (width, top, cursor row) of _keys
        self._title: str | None = None  # the border title set (None: none yet)
        #: Screen lines the last :meth:`show` refreshed (bench and tests read it).
        self.lines_refreshed = 0

    # --- data in ---------------------------------------------------------------------------

    def show(self, job: JobSnapshot | None) -> None:
        """Render ``job``'s ranks under the current spec (sort, grouping, filter)."""
        self._job = job
        self._rebuild()

    def set_spec(self, spec: ViewSpec) -> None:
        """Change order, grouping, filter or open nodes; the cursor stays on its row."""
        self.spec = spec
        self._rebuild()

    def set_filter(self, flt: RankFilter) -> None:
        self.set_spec(replace(self.spec, filter=flt))

    def sort_by(self, column: str) -> None:
        """Sort by ``column`` (worst values first); the current column again reverses."""
        if column == self.spec.sort:
            self.set_spec(replace(self.spec, reverse=not self.spec.reverse))
        else:
            self.set_spec(replace(self.spec, sort=column, reverse=False))

    def open_all(self, is_open: bool) -> None:
        """Open (or close) every node row."""
        if not self.view.grouped:  # no node rows: reading a flat view's rows would make all of them
            return
        hosts = frozenset(row.host for row in self.view.rows if isinstance(row, NodeRow))
        if is_open:
            self.set_spec(replace(self.spec, opened=self.spec.opened | hosts, closed=self.spec.closed - hosts))
        else:
            self.set_spec(replace(self.spec, opened=self.spec.opened - hosts, closed=self.spec.closed | hosts))

    def _rebuild(self) -> None:
        old_key = self._cursor_key
        self.view = build_view(self._job, self.spec)
        self._keys.clear()
        self._index = self.view.index()
        self.columns = columns_for(self._job)
        rows = self.view.rows
        self.virtual_size = Size(max(row_width(self.columns), self._view.width), len(rows) + 1)
        self._set_title(view_title(self.view, self.spec))
        row = self._row_of(old_key)
        self.cursor_row = max(0, min(len(rows) - 1, self.cursor_row if row is None else row))
        self._cursor_key = rows[self.cursor_row].key if rows else None
        self._scroll_to_cursor()
        self._refresh_changed()
        if self._cursor_key != old_key:
            self.post_message(self.Highlighted(self._cursor_key, self.selected))

    def _set_title(self, title: str) -> None:
        """Set the border title when it changed: setting one repaints every line of the widget
        (Textual), and the title reads the same from one snapshot to the next."""
        if title != self._title:
            self._title = title
            self.border_title = Content(title)

    def _row_of(self, key: RowKey | None) -> int | None:
        """Where ``key`` is now; a rank hidden in a closed node is found at its node row."""
        return row_of(self.view, self._index, key)

    # --- selection ---------------------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.view.rows)

    @property
    def cursor_key(self) -> RowKey | None:
        """Key of the row under the cursor."""
        return self._cursor_key

    @property
    def selected(self) -> RankSnapshot | None:
        """The rank under the cursor; on a node row, that node's first (worst) rank."""
        if not self.view.rows:
            return None
        row = self.view.rows[self.cursor_row]
        return row.ranks[0] if isinstance(row, NodeRow) else row.rank

    def row_text(self, index: int) -> list[str]:
        """The plain text of row ``index``'s cells (tests read the table through it)."""
        return [text for text, _ in row_cells(self.view.rows[index], self.columns)]

    def move_cursor(self, row: int, *, scroll: bool = True) -> None:
        """Put the cursor on row ``row`` (clamped)."""
        rows = self.view.rows
        if not rows:
            return
        old = self.cursor_row
        self.cursor_row = max(0, min(len(rows) - 1, row))
        key = rows[self.cursor_row].key
        changed = key != self._cursor_key
        self._cursor_key = key
        if scroll:
            self._scroll_to_cursor()
        for i in (old, self.cursor_row):
            self._refresh_row(i)
        if changed:
            self.post_message(self.Highlighted(key, self.selected))

    def select_key(self, key: RankKey) -> None:
        """Put the cursor on rank ``key``, or on its node row when the node is closed."""
        row = self._row_of(key)
        if row is not None:
            self.move_cursor(row)

    def reveal(self, key: RankKey) -> str:
        """Put the cursor on rank ``key``, opening its node and, if the filter hides it,
        clearing the filter. Returns a note for the user ("" when nothing had to go)."""
        rank = next((r for r in self._job.ranks if rank_key(self._job.job, r) == key), None) if self._job else None
        if rank is None:
            return "that rank is no longer in the job"
        note = ""
        if not self.spec.filter.matcher(self._job)(rank):  # type: ignore[arg-type]
            self.spec = replace(self.spec, filter=RankFilter())
            note = "filter cleared to show the rank"
        host = key[1]
        self.spec = replace(self.spec, opened=self.spec.opened | {host}, closed=self.spec.closed - {host})
        self._rebuild()
        if key in self._index:
            self.move_cursor(self._index[key])
        return note

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self._view.height - 1)  # the header line does not scroll
        top = round(self.scroll_y)
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False, immediate=True)

    # --- actions -----------------------------------------------------------------------------

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self._view.height - 2))

    def action_jump(self, where: int) -> None:
        self.move_cursor(where if where >= 0 else len(self.view.rows) - 1)

    def action_choose(self) -> None:
        """Enter: a node row opens or closes; a rank row is chosen (the kernel screen)."""
        if not self.view.rows:
            return
        row = self.view.rows[self.cursor_row]
        if isinstance(row, NodeRow):
            self._toggle(row.host)
        else:
            self.post_message(self.RankChosen(row.key, row.rank))

    def action_toggle_node(self) -> None:
        row = self.view.rows[self.cursor_row] if self.view.rows else None
        if isinstance(row, NodeRow):
            self._toggle(row.host)
        elif row is not None and row.nested:
            self.action_open_node(False)

    def action_open_node(self, is_open: bool) -> None:
        """→ opens the node under the cursor, ← closes it (from one of its ranks too)."""
        row = self.view.rows[self.cursor_row] if self.view.rows else None
        if isinstance(row, NodeRow):
            if row.open != is_open:
                self._toggle(row.host)
        elif row is not None and row.nested and not is_open:
            host = row.rank.host
            self._cursor_key = node_key(row.key[0], host)
            self._toggle(host)

    def _toggle(self, host: str) -> None:
        self.set_spec(self.spec.toggled(host, self.view.open_default))

    # --- mouse ---------------------------------------------------------------------------------

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        event.stop()
        if offset.y == 0:
            column = self._column_at(offset.x + round(self.scroll_x))
            if column is not None:
                self.sort_by(column)
            return
        row = round(self.scroll_y) + offset.y - 1
        if 0 <= row < len(self.view.rows):
            if row == self.cursor_row:
                self.action_choose()
            else:
                self.move_cursor(row)

    def _column_at(self, x: int) -> str | None:
        return column_at(self.columns, self._widths(self._view.width), x)

    # --- drawing -------------------------------------------------------------------------------

    @property
    def _view(self) -> Size:
        """The drawn area: the widget less its scrollbars."""
        return self.scrollable_content_region.size

    def _widths(self, width: int) -> list[int]:
        return column_widths(self.columns, width)

    def _line_key(self, y: int, width: int, top: int) -> LineKey:
        """What screen line ``y`` shows (``top``: the first row on screen): equal keys draw
        equal lines."""
        at = (width, top, self.cursor_row)
        if at != self._keys_at:
            self._keys.clear()
            self._keys_at = at
        key = self._keys.get(y)
        if key is None:
            key = self._keys[y] = line_key(self.view, self.spec, self.columns, self.cursor_row, y, width, top)
        return key

    def _refresh_changed(self) -> None:
        """Refresh the screen lines whose content changed since they were last drawn."""
        width, height = self._view
        top = round(self.scroll_y)
        count = 0
        for y in range(height):
            key = self._line_key(y, width, top)
            if self._drawn.get(y) != key:
                self._drawn[y] = key
                self.refresh(Region(0, y, width, 1))
                count += 1
        self.lines_refreshed = count

    def _refresh_row(self, index: int) -> None:
        y = index - round(self.scroll_y) + 1
        if 1 <= y < self._view.height:
            self._drawn.pop(y, None)
            self.refresh(Region(0, y, self._view.width, 1))

    def watch_scroll_y(self, old: float, new: float) -> None:
        self._drawn.clear()
        super().watch_scroll_y(old, new)

    def on_focus(self) -> None:
        self._restyle()

    def on_blur(self) -> None:
        self._restyle()

    def _restyle(self) -> None:
        """The cursor's colours differ with focus: draw every line again."""
        self._strips.clear()
        self._drawn.clear()
        self.refresh()

    def on_resize(self, event: events.Resize) -> None:
        self._drawn.clear()
        self.virtual_size = Size(max(row_width(self.columns), self._view.width), len(self.view.rows) + 1)

    def render_lines(self, crop: Region) -> list[Strip]:
        # Styles walk the DOM (a fraction of a ms each): look them up once per paint.
        self._styles = line_styles(self.rich_style, lambda name: self.get_component_rich_style(f"rank-table--{name}"))
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self._view.width
        key = self._line_key(y, width, round(self.scroll_y))
        self._drawn[y] = key
        cached = self._strips.get(y)
        if cached is not None and cached[0] == key:
            strip = cached[1]
        else:
            strip = draw_line(key, self.spec, self.columns, self._styles)
            self._strips[y] = (key, strip)
        x = round(self.scroll_x)
        return strip.crop(x, x + width)
