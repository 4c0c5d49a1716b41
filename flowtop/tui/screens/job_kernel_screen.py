"""JobKernelScreen: a job's kernels merged over its ranks."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.tui.screens.snapshot_screen import SnapshotScreen, find_job
from flowtop.tui.widgets._kernels import JobKernelView, job_view
from flowtop.tui.widgets.job_kernel_table import JobKernelTable
from flowtop.tui.widgets.status_footer import StatusFooter


#: Most characters of the job id the title shows (a longer one loses its middle): the title's
#: first line stays within 80 columns with the sort and the uneven count (a 36-character uuid
#: pushed them off screen at 100).
JOB_ID_WIDTH = 24


def elide_middle(text: str, width: int) -> str:
    """``text`` within ``width`` characters, its middle replaced by "…" (both ends of an id tell it apart)."""
    if len(text) <= width:
        return text
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def job_kernel_title(job: str, view: JobKernelView | None, ranks_total: int, by_mean: bool) -> Text:
    """Two lines: the job, the uneven mark's count and the order (what must show at 80 columns);
    then which ranks are merged and what the cells are."""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("job kernels", style="bold")
    out.append(f" · {elide_middle(job, JOB_ID_WIDTH)}")
    if view is None:
        out.append("\nneeds kernel windows from 2+ ranks (k on a rank asks for one)", style="dim")
        return out
    flagged = sum(1 for r in view.rows if r.flagged)
    out.append(f" · ◆ uneven: {flagged}", style="red" if flagged else "dim")
    out.append(f" · by {'mean time' if by_mean else 'max − min'}", style="dim")
    out.append(f"\n{len(view.ranks)}/{ranks_total} ranks merged · time per window, mean of all windows", style="dim")
    return out


class JobKernelScreen(SnapshotScreen):
    """Merged kernel table of one job; kernels that differ most between ranks are marked.

    ``spread`` is (max − min) ÷ mean over the ranks, ``max@`` the rank with the most time;
    ◆ marks what ``merge.merge_cumulative`` flags (spread and absolute difference both large, the
    difference ≥ 4 standard errors of the ranks' window-to-window scatter).
    """

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "toggle_sort", "Sort"),
    ]

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job_name = job
        self.view: JobKernelView | None = None
        self._ranks_total = 0

    def compose(self) -> ComposeResult:
        yield Static(id="job-kernel-title")
        yield JobKernelTable(id="job-kernels")
        yield StatusFooter()

    def show(self, snap: MonitorSnapshot | None) -> None:
        job = find_job(snap, self.job_name)
        self.view = job_view(job.kernels_merged) if job else None
        self._ranks_total = job.ranks_seen if job else 0
        self._title()
        self.query_one(JobKernelTable).show(self.view.rows if self.view else ())

    def _title(self) -> None:
        by_mean = self.query_one(JobKernelTable).by_mean
        self.query_one("#job-kernel-title", Static).update(
            job_kernel_title(self.job_name, self.view, self._ranks_total, by_mean)
        )

    def on_data_table_header_selected(self, event: JobKernelTable.HeaderSelected) -> None:
        """A click on ``mean`` orders by mean time, on ``min``/``max``/``spread`` by max − min."""
        key = str(event.column_key.value)
        if key in ("mean", "min", "max", "spread"):
            event.stop()
            self.query_one(JobKernelTable).by_mean = key == "mean"
            self._title()

    def action_toggle_sort(self) -> None:
        """Order by max − min or by mean time (``s``)."""
        table = self.query_one(JobKernelTable)
        table.by_mean = not table.by_mean
        self._title()
