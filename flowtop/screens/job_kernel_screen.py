"""JobKernelScreen: a job's kernels merged over its ranks."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, Static

from flowtop.screens._base import SnapshotScreen, find_job
from flowtop.snapshot import MonitorSnapshot
from flowtop.widgets._kernels import JobKernelView, job_view
from flowtop.widgets.job_kernel_table import SPREAD_MARK, JobKernelTable


def job_kernel_title(job: str, view: JobKernelView | None, ranks_total: int, by_spread: bool) -> Text:
    """Which ranks are merged and what the mark means."""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append("job kernels", style="bold")
    out.append(f" · {job}")
    if view is None:
        out.append(" · needs kernel windows from 2+ ranks (k on a rank asks for one)", style="dim")
        return out
    out.append(f" · {len(view.ranks)}/{ranks_total} ranks merged")
    out.append(f" · ◆ spread ≥ {SPREAD_MARK * 100:.0f}%", style="red")
    out.append(f" · sort {'spread' if by_spread else 'mean'}", style="dim")
    return out


class JobKernelScreen(SnapshotScreen):
    """Merged kernel table of one job; kernels that differ most between ranks are marked."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("s", "toggle_sort", "Sort mean/spread"),
    ]

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job_name = job
        self.view: JobKernelView | None = None
        self._ranks_total = 0

    def compose(self) -> ComposeResult:
        yield Static(id="job-kernel-title")
        yield JobKernelTable(id="job-kernels")
        yield Footer()

    def show(self, snap: MonitorSnapshot | None) -> None:
        job = find_job(snap, self.job_name)
        self.view = job_view(job.kernels_merged) if job else None
        self._ranks_total = job.ranks_seen if job else 0
        self._title()
        self.query_one(JobKernelTable).show(self.view.rows if self.view else ())

    def _title(self) -> None:
        by_spread = self.query_one(JobKernelTable).by_spread
        self.query_one("#job-kernel-title", Static).update(
            job_kernel_title(self.job_name, self.view, self._ranks_total, by_spread)
        )

    def action_toggle_sort(self) -> None:
        """Sort by mean time or by spread (``s``)."""
        table = self.query_one(JobKernelTable)
        table.by_spread = not table.by_spread
        self._title()
