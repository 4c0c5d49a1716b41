"""Messages the app posts to its screens (toolong style: data arrives as messages)."""

from __future__ import annotations

from textual.message import Message

from flowtop.monitor.snapshot import MonitorSnapshot


class SnapshotUpdated(Message):
    """A new immutable :class:`MonitorSnapshot` to render.

    Posted by :class:`flowtop.tui.app.FlowtopApp` to the active screen about twice a
    second; handlers are named ``on_snapshot_updated``. None: still nothing received, but what
    the screen shows beside it changed (the source failed to start: the header says why).
    """

    def __init__(self, snapshot: MonitorSnapshot | None) -> None:
        self.snapshot = snapshot
        super().__init__()


class DataReady(Message):
    """The data thread left something in the app's mailbox (a snapshot, notices).

    Posted from the data thread only when the mailbox goes from empty to full, so at most one
    waits in the app's queue; the handler takes the newest snapshot, whatever came meanwhile.
    """
