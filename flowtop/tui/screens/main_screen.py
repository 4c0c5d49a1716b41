"""MainScreen: job header, rank view (percentiles, rank table, rank map) and hints."""

from __future__ import annotations

from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.content import Content
from textual.widgets import Input

from flowtop.monitor.rankfilter import FilterError, RankFilter, known_hint_ids, parse_filter
from flowtop.monitor.rankstats import map_slots
from flowtop.monitor.rankview import SORT_COLUMNS, WORST
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot
from flowtop.tui.screens.snapshot_screen import SnapshotScreen, find_job
from flowtop.tui.widgets.hints_panel import HintsPanel
from flowtop.tui.widgets.job_header import JobHeader
from flowtop.tui.widgets.rank_map import RankMap
from flowtop.tui.widgets.rank_summary import RankSummary
from flowtop.tui.widgets.rank_table import RankTable
from flowtop.tui.widgets.status_footer import StatusFooter

#: Jobs with fewer rank numbers get no map unless asked for (``m``, ``M``): the table shows them all.
MAP_MIN_RANKS = 16
#: Sort cycle of ``s``: worst first, then every column in table order.
SORT_CYCLE = (WORST, *SORT_COLUMNS)


class MainScreen(SnapshotScreen):
    """The first screen: one job at a time (``n`` cycles jobs when there are several)."""

    BINDINGS = [
        Binding("k", "kernels_now", "Capture"),
        Binding("d", "detail", "Detail"),
        Binding("j", "job_kernels", "Job kernels"),
        Binding("n", "next_job", "Next job", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("s", "sort(1)", "Sort"),
        Binding("S", "sort(-1)", "Sort back", show=False),
        Binding("r", "reverse", "Reverse", show=False),
        Binding("w", "worst_first", "Worst first", show=False),
        Binding("g", "group", "Group", show=False),
        Binding("plus", "open_all(True)", "Open nodes", show=False),
        Binding("minus", "open_all(False)", "Close nodes", show=False),
        Binding("m", "map_metric", "Map", show=False),
        Binding("M", "map_toggle", "Map on/off", show=False),
    ]
    #: The map stands beside the table from 162 columns on (table 79 + scrollbar + map 82);
    #: narrower, it is a band under the hints.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (162, "-wide")]
    AUTO_FOCUS = "#ranks"

    def __init__(self) -> None:
        super().__init__()
        self.job_name: str | None = None
        self._job: JobSnapshot | None = None
        self._map_wanted: bool | None = None  # set by m / M; None: by the job's size

    def compose(self) -> ComposeResult:
        yield JobHeader(id="job-header")
        # Focus order is DOM order: table, hints, map (Tab from the ranks reaches the hints).
        with Container(id="main-body"):
            with Vertical(id="rank-pane"):
                yield RankSummary(id="rank-summary")
                box = Input(placeholder="host glob, rank range 128-255, status, hint id; Esc clears",
                            id="rank-filter")
                box.display = False  # until / opens it
                yield box
                yield RankTable(id="ranks")
                yield HintsPanel(id="hints")
            yield RankMap(id="rank-map")
        yield StatusFooter()

    @property
    def job(self) -> JobSnapshot | None:
        """The job on screen now."""
        return self._job

    def show(self, snap: MonitorSnapshot | None) -> None:
        job = find_job(snap, self.job_name) or find_job(snap, None)
        self._job = job
        if job is not None:
            self.job_name = job.job
        jobs = snap.jobs if snap is not None else ()
        index = next((i for i, j in enumerate(jobs) if job is not None and j.job == job.job), 0)
        self.query_one(JobHeader).show(snap, job, index, len(jobs), self.flowtop.source_error)
        self.query_one(RankSummary).show(job)
        self.query_one(RankTable).show(job)
        rank_map = self.query_one(RankMap)
        wanted = self._map_wanted if self._map_wanted is not None else map_slots(job) >= MAP_MIN_RANKS
        if rank_map.display != wanted:
            rank_map.display = wanted
        rank_map.show(job)
        self.query_one(HintsPanel).show(job.hints if job else (), job.ranks if job else (),
                                        snap.taken_at if snap is not None else 0.0)
        self.query_one(StatusFooter).recheck()

    def _selected(self) -> tuple[str, int] | None:
        rank = self.query_one(RankTable).selected
        if self._job is None or rank is None:
            self.notify("no rank selected", severity="warning", timeout=2)
            return None
        return self._job.job, rank.rank

    def on_rank_table_rank_chosen(self, event: RankTable.RankChosen) -> None:
        event.stop()
        self.action_kernels()

    def on_rank_table_highlighted(self, event: RankTable.Highlighted) -> None:
        """The map's cursor follows the table's selection (not while the map is being steered:
        a closed node's row would pull it to that node's worst rank)."""
        rank_map = self.query_one(RankMap)
        if not rank_map.has_focus:
            rank_map.mark_rank(event.rank.rank if event.rank is not None else None)

    def on_rank_map_cursor_moved(self, event: RankMap.CursorMoved) -> None:
        """Moving over the map selects the rank in the table (its node row if closed)."""
        if event.key is not None:
            self.query_one(RankTable).select_key(event.key)

    def on_rank_map_rank_picked(self, event: RankMap.RankPicked) -> None:
        """Enter or a click on the map: open the rank's node, select it, go to the table."""
        table = self.query_one(RankTable)
        note = table.reveal(event.key)
        if note:
            self.notify(note, timeout=3, markup=False)
        self._filter_input().value = table.spec.filter.text
        table.focus()

    # --- rank view keys ----------------------------------------------------------------------

    def _filter_input(self) -> Input:
        return self.query_one("#rank-filter", Input)

    def action_filter(self) -> None:
        """Open the filter line (``/``); it filters as you type."""
        box = self._filter_input()
        box.display = True
        box.value = self.query_one(RankTable).spec.filter.text
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "rank-filter":
            return
        event.stop()
        try:
            flt = parse_filter(event.value, known_hint_ids(self._job),
                               {r.host for r in self._job.ranks} if self._job is not None else None)
        except FilterError as exc:
            event.input.add_class("-invalid")
            event.input.tooltip = Content(str(exc))  # plain text: it quotes what was typed ('[/x]', 'gpu[ab]*')
            return
        event.input.remove_class("-invalid")
        event.input.tooltip = None
        self.query_one(RankTable).set_filter(flt)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "rank-filter":
            return
        event.stop()
        if event.input.has_class("-invalid"):
            self.notify(str(event.input.tooltip), severity="error", timeout=5, markup=False)
            return
        event.input.display = False
        self.query_one(RankTable).focus()

    def on_hints_panel_show_ranks(self, event: HintsPanel.ShowRanks) -> None:
        """``f`` on a hint: the table filtered to its ranks (the filter line holds it: ``/``
        edits it, Esc clears it)."""
        event.stop()
        try:
            flt = parse_filter(event.text, known_hint_ids(self._job))
        except FilterError as exc:  # a hint id no rule has and the job no longer shows
            self.notify(str(exc), severity="error", timeout=5, markup=False)
            return
        self._filter_input().value = event.text
        table = self.query_one(RankTable)
        table.set_filter(flt)
        table.focus()
        self.notify(f"ranks of {event.what}: {event.text or 'every rank'} (Esc clears)", timeout=4, markup=False)

    def action_clear_filter(self) -> None:
        """Esc: drop the filter and close the filter line."""
        box = self._filter_input()
        table = self.query_one(RankTable)
        if not box.display and not table.spec.filter.active:
            return
        box.value = ""
        box.display = False
        table.set_filter(RankFilter())
        table.focus()

    def action_sort(self, step: int) -> None:
        """``s`` / ``S``: the next / previous sort (worst first, then the columns)."""
        table = self.query_one(RankTable)
        i = SORT_CYCLE.index(table.spec.sort) if table.spec.sort in SORT_CYCLE else 0
        table.set_spec(replace(table.spec, sort=SORT_CYCLE[(i + step) % len(SORT_CYCLE)], reverse=False))

    def action_reverse(self) -> None:
        table = self.query_one(RankTable)
        table.set_spec(replace(table.spec, reverse=not table.spec.reverse))

    def action_worst_first(self) -> None:
        table = self.query_one(RankTable)
        table.set_spec(replace(table.spec, sort=WORST, reverse=False))

    def action_group(self) -> None:
        """``g``: ranks under node rows, or one flat list."""
        table = self.query_one(RankTable)
        table.set_spec(replace(table.spec, grouped=not table.spec.grouped))

    def action_open_all(self, is_open: bool) -> None:
        self.query_one(RankTable).open_all(is_open)

    def action_map_metric(self) -> None:
        """``m``: colour the map by the next metric (and show it if it was hidden)."""
        rank_map = self.query_one(RankMap)
        if not rank_map.display:
            self._map_wanted = rank_map.display = True
        else:
            rank_map.cycle_metric()

    def action_map_toggle(self) -> None:
        """``M``: show or hide the map (room for the table on a small terminal)."""
        rank_map = self.query_one(RankMap)
        self._map_wanted = rank_map.display = not rank_map.display

    def action_kernels(self) -> None:
        """Open the kernel screen of the selected rank (Enter)."""
        from flowtop.tui.screens.kernel_screen import KernelScreen

        if (sel := self._selected()) is not None:
            self.app.push_screen(KernelScreen(*sel))

    def action_kernels_now(self) -> None:
        """Ask the selected rank for a kernel window now (``k``)."""
        if (sel := self._selected()) is not None:
            self.flowtop.request_kernels(*sel)

    def action_detail(self) -> None:
        """Open the detail screen of the selected rank (``d``)."""
        from flowtop.tui.screens.rank_detail_screen import RankDetailScreen

        if (sel := self._selected()) is not None:
            self.app.push_screen(RankDetailScreen(*sel))

    def action_job_kernels(self) -> None:
        """Open the job's merged kernel view (``j``)."""
        from flowtop.tui.screens.job_kernel_screen import JobKernelScreen

        if self._job is not None:
            self.app.push_screen(JobKernelScreen(self._job.job))

    def action_next_job(self) -> None:
        """Show the next job (``n``)."""
        snap = self.flowtop.latest
        if snap is None or len(snap.jobs) < 2:
            return
        names = [j.job for j in snap.jobs]
        i = names.index(self.job_name) if self.job_name in names else -1
        self.job_name = names[(i + 1) % len(names)]
        self.show(snap)
