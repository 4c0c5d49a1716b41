"""Shared behaviour of flowtop's screens: follow the latest snapshot."""

from __future__ import annotations

from operator import attrgetter
from typing import Protocol

from textual.screen import Screen

from flowtop.monitor.claims import newest_per, rank_newness
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot
from flowtop.tui.widgets._messages import SnapshotUpdated


class ScreenHost(Protocol):
    """What a screen uses of the app (flowtop.tui.app.FlowtopApp): screens sit below the app."""

    latest: MonitorSnapshot | None
    source_error: str
    can_capture: bool

    def request_kernels(self, job: str, rank: int) -> None: ...


def find_job(snap: MonitorSnapshot | None, job: str | None) -> JobSnapshot | None:
    """The job named ``job`` (or the first job when ``job`` is None)."""
    if snap is None or not snap.jobs:
        return None
    if job is None:
        return snap.jobs[0]
    return next((j for j in snap.jobs if j.job == job), None)


_STATUS_RANK = {"live": 0, "stalled": 1, "stale": 2, "done": 3, "stopped": 4, "failed": 5}


def pick_rank(job: JobSnapshot | None, rank: int) -> RankSnapshot | None:
    """The instance of ``rank`` to show: a live one first, then the newest incarnation.

    A restarted rank appears once per incarnation; screens follow the rank number,
    not one process, so a restart does not leave the user on a dead view.
    """
    if job is None:
        return None

    def live_then_newest(r: RankSnapshot) -> tuple[int, int, float]:
        return (-_STATUS_RANK.get(r.status, 4), *rank_newness(r))

    found = (r for r in job.ranks if r.rank == rank)
    return newest_per(found, attrgetter("rank"), live_then_newest).get(rank)


class SnapshotScreen(Screen[None]):
    """A screen that re-renders whenever the app posts a :class:`SnapshotUpdated`.

    Only the active screen receives the message; a screen that becomes active
    again renders the app's latest snapshot at once.
    """

    @property
    def flowtop(self) -> ScreenHost:
        """The running app, typed."""
        return self.app  # type: ignore[return-value]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``k`` (a kernel window now) only where the ranks can be asked: hidden in a replay."""
        return action != "kernels_now" or self.flowtop.can_capture

    def show(self, snap: MonitorSnapshot | None) -> None:
        """Render ``snap`` (None: nothing received yet). Subclasses implement."""
        raise NotImplementedError

    def on_mount(self) -> None:
        self.show(getattr(self.app, "latest", None))

    def on_screen_resume(self) -> None:
        self.show(getattr(self.app, "latest", None))

    def on_snapshot_updated(self, message: SnapshotUpdated) -> None:
        latest = getattr(self.app, "latest", None)
        if latest is not None and message.snapshot is not latest:
            return  # a newer snapshot arrived while this one waited: its own message follows
        self.show(message.snapshot)
