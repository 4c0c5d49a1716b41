"""Recordings: the raw frames a monitor received, with receive times, to replay later.

The file (its format, writer and reader) is flowtop.monitor.recfile's; its names are here too.
Replaying feeds the frames through the same decoder and model as live
data, interleaved with ticks on the same instants, so a recording reproduces
what the monitor showed — hints included, without taking a snapshot (and a
hostile frame in it is rejected again, never trusted). No Textual here.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from flowtop.monitor.clock import TICK_S
from flowtop.monitor.model import Model
from flowtop.monitor.rankkernels import decode_frame
from flowtop.monitor.relayrecord import RelayedBatch, relayed_of
from flowtop.monitor.recfile import (MAGIC, MAGIC_V1, MAX_RECORD, EndMarker, Recorder, RecordingError, read_frames,
                                     read_recording)
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.thinning import spread_of
from flowtop.monitor.ticker import Ticker
from probe import wire

if TYPE_CHECKING:
    from flowtop.monitor.datathread import UiTurn

__all__ = ["MAGIC", "MAGIC_V1", "MAX_RECORD", "EndMarker", "Recorder", "RecordingError", "read_frames",
           "read_recording", "Feeder", "feed", "Replayed", "replay", "replay_all", "end_of", "RecordingSource"]


class Feeder:
    """Decodes recorded frames into a model the way the collector did live, kernel byte budget
    included (a window the live monitor refused for its rate is refused again)."""

    def __init__(self, model: Model) -> None:
        from flowtop.monitor.limits import KernelBudget

        self.model = model
        self._now = 0.0
        self._budget = KernelBudget(model.limits, lambda: self._now, lambda: model.spread)
        self.records = 0  # fed so far: the record number a refusal names
        self._relayed: tuple[str, list[float]] | None = None  # the batch being fed: its relay, its frames' times

    def __call__(self, frame: bytes, now: float) -> None:
        self._now = now
        self.records += 1
        spread = spread_of(frame)
        if spread is not None:  # applied as the live collector applied it, at that instant
            self.model.set_spread(spread)
            self._budget.respread(now)
            return
        batch = relayed_of(frame)
        if batch is not None:  # the next frames came in this relay batch: unstamped as live
            self._relayed = self._unstamp(batch, now)
            return
        via = at = None
        if self._relayed is not None:
            via, times = self._relayed
            at = times.pop()
            if not times:
                self._relayed = None
        # A frame that does not decode is said with its place: a damaged file's, or a peer's
        # that the live monitor refused too (its bucket is the live one's).
        feed(self.model, frame, now, self._budget, where=f"record {self.records} ({now:.1f} s): ", via=via, at=at)

    def _unstamp(self, batch: RelayedBatch, now: float) -> tuple[str, list[float]] | None:
        """The batch's relay and its frames' times, last first (None: none follow, as live)."""
        try:
            via, times = self.model.relays.stamp_times(batch.stamp, batch.frames, now, now + batch.taken_after_s)
        except wire.WireError as exc:  # refused live too: its frames were not recorded
            self.model.reject(str(exc), f"record {self.records} ({now:.1f} s): ")
            return None
        return (via, times[::-1]) if times else None


def feed(model: Model, frame: bytes, now: float, admit: wire.Admit | None = None, where: str = "",
         via: str | None = None, at: float | None = None) -> None:
    """Decode one frame into ``model`` the way the collector does (``where``: its place, said
    before the reason of a refusal; ``via``, ``at``: its relay and the time it counts at)."""
    try:
        msg = decode_frame(frame, model.builds_kernels, model.knows, admit)
    except wire.WireError as exc:
        model.reject(str(exc), where)
        return
    try:
        model.ingest(msg, now if at is None else at, via)
    except Exception as exc:
        model.reject(f"ingest: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Replayed:
    """What :func:`replay` ends with: the snapshot, and whether the recording was whole."""

    snapshot: MonitorSnapshot
    #: False where the recording stops before its end as written (cut short, no end marker, stopped
    #: early, a damaged record): replayed up to there, said in the model's notices. A format 1 file
    #: (no marker: not known) counts as whole.
    whole: bool


def replay_all(path: str | Path, model: Model,
               on_tick: Callable[[MonitorSnapshot], None] | None = None) -> MonitorSnapshot:
    """:func:`replay`'s snapshot."""
    return replay(path, model, on_tick).snapshot


def replay(path: str | Path, model: Model, on_tick: Callable[[MonitorSnapshot], None] | None = None) -> Replayed:
    """Feed a whole recording, ticking the model every :data:`~flowtop.monitor.clock.TICK_S` of recorded
    time as the live monitor did (hints evolve as they did live; ``on_tick`` sees each tick's
    snapshot), and return the state at its last frame with the hints of the first tick after
    it (the tick that saw the last frames: byes end their hints there); a whole recording goes on
    to when its monitor closed it (its end marker), ticked as live: ranks that fell silent before
    are stale there, as the live monitor showed them at its end."""
    where = f"replay:{path}"
    ticker = Ticker(lambda at: model.tick(at, where), 0.0, TICK_S)
    feeder = Feeder(model)
    last = 0.0
    ending = Ending()
    for t, frame in read_recording(path, ending.cut, ending.note, ending.ended):
        _ticks(ticker, t, on_tick)
        feeder(frame, t)
        last = t
    ending.tell(model, last)
    stop = ending.stop(last)
    _ticks(ticker, max(end_of(last), stop), on_tick)
    model.flush_notices(ticker.last)  # a failure less than a second before the end: said
    return Replayed(model.snapshot(stop, where), ending.whole)


class Ending:
    """What a reader said of how a recording ends (read_recording's ``on_cut`` and ``on_note``),
    kept to be told where a replay reaches its end: a cut as a warning, a note as information."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []
        #: Nothing cut it short so far (a note is no cut); kept when :meth:`tell` clears ``said``.
        self.whole = True
        #: Recorded seconds at which its monitor closed it (its end marker), when it has one.
        self.closed_at: float | None = None

    def cut(self, text: str) -> None:
        self.said.append(("warning", text))
        self.whole = False

    def note(self, text: str) -> None:
        self.said.append(("information", text))

    def ended(self, end: EndMarker) -> None:
        self.closed_at = end.seconds

    def stop(self, last: float) -> float:
        """Where a replay whose last frame is at ``last`` ends: when the monitor closed the
        recording, for a whole one (a cut one ends at its last frame: what came after is not known)."""
        if self.whole and self.closed_at is not None:
            return max(last, self.closed_at)
        return last

    def tell(self, model: Model, at: float) -> None:
        """Raise the notices on ``model``'s board, once."""
        for severity, text in self.said:
            model.notices.add(severity, text, at)
        self.said.clear()


def end_of(last: float) -> float:
    """The instant of the first tick after a recording's last frame (at ``last``): where the
    live monitor showed that frame first, and where a replay ends."""
    return TICK_S * (math.floor(last / TICK_S) + 1)


def _ticks(ticker: Ticker, t: float, on_tick: Callable[[MonitorSnapshot], None] | None) -> None:
    """Run the ticks due before a frame received at ``t`` (a tick at exactly ``t`` comes first,
    as live), one by one so that ``on_tick`` sees each."""
    while t >= ticker.next_at:
        snap = ticker.catch_up(ticker.next_at)
        if on_tick is not None and snap is not None:
            on_tick(snap)


class RecordingSource:
    """A data source for the TUI that plays a recording back at ``speed``, on the data thread:
    frames and ticks in recorded order, each when its (scaled) time comes."""

    #: A recording cannot ask its ranks for anything (the ``k`` key is hidden).
    can_capture = False

    def __init__(self, path: str | Path, model: Model, speed: float = 1.0) -> None:
        self.path = Path(path)
        self.model = model
        self.speed = speed
        self._records: list[tuple[float, bytes]] = []
        self._next = 0
        #: What cut the recording short (read_recording's words), said when playback reaches the cut.
        self._ending = Ending()
        self._start: float | None = None
        self._worker: Any = None  # flowtop.monitor.kernel_worker.KernelWorker while playing
        self._where = f"replay:{self.path.name}"
        self.ticker = Ticker(lambda at: model.tick(at, self._where), 0.0, TICK_S)
        self._feed = Feeder(model)
        self._end: float | None = None  # recorded time playback stops at (a tick after the last frame)
        self._task: asyncio.Task[None] | None = None
        #: Called with each tick's snapshot (the data thread hands it to the UI).
        self.on_tick: Callable[[MonitorSnapshot], None] | None = None
        #: The UI's turn at the interpreter (set by flowtop.monitor.datathread.DataThread): given
        #: as the live collector gives it, by the playing task alone (not by a refresh the UI
        #: waits for): at each wake-up, before ticks and every 16 frames.
        self.ui_turn: UiTurn | None = None

    async def start(self) -> None:
        """Load the recording (errors surface here, before the UI shows anything); kernel windows
        are then built off the data loop, as the live collector builds them."""
        # A cut is said when playback reaches it: said at the start, its notice had gone long
        # before the ranks froze at the cut, looking live (a new user's trial).
        self._records = list(read_recording(self.path, self._ending.cut, self._ending.note, self._ending.ended))
        last = self._records[-1][0] if self._records else 0.0
        self._end = max(end_of(last), self._ending.stop(last))  # to its monitor's close when whole
        self._start = time.monotonic()
        if self.model.builds_kernels:
            from flowtop.monitor.kernel_worker import KernelWorker
            from flowtop.monitor.rankkernels import build_window

            self._worker = KernelWorker(self.model, build_window)
            self.model.offload_kernels(self._worker.submit)
        self._task = asyncio.get_running_loop().create_task(self._play())

    def _virtual(self) -> float:
        start = self._start if self._start is not None else time.monotonic()
        virtual = (time.monotonic() - start) * self.speed
        return min(virtual, self._end) if self._end is not None else virtual

    def catch_up(self, give: bool = False) -> float:
        """Feed the frames and run the ticks due by now (scaled by speed), in recorded order;
        the last tick's snapshot goes to :attr:`on_tick`. Returns the recorded time now. ``give``
        (the playing task): the UI's turn before each tick and every 16 frames, which may wait
        up to its limit (flowtop.monitor.datathread.UI_TURN_S) each time."""
        virtual = self._virtual()
        ticked = None
        fed = 0
        while True:
            t = self._records[self._next][0] if self._next < len(self._records) else None
            if self.ticker.next_at <= virtual and (t is None or self.ticker.next_at <= t):
                if give:
                    self._give()
                ticked = self.ticker.catch_up(self.ticker.next_at)
            elif t is not None and t <= virtual:
                self._feed(self._records[self._next][1], t)
                self._next += 1
                fed += 1
                if give and fed % 16 == 0:
                    self._give()
            else:
                break
        if self._next >= len(self._records):
            self._ending.tell(self.model, virtual)
        if ticked is not None and self.on_tick is not None:
            self.on_tick(ticked)
        return virtual

    def _give(self) -> None:
        """Wait while the UI renders the last snapshot (its turn; see UiTurn)."""
        if self.ui_turn is not None:
            self.ui_turn.give()

    async def _play(self) -> None:
        """Advance whenever the next frame or tick is due (at most a tick's real time apart)."""
        while self._end is not None and self.ticker.next_at <= self._end:
            self._give()  # as the collector at each wake-up: the frames due now share no turn
            self.catch_up(give=True)
            t = self._records[self._next][0] if self._next < len(self._records) else float("inf")
            due = min(t, self.ticker.next_at)
            await asyncio.sleep(min(TICK_S, max(0.0, (due - self._virtual()) / self.speed)))
        self.model.flush_notices(self.ticker.last)  # a failure under a second before the end: said

    def snapshot(self) -> MonitorSnapshot:
        """A snapshot at the recorded time now, after feeding what is due (held at the end)."""
        virtual = self.catch_up()
        return self.model.snapshot(virtual, self._where)

    @property
    def notices(self) -> Any:
        """Monitor-side errors for the user (the model's flowtop.monitor.notices board)."""
        return self.model.notices

    def request_kernels(self, job: str, rank: int) -> None:
        """A recording cannot be asked for anything."""

    async def stop(self) -> None:
        """Stop playing and building kernel windows."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._worker is not None:
            self._worker.close()
            self._worker = None
            self.model.build_kernels_here()
