"""The Textual monitor: takes snapshots from a source and hands them to the screens.

The app never touches sockets or the monitor's model. It is given a
:class:`SnapshotSource`; a timer (about 2 Hz) takes ``source.snapshot()`` and posts
it as a :class:`SnapshotUpdated` message to the active screen. Screens hand the
parts to their widgets, which only render what they are given.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from flowtop.screens.help_screen import HelpScreen
from flowtop.screens.main_screen import MainScreen
from flowtop.snapshot import MonitorSnapshot
from flowtop.widgets._messages import SnapshotUpdated

__all__ = ["FlowtopApp", "SnapshotSource", "SnapshotUpdated"]


@runtime_checkable
class SnapshotSource(Protocol):
    """Where the UI gets its data from (the live collector, or a replay)."""

    async def start(self) -> None:
        """Start receiving; called once inside the running event loop (``on_mount``)."""

    def snapshot(self) -> MonitorSnapshot:
        """The latest immutable snapshot (cheap; called about twice a second)."""

    def request_kernels(self, job: str, rank: int) -> None:
        """Ask rank ``rank`` of ``job`` to capture a kernel window now."""

    async def stop(self) -> None:
        """Stop receiving and release sockets; called once when the app closes."""


class FlowtopApp(App[None]):
    """flowtop's terminal UI.

    Args:
        source: Provider of snapshots (see :class:`SnapshotSource`).
        refresh_s: Seconds between two snapshots (0 disables the timer; tests then
            call :meth:`refresh_snapshot` themselves).
    """

    CSS_PATH = "flowtop.tcss"
    TITLE = "flowtop"
    # The footer needs the columns on an 80-wide terminal; flowtop has no commands to search.
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    def __init__(self, source: SnapshotSource, *, refresh_s: float = 0.5) -> None:
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        #: The snapshot shown now (None until the first one arrives).
        self.latest: MonitorSnapshot | None = None
        #: Why the last ``snapshot()`` call failed ("" when it did not).
        self.source_error = ""
        self._started = False
        self._stopped = False

    def get_default_screen(self) -> Screen:
        return MainScreen()

    async def on_mount(self) -> None:
        try:
            await self.source.start()
            self._started = True
        except Exception as exc:  # show it; the UI stays up so the user can read it
            self.source_error = f"source failed to start: {type(exc).__name__}: {exc}"
            self.notify(self.source_error, severity="error", timeout=30)
        self.refresh_snapshot()
        if self.refresh_s > 0:
            self.set_interval(self.refresh_s, self.refresh_snapshot, name="snapshot")

    def refresh_snapshot(self) -> MonitorSnapshot | None:
        """Take one snapshot from the source and post it to the active screen."""
        try:
            snap = self.source.snapshot()
        except Exception as exc:  # a broken source must not kill the UI
            error = f"{type(exc).__name__}: {exc}"
            if error != self.source_error:
                self.source_error = error
                self.notify(f"snapshot failed: {error}", severity="error", timeout=10)
            return None
        self.source_error = ""
        self.latest = snap
        self.screen.post_message(SnapshotUpdated(snap))
        return snap

    def request_kernels(self, job: str, rank: int) -> None:
        """Ask one rank for a kernel window now (the ``k`` key)."""
        try:
            self.source.request_kernels(job, rank)
        except Exception as exc:
            self.notify(f"kernel request failed: {type(exc).__name__}: {exc}", severity="error")
            return
        self.notify(f"asked rank {rank} of {job} for a kernel window", timeout=3)

    def action_help(self) -> None:
        """Show the key help (toggle)."""
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        await self._stop_source()
        self.exit()

    async def on_unmount(self) -> None:
        await self._stop_source()

    async def _stop_source(self) -> None:
        if self._stopped or not self._started:
            return
        self._stopped = True
        try:
            await self.source.stop()
        except Exception:  # closing anyway; nothing useful to show on a dying screen
            pass
