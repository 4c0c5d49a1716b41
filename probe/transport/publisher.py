"""Publisher: bounded deque on the training thread, a daemon sender thread owns the sockets.

The training thread only ever calls :meth:`Publisher.publish` (or appends a step row to its queue
itself: probe.steps.tracker, probe.transport.steprows), which appends a tuple to a bounded deque
(:class:`~probe.transport.steprows.TrainingQueue`) — no locks, no Events (a lock held by a thread
interrupted with KeyboardInterrupt can hang exit), and no syscall but one non-blocking pipe write
when the sender sleeps after a quiet spell (the first step after it; every step when steps are
slower than a second, probe.transport.sender.LOOK_S: faster ones the sender looks for).
Everything else — msgpack encoding, ZeroMQ sends, telemetry sampling, control
messages from the monitor — happens on the sender thread.

This module is the training thread's side and the lifecycle (start, close, fork, the monitor's
pace); the sender thread's loop and its socket choices are :class:`probe.transport.sender.SenderLoop`,
a mixin of :class:`Publisher` (what its rounds send: its base, probe.transport.outbox.Outbox):
publish() stays here, reading this module's globals (``_clock``, ``nudge``). The sender's names are
read where they are defined (``HELLO_S``, ``HELLO_MAX_S``, ``STEPS_ALIVE_S``: probe.transport.outbox;
``LOOK_S``: probe.transport.sender).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

from probe import wire
from probe.wire.pace import DEFAULT_FLUSH_S, pace_for
from probe.wire.pace import MAX_PACED_TICK_S as _MAX_PACED_TICK_S
from probe.wire.pace import paced_interval
from probe.transport.link import OnReadable, Waker, nudge, nudge_pipe
from probe.transport.rounds import REKEY as _REKEY, Item, Round
from probe.transport.steprows import TrainingQueue
from probe.transport.outbox import Pace
from probe.transport.sender import SenderLoop, Tick, _Tick

#: publish()'s clock, a module global: the training thread calls it each step, after a long step
#: has left the caches cold (an attribute lookup less). The wall clock: a frame's timestamp; the
#: sender schedules on the monotonic clock (see probe.transport.rounds.SenderClock).
_clock = time.time

#: The longest a paced periodic job (telemetry) is stretched to by the monitor's pace (see
#: Publisher.paced_interval) when the pace does not say (its ``telemetry_max_s``).
MAX_PACED_TICK_S = _MAX_PACED_TICK_S


class Publisher(SenderLoop):
    """Bounded, never-blocking message queue plus the thread that sends it."""

    # publish()'s attribute, a slot in the object itself: not among the values of the attributes
    # the sender thread writes, whose cache lines another core dirties (a miss for the training
    # thread's publish() at each step). The queue holds the count of appends and the sender's
    # sleep flag (TrainingQueue), which the sender writes in its quiet rounds only. The rest
    # live in __dict__.
    __slots__ = ("_queue", "__dict__", "__weakref__")

    def __init__(
        self,
        key: wire.RankKey,
        addr: str,
        queue_size: int = 10_000,
        max_age_s: float = 2.0,
        curve_dir: str | None = None,
        flush_s: float = DEFAULT_FLUSH_S,
        world_size: int = 1,
    ) -> None:
        self.key = key
        #: Step records wait at most this long and leave as one "steps" frame (wire MINOR 2), so a
        #: rank sends ~1/flush_s frames per second whatever its step rate; other kinds go at once.
        self.flush_s = flush_s
        #: How long they wait while no monitor's pace holds: flush_s, or the pace a monitor asks
        #: of a job of ``world_size`` ranks when that is longer (see :meth:`start_for`).
        self.own_flush_s = flush_s
        self.start_for(world_size)
        #: The monitor's last "pace" command (see probe.transport.outbox.Pace).
        self._pace = Pace()
        self.addr = addr
        self.max_age_s = max_age_s
        self.curve_dir = curve_dir
        #: Its ``asleep``: the sender sleeps with nothing to send after a quiet spell (see
        #: LOOK_S), until the next step's publish() wakes it.
        self._queue = TrainingQueue(queue_size)
        self._queue_size = queue_size
        self._popped = 0  # sender thread only
        self._local: list[Item] = []  # sender thread only
        self._sent = 0  # sender thread only
        self._send_drops = 0  # sender thread only
        self._seq = 0
        self._stop = False
        self._stop_by = 0.0  # monotonic: until when close() waits for the last frames (see close)
        self._ticks: list[_Tick] = []  # may grow while the sender runs
        self._watched: list[tuple[int, OnReadable]] = []  # may grow while the sender runs
        self._again_at = math.inf  # a round asked for by soon() (sender thread, monotonic)
        self._nudge_r = self._nudge_w = -1  # the sender's wake-up pipe, from start() on
        self.waker: Waker | None = None  # the sender's poll (its counts: tests, benchmarks)
        self.rounds = 0  # the sender's rounds; its waits count the empty looks too (see LOOK_S)
        self._control_handlers: list[Callable[[str], None]] = []
        self._thread: threading.Thread | None = None
        self._sock: Any = None  # the sender thread's socket, while it runs
        self._round: Round | None = None  # the sender thread's state, while it runs
        self._hello_fields: dict[str, Any] | None = None
        #: The rank's (last step, seconds since its boundary) for each hello (Outbox.hello_now;
        #: the runtime sets its step tracker's StepTracker.hello_step).
        self.step_state: Callable[[], tuple[int, float] | None] | None = None
        self.subscribers = 0  # monitors listening now (sender thread writes, others may read)
        self.control_rejected = 0  # malformed command frames from the monitor (sender thread)
        self.commands_dropped = 0  # ... and those over its bound, dropped unread (probe.transport.gate)

    # --- training thread ------------------------------------------------------------

    def publish(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one message from the training thread. O(1), never blocks, never raises."""
        q = self._queue
        q.append((kind, _clock(), fields))
        q.appended += 1  # after the append: the sender never sees a phantom drop
        if q.asleep:  # after the append: the sender checks the queue after setting it
            q.asleep = False
            nudge(self._nudge_w)  # the sender sleeps after a quiet spell: one write

    @property
    def queue(self) -> TrainingQueue:
        """The training thread's queue, for the step tracker's common step, which appends its row
        there itself (see probe.transport.steprows) and calls :meth:`wake` when ``asleep``."""
        return self._queue

    def wake(self) -> None:
        """Training thread: wake the sender that sleeps after a quiet spell (see publish)."""
        self._queue.asleep = False
        nudge(self._nudge_w)

    def publish_now(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue a rare message (a FLOP count, a kernel window, a bye) and wake the sender, so it
        leaves at once rather than when the sender next wakes by itself (up to a paced step
        frame's wait). One write into a non-blocking pipe: never blocks, never raises."""
        self._queue.asleep = False  # publish() need not write: this one always does, after the append
        self.publish(kind, fields)
        nudge(self._nudge_w)

    def rekey(self, key: wire.RankKey, why: str) -> None:
        """Training thread: frames queued from now on go out as ``key``; the old key says bye
        (``why``) first, so a monitor that saw it does not keep a second, silent rank."""
        self.publish_now(_REKEY, {"key": key, "why": why})

    @property
    def hello_fields(self) -> dict[str, Any] | None:
        """The hello (re-sent every few seconds while nothing else says the rank lives)."""
        return self._hello_fields

    @hello_fields.setter
    def hello_fields(self, fields: dict[str, Any] | None) -> None:
        self._hello_fields = fields
        nudge(self._nudge_w)  # a changed hello goes at once

    def publish_local(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one message from the sender thread itself (its periodic jobs)."""
        self._local.append((kind, time.monotonic(), time.time(), fields))

    @property
    def drops(self) -> int:
        """Messages lost so far: pushed out of the full queue or unsendable."""
        # deque(maxlen) silently discards the oldest entry: whatever was appended
        # but neither taken by the sender nor still queued was pushed out.
        q = self._queue
        queued_drops = max(0, q.appended - self._popped - len(q))
        return queued_drops + self._send_drops

    # --- lifecycle -------------------------------------------------------------------

    def add_tick(self, interval_s: float, fn: Tick, paced: bool = False) -> None:
        """Run ``fn`` on the sender thread every ``interval_s`` (errors are swallowed); ``paced``:
        every :meth:`paced_interval` of it, slower while the monitor paces this rank."""
        self._ticks.append(_Tick(interval_s, fn, paced))
        nudge(self._nudge_w)  # a sender asleep for seconds schedules it now

    def watch_fd(self, fd: int, on_readable: OnReadable) -> None:
        """Call ``on_readable(data)`` on the sender thread with what ``fd`` holds whenever it
        becomes readable (SIGTERM's wakeup pipe): the sender wakes for it at once."""
        self._watched.append((fd, on_readable))
        nudge(self._nudge_w)

    def soon(self, delay_s: float) -> None:
        """Sender thread (a periodic job): run another round within ``delay_s`` even if nothing
        wakes the sender (a job that repeats a request while its cause lasts)."""
        self._again_at = min(self._again_at, time.monotonic() + delay_s)

    def paced_interval(self, interval_s: float) -> float:
        """``interval_s`` stretched by as much as the monitor's pace now slows the step records
        (pace ÷ flush_s), to at most what the pace allows (its telemetry_max_s: 10 s from a monitor
        that reads samples as stale after 25 s; MAX_PACED_TICK_S from one that does not say),
        never shorter than asked: a monitor that hears too many ranks' steps (4,096 ranks: each
        rank's figures are rebuilt every 4-32 s) hears fewer telemetry samples too (4,096 a
        second at 1 Hz: a quarter of its frames; at 5 s still a fifth of them)."""
        pace = self._pace  # its limit lapses with it
        return paced_interval(interval_s, self.flush_s, self.current_flush_s(),
                              pace.tick_max_s if pace.holds() else MAX_PACED_TICK_S)

    def on_control(self, handler: Callable[[str], None]) -> None:
        """Call ``handler(command)`` on the sender thread for commands aimed at this rank.

        Commands come only from the monitor this probe connected to, upstream on the data
        connection itself (CURVE-authenticated where keys are set): nobody else can reach
        the probe, since it binds no port."""
        self._control_handlers.append(handler)

    def start(self) -> None:
        """Start the daemon sender thread (idempotent)."""
        if self._thread is None:
            self._nudge_r, self._nudge_w = nudge_pipe(self)
            self._thread = threading.Thread(target=self._run, name="flowtop-probe-sender", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 0.5) -> None:
        """Flush what can be flushed within ``timeout_s``, then stop the thread."""
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + timeout_s
        nudge(self._nudge_w)
        while self._queue and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        self._stop_by = deadline  # before _stop: the sender's socket lingers until then
        self._stop = True
        nudge(self._nudge_w)
        thread.join(max(0.0, deadline - time.monotonic()) + 0.2)

    def on_sender_thread(self) -> bool:
        """Whether the caller is the sender thread (the only one that may touch the socket)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def send_now(self, kind: str, fields: dict[str, Any]) -> None:
        """Sender thread only: send what is queued and the open batch, then one message at once
        (a bye just before the process dies: the steps of the batch, up to a pace's 2 s, are
        not lost, and the bye's step count is what the monitor got). Never blocks; a full pipe
        loses it."""
        sock = self._sock
        if sock is None or not self.on_sender_thread():
            return
        import zmq

        r = self._round
        try:
            if r is not None:
                self._take(r, stopping=True, now=r.begin())
                self._send(zmq, sock, r, r.clock.now)
        except Exception:  # noqa: BLE001 - the message itself must still go
            pass
        try:
            sock.send(wire.encode(kind, self.key, self._seq, time.time(), fields), zmq.NOBLOCK)
            self._seq += 1
        except zmq.ZMQError:
            pass

    def abandon(self) -> None:
        """Forget the thread and sockets without touching them (after fork in a child)."""
        self._thread = None
        self._stop = True
        self._nudge_w = -1  # the parent's pipe: its sender must not wake for this child
        self._queue.clear()

    def start_for(self, world_size: int) -> None:
        """Hold step records as a monitor would ask of a job of ``world_size`` ranks
        (probe.wire.pace) while no monitor's pace holds: thousands of ranks starting, or back on
        their own after their monitor restarted, do not flood it before its first command."""
        self.own_flush_s = max(self.flush_s, pace_for(world_size) or 0.0)
        nudge(getattr(self, "_nudge_w", -1))  # a sender asleep for a longer wait looks again

    def current_flush_s(self) -> float:
        """How long step records wait now: a monitor's pace while one holds (never below
        flush_s: it knows how many ranks it hears), else own_flush_s."""
        pace = self._pace
        return max(self.flush_s, pace.flush_s) if pace.holds() else self.own_flush_s
