"""KernelScreen: the latest kernel window of one rank."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from flowtop.monitor.snapshot import MonitorSnapshot, RankSnapshot
from flowtop.tui.screens.snapshot_screen import SnapshotScreen, find_job, pick_rank
from flowtop.tui.widgets._format import fmt_int, fmt_us
from flowtop.tui.widgets._kernels import WindowView, window_view
from flowtop.tui.widgets.category_bar import CategoryBar
from flowtop.tui.widgets.kernel_anatomy import KernelAnatomy
from flowtop.tui.widgets.kernel_table import SORTS, KernelTable
from flowtop.tui.widgets.status_footer import StatusFooter


def kernel_title(r: RankSnapshot | None, view: WindowView | None, job: str, rank: int) -> Text:
    """Whose kernels, on which device, from which window; CPU runs say so.

    The sort column is marked in the table header (▼ largest first, ▲ reversed).
    """
    out = Text(no_wrap=True, overflow="ellipsis")
    if r is None:
        out.append(f"rank {rank} of {job}: not seen in the latest snapshot", style="yellow")
        return out
    # The window says "cpu"; a rank's device string may carry detail ("cpu (x86_64)").
    cpu = (view.device if view else r.device).startswith("cpu")
    out.append("CPU operators" if cpu else "GPU kernels", style="bold")
    out.append(f" · rank {r.rank} {r.host.split('.')[0]}")
    if cpu:
        out.append(" · device cpu (no GPU: host operator times)", style="yellow")
    if view is None:
        out.append(" · no window yet", style="dim")
        return out
    window = f"window {view.window}" if view.window is not None else "window"
    at = f" @ step {fmt_int(view.step)}" if view.step is not None else ""
    out.append(f" · {window}{at} · step {fmt_us(view.step_us)}")
    if view.step_basis == "device":
        # the host queued the step faster than the GPU ran it: shares are of the device's span
        out.append(" (device span: the GPU ran behind the host)", style="dim")
    return out


#: Column key -> index into SORTS of the sort a click on its header picks.
HEADER_SORTS = {**{key: i for i, (key, _, _) in enumerate(SORTS)}, "share": 0}


class KernelScreen(SnapshotScreen):
    """Sortable kernel table, category bar and anatomy of one rank's window."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("r", "reverse", "Reverse"),
        Binding("k", "kernels_now", "Capture"),
        *(Binding(str(i + 1), f"sort({i})", f"sort by {label}", show=False) for i, (_, label, _) in enumerate(SORTS)),
    ]

    def __init__(self, job: str, rank: int) -> None:
        super().__init__()
        self.job_name = job
        self.rank = rank
        self.view: WindowView | None = None
        self._rank: RankSnapshot | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="kernel-title")
        yield CategoryBar(id="categories")
        yield KernelAnatomy(id="anatomy")
        yield KernelTable(id="kernels")
        yield Static(id="kernel-full")
        yield StatusFooter()

    def show(self, snap: MonitorSnapshot | None) -> None:
        r = pick_rank(find_job(snap, self.job_name), self.rank)
        self._rank = r
        self.view = window_view(r.kernels, r.kernels_cumulative) if r else None
        self._title()
        self.query_one(CategoryBar).show(self.view)
        self.query_one(KernelAnatomy).show(self.view)
        self.query_one(KernelTable).show(self.view.rows if self.view else ())
        self._full_name()

    def _full_name(self) -> None:
        """The full name and cumulative figures of the kernel under the cursor."""
        row = self.query_one(KernelTable).selected
        out = Text(overflow="ellipsis")
        if row is not None:
            out.append(row.name)
            if row.cum_windows:
                out.append(f"  · {row.cum_calls:,} calls in {row.cum_windows} windows", style="dim")
        self.query_one("#kernel-full", Static).update(out)

    def on_data_table_row_highlighted(self, event: KernelTable.RowHighlighted) -> None:
        self._full_name()

    def _title(self) -> None:
        self.query_one("#kernel-title", Static).update(kernel_title(self._rank, self.view, self.job_name, self.rank))

    def on_data_table_header_selected(self, event: KernelTable.HeaderSelected) -> None:
        """A click on a column header sorts by that column (a second click reverses it); the
        window share sorts as time does, the category not at all."""
        key = str(event.column_key.value)
        index = HEADER_SORTS.get(key)
        if index is not None:
            event.stop()
            self.action_sort(index)

    def action_sort(self, index: int) -> None:
        """Sort by column ``index`` of :data:`SORTS` (keys 1-6)."""
        table = self.query_one(KernelTable)
        if table.sort_index == index:
            table.reverse = not table.reverse
        else:
            table.reverse = False
            table.sort_index = index
        self._title()

    def action_cycle_sort(self) -> None:
        """Next sort column (``s``)."""
        table = self.query_one(KernelTable)
        table.reverse = False
        table.sort_index = (table.sort_index + 1) % len(SORTS)
        self._title()

    def action_reverse(self) -> None:
        """Flip the order (``r``)."""
        table = self.query_one(KernelTable)
        table.reverse = not table.reverse
        self._title()

    def action_kernels_now(self) -> None:
        """Ask this rank for a new kernel window (``k``)."""
        self.flowtop.request_kernels(self.job_name, self.rank)
