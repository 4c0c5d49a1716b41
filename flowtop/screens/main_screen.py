"""MainScreen: job header, live rank table and hints."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer

from flowtop.screens.snapshot_screen import SnapshotScreen, find_job
from flowtop.snapshot import JobSnapshot, MonitorSnapshot
from flowtop.widgets.hints_panel import HintsPanel
from flowtop.widgets.job_header import JobHeader
from flowtop.widgets.rank_table import RankTable


class MainScreen(SnapshotScreen):
    """The first screen: one job at a time (``n`` cycles jobs when there are several)."""

    BINDINGS = [
        Binding("k", "kernels_now", "Capture"),
        Binding("d", "detail", "Detail"),
        Binding("j", "job_kernels", "Job kernels"),
        Binding("n", "next_job", "Next job", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.job_name: str | None = None
        self._job: JobSnapshot | None = None

    def compose(self) -> ComposeResult:
        yield JobHeader(id="job-header")
        yield RankTable(id="ranks")
        yield HintsPanel(id="hints")
        yield Footer()

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
        self.query_one(RankTable).show(job)
        self.query_one(HintsPanel).show(job.hints if job else ())

    def _selected(self) -> tuple[str, int] | None:
        rank = self.query_one(RankTable).selected
        if self._job is None or rank is None:
            self.notify("no rank selected", severity="warning", timeout=2)
            return None
        return self._job.job, rank.rank

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_kernels()

    def action_kernels(self) -> None:
        """Open the kernel screen of the selected rank (Enter)."""
        from flowtop.screens.kernel_screen import KernelScreen

        if (sel := self._selected()) is not None:
            self.app.push_screen(KernelScreen(*sel))

    def action_kernels_now(self) -> None:
        """Ask the selected rank for a kernel window now (``k``)."""
        if (sel := self._selected()) is not None:
            self.flowtop.request_kernels(*sel)

    def action_detail(self) -> None:
        """Open the detail screen of the selected rank (``d``)."""
        from flowtop.screens.rank_detail_screen import RankDetailScreen

        if (sel := self._selected()) is not None:
            self.app.push_screen(RankDetailScreen(*sel))

    def action_job_kernels(self) -> None:
        """Open the job's merged kernel view (``j``)."""
        from flowtop.screens.job_kernel_screen import JobKernelScreen

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
