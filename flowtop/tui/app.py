"""The Textual monitor: renders the snapshots its data thread hands over.

The app never touches sockets or the monitor's model. It is given a data source (the live
collector, a recording, a prepared list) and hosts it on a :class:`~flowtop.monitor.datathread.DataThread`
— its own thread and asyncio loop — which ticks the model at a fixed cadence (about 2 Hz) and
leaves each snapshot in a latest-wins mailbox. A :class:`DataReady` message wakes the app, which
takes the newest snapshot and posts it as :class:`SnapshotUpdated` to the active screen; screens
hand the parts to their widgets, which only render what they are given. Monitor-side errors come
the same way and are shown as notifications. Commands (``k``) go to the data thread as callables.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from flowtop import settings
from flowtop.monitor.datathread import DataSource, DataThread, Delivery, UiTurn
from flowtop.monitor.kernel_asks import KernelAsk
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.tui.screens.help_screen import HelpScreen
from flowtop.tui.screens.main_screen import MainScreen
from flowtop.tui.widgets import _strip_cycles
from flowtop.tui.widgets._messages import DataReady, SnapshotUpdated

__all__ = ["FlowtopApp", "SnapshotSource", "SnapshotUpdated"]

#: Signals that quit the app as ``q`` does (a ``kill``, a closed SSH session), as the commands run
#: it: see FlowtopApp's ``quit_on``.
QUIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: Seconds a signalled app has to stop before the signal is taken as it would have been without
#: it (the process dies): a UI loop that hangs must not make it unkillable but by SIGKILL.
QUIT_GRACE_S = 15.0

#: The data source protocol (kept under its old name: sources written for it still fit).
SnapshotSource = DataSource
#: Seconds a notification of an error stays on screen.
ERROR_TIMEOUT_S = 15
#: Seconds a ``k`` press's toast shows; the same words again within it are not said twice.
KERNELS_TOAST_S = 3.0


class FlowtopApp(App[None]):
    """flowtop's terminal UI.

    Args:
        source: Provider of snapshots (see :class:`~flowtop.monitor.datathread.DataSource`), hosted on
            the data thread.
        refresh_s: Seconds between two snapshots (0 disables the cadence; tests then call
            :meth:`refresh_snapshot` themselves).
        quit_on: Signals that quit the app as ``q`` does while it runs (the commands pass
            QUIT_SIGNALS): its source stops first, so a recording's last frames are flushed and
            the terminal is given back, where the signal's default action killed the process with
            both undone. A signal the process ignores (``nohup``) stays ignored; a second one, or
            the first after QUIT_GRACE_S, is taken as before (the process dies of it).
    """

    CSS_PATH = "flowtop.tcss"
    TITLE = "flowtop"
    # The footer needs the columns on an 80-wide terminal; flowtop has no commands to search.
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("p", "save_svg", "Screenshot", show=False),
    ]

    def __init__(self, source: DataSource, *, refresh_s: float = 0.5,
                 quit_on: tuple[signal.Signals, ...] = ()) -> None:
        super().__init__()
        self.quit_on = quit_on
        self._handled: dict[signal.Signals, object] = {}  # signal -> the handler it had before
        self._grace: threading.Timer | None = None  # a quit signal's deadline (see _quit_signalled)
        _strip_cycles.install()  # the lines it replaces are freed at once, not at a full collection
        self.source = source
        self.refresh_s = refresh_s
        #: Whether the ranks can be asked for a kernel window (``k``; not in a replay).
        self.can_capture = source.can_capture
        self._kernels_said = ("", -KERNELS_TOAST_S)  # the last ``k`` toast's words, and when
        if hasattr(source, "glances"):
            source.glances = True  # a person watching: steps between ticks too (flowtop.monitor.collector)
        #: The thread that hosts the source; only it calls into the source.
        self.data = DataThread(source, cadence_s=refresh_s, wake=self._wake, ui_turn=UiTurn())
        #: The snapshot shown now (None until the first one arrives).
        self.latest: MonitorSnapshot | None = None
        #: Why the source failed to start or the last snapshot failed ("" when it did not).
        self.source_error = ""
        #: Snapshots rendered (the mailbox counts those dropped because a newer one came first).
        self.delivered = 0
        self._stopped = False

    def get_default_screen(self) -> Screen:
        return MainScreen()

    def _wake(self) -> None:
        """Called on the data thread: post_message is thread-safe."""
        self.post_message(DataReady())

    async def on_mount(self) -> None:
        self._catch_quit_signals()
        try:
            await asyncio.wrap_future(self.data.start())
        except Exception as exc:  # show it; the UI stays up so the user can read it
            # The source's own words where it has them ("cannot bind ADDR: ..."): the header shows them.
            self.source_error = getattr(self.source, "start_error", "") or f"{type(exc).__name__}: {exc}"
            self.notify(f"source failed to start: {self.source_error}", severity="error", timeout=30, markup=False)
            if self.screen_stack:  # the screen may have rendered "waiting for ranks" before: it says why not
                self.screen.post_message(SnapshotUpdated(self.latest))
            return
        try:
            await asyncio.wrap_future(self.data.refresh())  # the first snapshot at once
        except Exception as exc:
            self._snapshot_failed(exc)
        self._deliver(self.data.mailbox.take())

    def on_data_ready(self, message: DataReady) -> None:
        self._deliver(self.data.mailbox.take())

    def _deliver(self, delivery: Delivery) -> None:
        if self._stopped or not self.screen_stack:
            self._turn_done()
            return  # closing: nothing left to render on
        for n in delivery.notices:
            # Plain text, never Textual markup (every notify here): a failed rank's exception, gloo's
            # "[/__w/pytorch/.../pair.cc:553] Connection closed by peer", read as a closing tag,
            # raised MarkupError and took the whole TUI down (a trial's relayed 2-node run).
            timeout = ERROR_TIMEOUT_S if n.severity == "error" else 6
            self.notify(n.text, severity=n.severity, timeout=timeout, markup=False)  # type: ignore[arg-type]
        if delivery.snapshot is not None:
            self.source_error = ""
            self.latest = delivery.snapshot
            self.delivered += 1
            self.screen.post_message(SnapshotUpdated(delivery.snapshot))
            # The data thread's turn again once the screen showed and repainted it (two hops: the
            # first runs when the screen has shown it, before its widgets have said, on their own
            # idle, what to repaint; the second after that repaint).
            if not self.call_after_refresh(self._after_show, delivery.turn):
                self._turn_done(delivery.turn)

    def _after_show(self, turn: int) -> None:
        if not self.call_after_refresh(self._turn_done, turn):
            self._turn_done(turn)

    def _turn_done(self, turn: int | None = None) -> None:
        if self.data.ui_turn is not None:
            self.data.ui_turn.end(turn)

    def refresh_snapshot(self) -> MonitorSnapshot | None:
        """Have the data thread take a snapshot now and show it (tests, with ``refresh_s=0``).

        Waits for the data thread; the live UI never calls it (its snapshots come by message)."""
        try:
            self.data.refresh().result(30)
        except Exception as exc:  # a broken source must not kill the UI
            self._snapshot_failed(exc)
            return None
        self._deliver(self.data.mailbox.take())
        return self.latest

    def _snapshot_failed(self, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error != self.source_error:
            self.source_error = error
            self.notify(f"snapshot failed: {error}", severity="error", timeout=10, markup=False)

    def request_kernels(self, job: str, rank: int) -> None:
        """Ask one rank for a kernel window now (the ``k`` key); the data thread sends it."""
        if not self.can_capture:
            self.notify("a recording cannot be asked for a kernel window", timeout=3)
            return
        asked = asyncio.wrap_future(self.data.request_kernels(job, rank))
        asked.add_done_callback(lambda fut: self._kernels_asked(fut, job, rank))

    def _kernels_asked(self, fut: asyncio.Future[KernelAsk | None], job: str, rank: int) -> None:
        """Say what became of a ``k`` press (sent, folded into the request already made, or over
        the monitor's budget: flowtop.monitor.kernel_asks); a failure was said by the data thread.
        A held key says each thing once while its toast shows, not 25 toasts a second."""
        if fut.cancelled() or fut.exception() is not None:
            return
        ask = fut.result() or KernelAsk(True, f"asked rank {rank} of {job} for a kernel window")
        now = time.monotonic()
        if self._kernels_said[0] == ask.text and now - self._kernels_said[1] < KERNELS_TOAST_S:
            return
        self._kernels_said = (ask.text, now)
        self.notify(ask.text, severity=ask.severity, timeout=KERNELS_TOAST_S, markup=False)

    def action_save_svg(self) -> None:
        """Save an SVG screenshot of the screen on show (``p``, for bug reports) and say where:
        ``$FLOWTOP_SCREENSHOT_DIR`` or the current directory."""
        import os
        import time

        directory = settings.SCREENSHOT_DIR.read() or os.getcwd()
        stem = f"flowtop-{time.strftime('%Y%m%d-%H%M%S')}-{type(self.screen).__name__}"
        name, n = f"{stem}.svg", 1
        while os.path.exists(os.path.join(directory, name)):
            n += 1
            name = f"{stem}-{n}.svg"
        try:
            path = self.save_screenshot(name, directory)
        except OSError as exc:
            self.notify(f"screenshot not saved: {exc.strerror or exc} ({directory})", severity="error", timeout=8,
                        markup=False)
            return
        self.notify(f"screenshot saved to {os.path.abspath(path)}", timeout=8, markup=False)

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
        self._release_quit_signals()
        if self.is_headless:  # no terminal to give back: quit in time (see run_async)
            self._cancel_grace()

    async def run_async(self, **kwargs: Any) -> Any:
        """Run as Textual does; a quit signal's grace (QUIT_GRACE_S) lasts until the terminal is
        given back: a terminal gone while frames were drawn (an SSH session dropped with ranks
        talking) left Textual's writer blocked on it after unmount, and the process alive for
        good — its grace had been cancelled at unmount (a new user's trial)."""
        try:
            return await super().run_async(**kwargs)
        finally:
            self._cancel_grace()  # quit in time: a process that goes on (an embedding) is not killed later

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()

    def _catch_quit_signals(self) -> None:
        """Quit on ``quit_on``'s signals (see the class doc), on this loop between its callbacks."""
        loop = asyncio.get_running_loop()
        for sig in self.quit_on:
            previous = signal.getsignal(sig)
            if previous is signal.SIG_IGN:
                continue  # nohup: the user asked for the process to outlive its terminal
            self._handled[sig] = previous
            loop.add_signal_handler(sig, self._quit_signalled, sig)

    def _quit_signalled(self, sig: signal.Signals) -> None:
        """The first quit signal: quit as on ``q``; the next one, or this one after QUIT_GRACE_S,
        kills as it would have without the app's handlers."""
        self._release_quit_signals()
        timer = self._grace = threading.Timer(QUIT_GRACE_S, signal.raise_signal, (sig,))
        timer.daemon = True
        timer.start()
        self.call_later(self.action_quit)

    def _release_quit_signals(self) -> None:
        """The handlers the signals had before the app took them back in place."""
        handled, self._handled = self._handled, {}
        for sig, previous in handled.items():
            try:
                asyncio.get_running_loop().remove_signal_handler(sig)
            except RuntimeError:  # no loop: nothing of ours to remove
                pass
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)  # type: ignore[arg-type]

    async def _stop_source(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self.data.stopped()
