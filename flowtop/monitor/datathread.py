"""The monitor's data thread: its own asyncio loop hosts the data source. No Textual.

The collector (its zmq.asyncio sockets), frame decoding and validation, the model, ticks (hints,
eviction) and kernel-window hand-off all run here; the UI thread never calls into them. What
crosses between the two threads:

* data → UI: a :class:`Mailbox` holding the latest snapshot and the notices raised since the UI
  last looked. Latest wins: a snapshot that the UI did not take before the next one arrived is
  dropped (and counted), never queued, so a slow UI shows the newest state instead of falling
  behind. The data thread calls ``wake`` only when the mailbox goes from empty to full: at most
  one wake-up message waits in the UI's queue, however fast snapshots come.
* UI → data: commands (a kernel-window request for a rank, a refresh) are callables run on the
  data loop through ``call_soon_threadsafe``; their errors come back as notices.
* the interpreter: a snapshot handed to a UI opens its turn (:class:`UiTurn`), and the data thread
  steps aside between frames until the UI has repainted it (at most :data:`UI_TURN_S`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar, runtime_checkable

from flowtop.monitor.clock import TICK_S
from flowtop.monitor.kernel_asks import KernelAsk
from flowtop.monitor.notices import Notice, Notices
from flowtop.monitor.snapshot import MonitorSnapshot

T = TypeVar("T")
#: Notices held for a UI that does not take them (the oldest go).
MAX_NOTICES = 32
#: The longest the data thread steps aside for a UI rendering a snapshot (the 2 Hz refresh's
#: budget): a UI that takes longer, or never says it is done, shares the interpreter again.
UI_TURN_S = 0.1


class UiTurn:
    """The UI thread's turn at the interpreter while it renders a snapshot.

    Both threads are Python: while both want the interpreter lock they take turns of the switch
    interval (5 ms), and a refresh at 4,096 ranks took up to 100-172 ms at the 99th percentile
    live (bench/ingest.py, 4,096 ranks through 512 relays on 2 cores), past the 2 Hz cadence's
    100 ms budget. The lock's time is the same either way: the data thread gives the UI its whole
    refresh at once and takes its own afterwards (its frames wait in the socket's queue, as they
    would behind a tick): refresh p99 down by a fifth in pairs of runs under the same conditions
    (89 -> 70, 100 -> 82, 247 -> 199 ms), the data thread's CPU and the frames' latency unchanged;
    a refresh longer than the turn's limit shares the interpreter again (2026-12-06; README, Scale).

    The data thread begins a turn (:meth:`begin`) as it hands over a snapshot and gives it
    (:meth:`give`) between frames and before ticks; the UI ends it (:meth:`end`) once it has
    repainted. A turn ends by itself after ``limit_s``."""

    def __init__(self, limit_s: float = UI_TURN_S) -> None:
        self.limit_s = limit_s
        self._done = threading.Event()
        self._done.set()
        self._until = 0.0
        self._lock = threading.Lock()  # a turn's number and its end change together
        #: Turns begun (the number of the latest), the data thread's seconds spent giving them,
        #: and turns that ran out.
        self.turns = 0
        self.given_s = 0.0
        self.ran_out = 0

    @property
    def open(self) -> bool:
        """Whether a turn is open (begun, not ended, not run out yet)."""
        return not self._done.is_set() and time.monotonic() < self._until

    def begin(self) -> int:
        """A snapshot goes to the UI now (the data thread): its turn's number, for :meth:`end`."""
        with self._lock:
            self.turns += 1
            self._until = time.monotonic() + self.limit_s
            self._done.clear()
            return self.turns

    def end(self, turn: int | None = None) -> None:
        """The UI repainted the snapshot of ``turn`` (None: whichever is open; any thread). The
        end of an older turn, late (it ran out and the next snapshot's began), ends nothing."""
        with self._lock:
            if turn is None or turn == self.turns:
                self._done.set()

    def give(self) -> float:
        """Wait, without the interpreter lock, while a turn is open (the data thread); the
        seconds waited."""
        if self._done.is_set():
            return 0.0
        left = self._until - time.monotonic()
        if left <= 0.0:
            self.ran_out += 1
            self._done.set()
            return 0.0
        t = time.perf_counter()
        if not self._done.wait(left):
            self.ran_out += 1
            self._done.set()
        waited = time.perf_counter() - t
        self.given_s += waited
        return waited


@runtime_checkable
class DataSource(Protocol):
    """What the data thread hosts: the live collector, a recording, a prepared list (tests).

    A source that ticks by itself (the collector, a recording) also has an ``on_tick`` attribute
    that the data thread sets to receive each tick's snapshot, a ``catch_up()`` that runs the
    ticks due now (before a refresh), and a ``notices`` board (flowtop.monitor.notices); a source without
    ``on_tick`` is asked for ``snapshot()`` once per cadence.
    """

    async def start(self) -> None:
        """Start receiving; called once on the data loop."""

    def snapshot(self) -> MonitorSnapshot:
        """An immutable snapshot now (a pure read; called on the data loop)."""

    #: Whether :meth:`request_kernels` reaches the ranks (False: a recording).
    can_capture: bool

    def request_kernels(self, job: str, rank: int) -> KernelAsk | None:
        """Ask rank ``rank`` of ``job`` to capture a kernel window now (called on the data loop):
        what became of it (None: nothing to say but that it was asked)."""

    async def stop(self) -> None:
        """Stop receiving and release sockets; called once on the data loop."""


@dataclass(frozen=True)
class Delivery:
    """What the UI takes from the mailbox: the newest snapshot (None: none new) and notices."""

    snapshot: MonitorSnapshot | None
    notices: tuple[Notice, ...]
    turn: int = 0  # the UI's turn at the interpreter that the snapshot opened (UiTurn; 0: none)


class Mailbox:
    """Latest-wins hand-over of snapshots and notices from the data thread to the UI."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snap: MonitorSnapshot | None = None
        self._notices: list[Notice] = []
        self._turn = 0
        self._full = False
        #: Snapshots put, taken by the UI, and dropped because a newer one replaced them.
        self.put_count = 0
        self.taken = 0
        self.dropped = 0

    def put(self, snap: MonitorSnapshot | None, notices: tuple[Notice, ...] = (), turn: int = 0) -> bool:
        """Leave ``snap`` (replacing one the UI has not taken; ``turn``: the UI's turn it opened)
        and ``notices``; True when the UI must be woken (the mailbox was empty)."""
        with self._lock:
            if snap is not None:
                self.put_count += 1
                if self._snap is not None:
                    self.dropped += 1
                self._snap = snap
                self._turn = turn
            self._notices.extend(notices)
            del self._notices[:-MAX_NOTICES]
            wake = not self._full and (self._snap is not None or bool(self._notices))
            self._full = self._full or wake
            return wake

    def take(self) -> Delivery:
        """Everything left since the last take (the UI thread calls this)."""
        with self._lock:
            out = Delivery(self._snap, tuple(self._notices), self._turn if self._snap is not None else 0)
            if self._snap is not None:
                self.taken += 1
            self._snap = None
            self._notices = []
            self._full = False
            return out


class DataThread:
    """Runs a :class:`DataSource` on a thread of its own and hands its snapshots over.

    Args:
        source: What to host (see :class:`DataSource`).
        cadence_s: Seconds between two pulls of a source that does not tick by itself, and between
            two checks for due ticks and notices of one that does; 0: only on :meth:`refresh`.
        wake: Called *on the data thread* when the mailbox goes from empty to full (Textual's
            ``post_message`` is thread-safe).
        ui_turn: Given by a UI that renders each snapshot: every snapshot handed over opens a
            turn, which a source that has a ``ui_turn`` attribute (the collector, a replay) gives between
            its frames, until the UI ends it (see :class:`UiTurn`).
    """

    def __init__(self, source: Any, *, cadence_s: float = TICK_S, wake: Callable[[], None] | None = None,
                 name: str = "flowtop-data", ui_turn: UiTurn | None = None) -> None:
        self.source = source
        self.ui_turn = ui_turn
        if ui_turn is not None and hasattr(source, "ui_turn"):
            source.ui_turn = ui_turn
        self.cadence_s = cadence_s
        self.mailbox = Mailbox()
        self.notices = Notices()  # the data thread's own (a command that raised)
        self._wake = wake or (lambda: None)
        self._loop: asyncio.AbstractEventLoop | None = None  # made by start(): an app never run holds none
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._pulse: asyncio.Task[None] | None = None
        self._running = False  # the source started and was not stopped
        self._last: MonitorSnapshot | None = None

    @property
    def latest(self) -> MonitorSnapshot | None:
        """The newest snapshot published (None before the first); any thread may read it (a
        reference to an immutable snapshot): a second reader, such as the Prometheus exporter,
        takes it at its own pace without emptying the UI's mailbox."""
        return self._last

    @property
    def ident(self) -> int | None:
        """The data thread's ident (None before :meth:`start`)."""
        return self._thread.ident

    # --- lifecycle (called from the UI thread) --------------------------------------------

    def start(self) -> concurrent.futures.Future[None]:
        """Start the thread and the source on it; the future fails with the source's start error."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread.start()
        return self._started

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the source (if it started) on its loop, then the loop and the thread. Blocks."""
        loop = self._loop
        if loop is None or not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout)
        except Exception:  # closing anyway
            pass
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)

    async def stopped(self, timeout: float = 10.0) -> None:
        """:meth:`stop` without blocking the caller's event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.stop, timeout)

    # --- commands (called from the UI thread) ---------------------------------------------

    def call(self, fn: Callable[[], T], tell: bool = True) -> concurrent.futures.Future[T]:
        """Run ``fn`` on the data loop; a failure is in the future and, with ``tell`` (nobody
        waits for the future: a key's command), also an error notice."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except Exception as exc:
                fut.set_exception(exc)
                if tell:
                    self._tell(f"{getattr(fn, '__name__', 'command')} failed: {type(exc).__name__}: {exc}")

        if self._loop is None:
            raise RuntimeError("the data thread was not started")
        self._loop.call_soon_threadsafe(run)
        return fut

    def request_kernels(self, job: str, rank: int) -> concurrent.futures.Future[KernelAsk | None]:
        """Ask one rank for a kernel window now (the ``k`` key), on the data loop; the future holds
        what became of it (flowtop.monitor.kernel_asks; None from a source that does not say)."""
        def kernels_now() -> KernelAsk | None:
            ask: KernelAsk | None = self.source.request_kernels(job, rank)
            return ask

        return self.call(kernels_now)

    def refresh(self) -> concurrent.futures.Future[MonitorSnapshot]:
        """Take a snapshot now (after the ticks due) and put it in the mailbox; the future holds it."""
        def refresh() -> MonitorSnapshot:
            catch_up = getattr(self.source, "catch_up", None)
            if catch_up is not None:
                catch_up()
            snap = self.source.snapshot()
            self._publish(snap)
            return snap

        return self.call(refresh, tell=False)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every command queued before this call has run (tests)."""
        self.call(lambda: None).result(timeout)

    # --- the data loop ----------------------------------------------------------------------

    def _main(self) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        loop.create_task(self._begin())
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _begin(self) -> None:
        try:
            await self.source.start()
        except BaseException as exc:
            self._started.set_exception(exc)
            return
        self._running = True
        if hasattr(self.source, "on_tick"):
            self.source.on_tick = self._publish
        if self.cadence_s > 0:
            self._pulse = asyncio.get_running_loop().create_task(self._pulses())
        self._started.set_result(None)

    async def _pulses(self) -> None:
        """Every cadence: pull a snapshot from a source that does not tick by itself; hand over
        notices that were raised meanwhile (a ticking source publishes through on_tick)."""
        ticks = hasattr(self.source, "on_tick")
        while True:
            await asyncio.sleep(self.cadence_s)
            try:
                self._publish(None if ticks else self.source.snapshot())
            except Exception as exc:  # a broken source must not stop the pulses
                self._tell(f"snapshot failed: {type(exc).__name__}: {exc}")

    def _publish(self, snap: MonitorSnapshot | None) -> None:
        """Into the mailbox with the pending notices (on the data loop); wake the UI if needed."""
        if snap is not None and snap is self._last:
            snap = None  # already handed over (a pull that found no new tick)
        if snap is not None:
            self._last = snap
        board = getattr(self.source, "notices", None)
        notices = (board.take() if isinstance(board, Notices) else ()) + self.notices.take()
        if snap is None and not notices:
            return
        # Begun before the UI can take it: its own end cannot come first.
        turn = self.ui_turn.begin() if snap is not None and self.ui_turn is not None else 0
        if self.mailbox.put(snap, notices, turn):
            self._wake()

    def _tell(self, text: str) -> None:
        self.notices.error(text, asyncio.get_running_loop().time())
        self._publish(None)

    async def _shutdown(self) -> None:
        if self._pulse is not None:
            self._pulse.cancel()
        if self._running:
            self._running = False
            await self.source.stop()
