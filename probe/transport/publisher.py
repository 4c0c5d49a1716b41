"""Publisher: bounded deque on the training thread, a daemon sender thread owns the sockets.

The training thread only ever calls :meth:`Publisher.publish`, which appends a
tuple to a ``collections.deque(maxlen=...)`` — no locks, no Events (a lock held by a thread
interrupted with KeyboardInterrupt can hang exit), and no syscall but one non-blocking pipe write
when the sender sleeps with nothing to send (the first step after a quiet spell; every step when
steps are slower than the flush).
Everything else — msgpack encoding, ZeroMQ sends, telemetry sampling, control
messages from the monitor — happens on the sender thread.

Socket choices (docs/design.md, "Transport"): the publisher connects, LINGER 0, IMMEDIATE 1
(nothing is queued for a monitor that is not there, so a restarted monitor sees
no stale flood), randomised reconnect interval, every send NOBLOCK. It is an
XPUB rather than a PUB: a PUB silently discards what it sends before the
monitor's subscription has arrived (the hello and first steps would vanish),
while an XPUB *receives* the subscriptions, so the sender knows whether anyone
listens. Until then — and when the monitor goes away — messages wait up to
``max_age_s`` and are then dropped and counted (looked at at least every ``max_age_s``/2,
and before anything is sent: a monitor that appears gets nothing older). XPUB_NODROP turns a full
high-water mark into EAGAIN, handled the same way.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any, Callable, Deque, Iterable, NamedTuple

from probe import wire
from probe.wire.link import upstream_options
from probe.wire.pace import DEFAULT_FLUSH_S, pace_for
from probe._log import warn_once
from probe.transport.link import (DEGRADED_WAIT_S, Link, OnReadable, Waker, apply_curve, curve_keys, nudge,
                                  nudge_pipe)
from probe.transport.rounds import MIN_WAIT_S, QUEUE_SHARE, REKEY as _REKEY, Item, Queued, Round

#: publish()'s clock, a module global: the training thread calls it each step, after a long step
#: has left the caches cold (an attribute lookup less). The wall clock: a frame's timestamp; the
#: sender schedules on the monotonic clock (see probe.transport.rounds.SenderClock).
_clock = time.time

def _weight(kind: str, fields: dict[str, Any]) -> int:
    """Messages one pending entry stands for (a batch: its step records), for drop counts."""
    return len(fields["records"]) if kind == "steps" else (0 if kind == _REKEY else 1)


def _weights(items: Iterable[Item]) -> int:
    """Messages the pending entries stand for (see _weight)."""
    return sum(_weight(kind, fields) for kind, _, _, fields in items)


#: The hello is the rank's heartbeat: it goes every HELLO_S while nothing else says the rank lives
#: (before its first step, hung in a collective, in a step longer than STEPS_ALIVE_S). While its
#: step frames leave (every flush, at most wire.MAX_PACE_S apart when paced) they keep it heard, and
#: the hello goes every HELLO_MAX_S only, for a monitor that restarted behind a relay (a monitor
#: this socket sees (re)appear gets one at once). At 4,096 ranks a hello every 2 s was a third of
#: the frames a monitor read.
HELLO_S = 2.0
HELLO_MAX_S = 10.0
STEPS_ALIVE_S = 2.5
#: While a step record came within LOOK_S, a sender with nothing to send looks at the queue again
#: a flush later instead of having the next step's publish() wake it: a pipe write costs the
#: training thread ~20 µs of syscall on a VM, and the sender it wakes takes the interpreter lock
#: from it for its round (~30 µs more a step in bench/probe_costs.py at 119 ms steps; ~100 µs in
#: a bare A/B). Slower steps (and the first after a quiet spell) still wake it, one write a step.
LOOK_S = 1.0

#: A sender-side periodic job (telemetry), called about once a second.
Tick = Callable[[], None]
#: The longest a paced periodic job (telemetry) is stretched to by the monitor's pace (see
#: Publisher.paced_interval): the monitor reads a telemetry sample older than 10 s as stale.
MAX_PACED_TICK_S = 5.0


def paced_interval(interval_s: float, flush_s: float, paced_flush_s: float) -> float:
    """A paced job's interval when step records wait ``paced_flush_s`` instead of the probe's own
    ``flush_s`` (see Publisher.paced_interval)."""
    factor = paced_flush_s / flush_s if flush_s > 0 else 1.0
    if factor <= 1.0:
        return interval_s
    return max(interval_s, min(interval_s * factor, MAX_PACED_TICK_S))


class _Tick(NamedTuple):
    """A periodic job of the sender thread (see Publisher.add_tick)."""

    interval_s: float
    fn: Tick
    paced: bool


class Publisher:
    """Bounded, never-blocking message queue plus the thread that sends it."""

    # publish()'s attributes, as slots in the object itself: not among the values of the
    # attributes the sender thread writes, whose cache lines another core dirties (a miss for
    # the training thread's publish() at each step). The sender writes _asleep in its quiet
    # rounds only. The rest live in __dict__.
    __slots__ = ("_queue", "_appended", "_asleep", "__dict__", "__weakref__")

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
        #: (seconds, monotonic deadline) of the monitor's last "pace" command: step records then
        #: wait up to that long (never less than flush_s) until the deadline (wire.PACE_TTL_S).
        self._pace = (0.0, 0.0)
        self.addr = addr
        self.max_age_s = max_age_s
        self.curve_dir = curve_dir
        self._queue: Deque[Queued] = collections.deque(maxlen=queue_size)
        self._queue_size = queue_size
        self._appended = 0  # training thread only
        #: The sender sleeps with nothing to send after a quiet spell (see LOOK_S), until the next
        #: step's publish() wakes it.
        self._asleep = False
        self._popped = 0  # sender thread only
        self._local: list[Item] = []  # sender thread only
        self._sent = 0  # sender thread only
        self._send_drops = 0  # sender thread only
        self._seq = 0
        self._stop = False
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
        self.subscribers = 0  # monitors listening now (sender thread writes, others may read)
        self.control_rejected = 0  # malformed command frames from the monitor (sender thread)

    # --- training thread ------------------------------------------------------------

    def publish(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one message from the training thread. O(1), never blocks, never raises."""
        self._queue.append((kind, _clock(), fields))
        self._appended += 1  # after the append: the sender never sees a phantom drop
        if self._asleep:  # after the append: the sender checks the queue after setting it
            self._asleep = False
            nudge(self._nudge_w)  # the sender sleeps after a quiet spell: one write

    def publish_now(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue a rare message (a FLOP count, a kernel window, a bye) and wake the sender, so it
        leaves at once rather than when the sender next wakes by itself (up to a paced step
        frame's wait). One write into a non-blocking pipe: never blocks, never raises."""
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
        queued_drops = max(0, self._appended - self._popped - len(self._queue))
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
        (pace ÷ flush_s), to at most MAX_PACED_TICK_S, never shorter than asked: a monitor that
        hears too many ranks' steps (4,096 ranks: each rank's figures are refreshed every 4 s)
        hears fewer telemetry samples too (4,096 a second at 1 Hz: a quarter of its frames)."""
        return paced_interval(interval_s, self.flush_s, self.current_flush_s())

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
                self._take(r, stopping=True, now=r.clock.round())
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

    # --- sender thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            import zmq
        except Exception as exc:
            warn_once("zmq-import", f"pyzmq unavailable ({exc}); probe publishes nothing")
            return
        try:
            sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.XPUB)
        except Exception as exc:  # EMFILE and friends: say so once, never a thread traceback
            warn_once("sender-socket", f"cannot create the probe's socket ({exc}); probe publishes nothing")
            return
        link: Link | None = None
        try:
            curve = curve_keys(self.curve_dir)
            for name, value in upstream_options(self.addr):  # the relays set theirs alike
                sock.setsockopt(getattr(zmq, name), value)
            apply_curve(sock, curve)
            link = Link(zmq, sock)  # before connect, or the first handshake is missed
            sock.connect(self.addr)
            self._sock = sock
            self._loop(zmq, sock, link)
        except Exception as exc:  # the probe never takes training down
            warn_once("sender", f"sender thread stopped: {type(exc).__name__}: {exc}")
        finally:
            if link is not None:
                link.close()
            sock.close(0)

    def _loop(self, zmq: Any, sock: Any, link: Link) -> None:
        r = self._round = Round(self.hello_fields)
        waker = self.waker = Waker(zmq, [sock, link.events], self._nudge_r)
        readable = True
        while True:
            self.rounds += 1
            stopping = self._stop
            if self._asleep:
                self._asleep = False
            if readable:
                self._listen(link, r)
            now = r.clock.round()  # monotonic: the sender's timers (see SenderClock)
            if not stopping:  # before sending: what a job queues (a telemetry sample) goes now
                self._run_ticks(r, now)
            if self._local:  # ahead of the queue's messages: never after a bye
                r.pending.extend(self._local)
                self._local.clear()
            steps = self._take(r, stopping, now)
            self._queue_hello(r, now)
            self._expire(r.pending, now)  # before sending: a monitor that appears gets nothing stale
            sent_all = self._send(zmq, sock, r, now)
            r.refused(not sent_all)
            if stopping:
                self._send_drops += _weights(r.pending)
                return
            while len(self._watched) > r.watched:
                waker.watch(*self._watched[r.watched])
                r.watched += 1
            readable = waker.wait(self._wait_s(r, sent_all, steps))
            while not waker.woken and self._look_again(r):  # an empty look: no round
                readable = waker.wait(min(self.current_flush_s(), r.look_until - time.monotonic()))
            if waker.degraded:  # its pipe is gone: nobody writes into a number the process may reuse
                self._nudge_w = -1

    def _listen(self, link: Link, r: "Round") -> None:
        """Subscriptions, connection events and the monitor's commands since the last round."""
        subscriptions = self.subscribers = link.poll()
        if subscriptions > 0 and not r.listening:
            r.next_hello = r.hello_at = -math.inf  # a monitor (re)appeared: the hello goes now
        r.listening = subscriptions > 0
        # Before the periodic jobs: a command's effect (a window requested) is seen this round.
        self._handle_control(link.take_commands())
        self.control_rejected += link.overflow
        link.overflow = 0

    def _queue_hello(self, r: "Round", now: float) -> None:
        """The hello goes first when it is due (see HELLO_S), or changed."""
        if self.hello_fields is not r.last_hello:
            r.next_hello = r.hello_at = -math.inf
            r.last_hello = self.hello_fields
        if not (r.listening and self.hello_fields is not None and now >= r.next_hello) or r.said_bye:
            return
        if now - r.steps_at >= STEPS_ALIVE_S or now - r.hello_at >= HELLO_MAX_S:
            r.pending.appendleft(("hello", now, r.clock.wall(now), self.hello_fields))
            r.hello_at, r.next_hello = now, now + HELLO_S
        else:  # looked at again when the steps would have to stop, or the longest gap ends
            r.next_hello = min(r.steps_at + STEPS_ALIVE_S, r.hello_at + HELLO_MAX_S)

    def _send(self, zmq: Any, sock: Any, r: "Round", now: float) -> bool:
        """Send what is pending while a monitor listens; False when the high-water mark stopped it."""
        pending = r.pending
        while pending and (r.listening or pending[0][0] == _REKEY):
            kind, at, t, fields = pending[0]  # t: the wall time, for the wire
            if kind == _REKEY:
                pending.popleft()
                self._switch_key(zmq, sock, fields, t, r.listening)
                if r.listening and self.hello_fields is not None:
                    pending.appendleft(("hello", at, t, self.hello_fields))  # the new key's hello
                continue
            if kind == "steps":  # step records leave as columns (wire MINOR 3, probe.wire.steps)
                frame = wire.encode_steps(self.key, self._seq, t, fields["records"], self.drops)
            else:
                frame = wire.encode(kind, self.key, self._seq, t,
                                    dict(fields, drops=self.drops) if kind == "step" else fields)
            if len(frame) > wire.MAX_FRAME_BYTES and kind == "steps":
                pending.popleft()  # too big together: one by one, so only an oversized record is lost
                pending.extendleft(reversed([("step", at, t, dict(rec)) for rec in fields["records"]]))
                continue
            if len(frame) > wire.MAX_FRAME_BYTES:
                # The monitor's MAXMSGSIZE would drop the whole connection for this one.
                warn_once(f"oversize:{kind}",
                          f"dropping a {kind} message of {len(frame)} bytes (limit {wire.MAX_FRAME_BYTES})")
                pending.popleft()
                self._send_drops += _weight(kind, fields)
                continue
            try:
                sock.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return False  # high-water mark reached (XPUB_NODROP): tried again (see RETRY_S)
            pending.popleft()
            self._seq += 1
            self._sent += 1
            if kind == "steps" or kind == "step":
                r.steps_at = now
            elif kind == "bye":
                r.said_bye = True  # no hello after it: the rank would look alive again
        return True

    def _run_ticks(self, r: "Round", now: float) -> None:
        """The periodic jobs that are due (those of interval 0: every round)."""
        if now >= self._again_at:
            self._again_at = math.inf
        ticks = list(self._ticks)
        r.next_tick.extend([0.0] * (len(ticks) - len(r.next_tick)))
        for i, tick in enumerate(ticks):
            if now >= r.next_tick[i]:
                interval = self.paced_interval(tick.interval_s) if tick.paced else tick.interval_s
                r.next_tick[i] = now + interval if interval > 0 else -math.inf
                try:
                    tick.fn()
                except Exception as exc:
                    warn_once(f"tick:{i}", f"periodic probe job failed and is skipped: {exc}")

    def _wait_s(self, r: "Round", sent_all: bool, steps: int) -> float:
        """How long the sender may sleep before something is due. Each wake-up costs it 0.1-0.4 ms
        of CPU (cold caches; bench/overhead.py), taken from training on a busy host, so it sleeps
        until the batch, a hello, a periodic job, an expiry or a retry is due. While steps come
        faster than the batch's wait it wakes when the next batch is due (its first record is on
        its way); slower, it looks again a flush later while the last came within LOOK_S; after a
        quiet spell (steps longer than that) the next step's publish() wakes it. Anything
        else sooner (a subscription, a command, a rare message, close(), SIGTERM) wakes it too."""
        now = time.monotonic()
        taken, r.popped, elapsed, r.at = self._popped - r.popped, self._popped, now - r.at, now
        flush = self.current_flush_s()
        due = [self._again_at - now]
        look = math.inf
        if r.batch:
            due.append(r.batch_at(flush) - now)
        elif steps and r.gap < flush:  # steps flow: the next batch is due a wait after the last
            due.append(r.flushed_at + flush - now)
        elif now - r.newest < LOOK_S:  # steps slower than the flush: it looks again in a flush
            look = flush
        else:  # quiet: the next step's publish() wakes the sender (Dekker's order: its
            self._asleep = True  # append, then this flag; here this flag, then the queue; sound
            if self._queue:  # under the GIL, which orders both threads' reads and writes; the
                self._asleep = False  # free-threaded build would need more than this)
                return MIN_WAIT_S
        if self._nudge_w < 0:  # no wake-up pipe (see Waker.degraded): nothing wakes it, it looks
            due.append(min(DEGRADED_WAIT_S, flush))
        rate = r.step_rate(taken, elapsed, now, steps)
        if rate > 0:  # before a fast loop could fill the queue (a long pace)
            due.append(QUEUE_SHARE * self._queue_size / rate)
        due.extend(t - now for t in r.next_tick if t > -math.inf)
        if r.listening and self.hello_fields is not None:
            due.append(r.next_hello - now)
        if not sent_all:
            due.append(r.retry_s)
        pace, until = self._pace
        lapses_in = until - time.monotonic()
        if pace > self.own_flush_s and lapses_in > 0:  # a long pace lapses: a batch is due sooner then
            due.append(lapses_in)
        if r.pending and not r.listening:  # expired in bunches (see _expire), not one wake-up a message
            oldest = min((at for k, at, _, _ in r.pending if k != _REKEY), default=math.inf)
            due.append(oldest + 1.5 * self.max_age_s - now)
        wait = min(HELLO_MAX_S, max(MIN_WAIT_S, min(due)))  # a hello is never later than that
        r.look_until = now + wait if look < wait else -math.inf  # the looks' end: a round is due
        return min(look, wait)

    def _look_again(self, r: "Round") -> bool:
        """After a look (see LOOK_S) that woke to nothing: whether to sleep on without a round
        (~0.1 ms of the sender's CPU each on a VM), because nothing was queued, nothing else is
        due yet and the last step is recent enough to look again."""
        now = time.monotonic()
        return (not self._queue and not self._stop and now + MIN_WAIT_S < r.look_until
                and now - r.newest < LOOK_S)

    def start_for(self, world_size: int) -> None:
        """Hold step records as a monitor would ask of a job of ``world_size`` ranks
        (probe.wire.pace) while no monitor's pace holds: thousands of ranks starting, or back on
        their own after their monitor restarted, do not flood it before its first command."""
        self.own_flush_s = max(self.flush_s, pace_for(world_size) or 0.0)
        nudge(getattr(self, "_nudge_w", -1))  # a sender asleep for a longer wait looks again

    def current_flush_s(self) -> float:
        """How long step records wait now: a monitor's pace while one holds (never below
        flush_s: it knows how many ranks it hears), else own_flush_s."""
        pace, until = self._pace
        return max(self.flush_s, pace) if time.monotonic() < until else self.own_flush_s

    def _take(self, r: "Round", stopping: bool, now: float) -> int:
        """Move the training thread's queue to the pending messages, step records through the
        open batch: closed when due (see Round.batch_at), when it is full, and before any other
        message (order is kept: a count or a bye never overtakes the steps before it). Returns
        the step records taken."""
        pending, batch = r.pending, r.batch
        steps, newest = 0, 0.0  # newest: a wall time, as publish() stamps it
        close = r.close_batch
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                break
            self._popped += 1
            if item[0] == "step":
                if batch:
                    batch.append(item)
                else:
                    r.open_batch(item)  # its time on the sender's clock
                steps, newest = steps + 1, item[1]
                if len(batch) >= wire.MAX_BATCH:
                    close()
            else:
                close()
                pending.append(r.clock.item(item))
        if steps:
            r.stepped(steps, newest)
        if batch and (stopping or now >= r.batch_at(self.current_flush_s())):
            close()
        return steps

    def _switch_key(self, zmq: Any, sock: Any, fields: dict[str, Any], t: float, listening: bool) -> None:
        """Say bye under the old key (if a monitor listens), then speak under the new one."""
        if listening:
            bye = {"reason": str(fields["why"])[:256], "steps": 0, "drops": self.drops}
            try:
                sock.send(wire.encode("bye", self.key, self._seq, t, bye), zmq.NOBLOCK)
            except zmq.Again:
                pass  # the old key then just goes stale
        self.key = fields["key"]
        self._seq = 0

    def _expire(self, pending: Deque[Item], now: float) -> None:
        """Drop (and count) what waited longer than ``max_age_s``, wherever it sits (a key
        switch is never dropped: what follows it must go out under the new key)."""
        if pending and now - min(item[1] for item in pending) > self.max_age_s:
            fresh = [item for item in pending if now - item[1] <= self.max_age_s or item[0] == _REKEY]
            self._send_drops += _weights(pending) - _weights(fresh)
            pending.clear()
            pending.extend(fresh)

    def _handle_control(self, frames: list[bytes]) -> None:
        """Commands the monitor sent upstream on the data connection (see probe.transport.link.Link)."""
        for frame in frames:
            try:
                cmd, job, rank, flush_s = wire.decode_control(frame)
            except wire.WireError:
                self.control_rejected += 1
                continue
            if (job is not None and job != self.key.job) or (rank is not None and rank != self.key.rank):
                continue  # for another rank: every rank of the monitor's connection sees it
            if cmd == "pace" and flush_s is not None:  # the sender's own business: no handler
                self._pace = (flush_s, time.monotonic() + wire.PACE_TTL_S)
                continue
            for handler in self._control_handlers:
                try:
                    handler(cmd)
                except Exception as exc:
                    warn_once("control", f"control command {cmd} failed: {exc}")
