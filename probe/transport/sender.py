"""The probe's sender thread: the daemon loop that owns the socket, as a part of
:class:`probe.transport.publisher.Publisher`.

The training thread only queues (probe.transport.publisher); everything else — msgpack encoding,
ZeroMQ sends, telemetry sampling, control messages from the monitor — happens here, on the sender
thread, in rounds (probe.transport.rounds); between them it sleeps until something is due.

Socket choices (docs/design.md, "Transport"): the publisher connects, LINGER 0 while it runs (the
rest of close()'s time once it stops), IMMEDIATE 1
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

import math
import time
from typing import TYPE_CHECKING, Any, Callable, Deque, Iterable, NamedTuple

from probe import wire
from probe.wire.link import upstream_options
from probe.wire.pace import MAX_PACED_TICK_S, paced_interval
from probe._log import warn_once
from probe.transport.link import (DEGRADED_WAIT_S, Link, OnReadable, Waker, apply_curve, curve_keys,
                                  end_context)
from probe.transport.rounds import MIN_WAIT_S, QUEUE_SHARE, REKEY as _REKEY, Item, Queued, Round


def _weight(kind: str, fields: dict[str, Any]) -> int:
    """Messages one pending entry stands for (a batch: its step records), for drop counts."""
    return len(fields["records"]) if kind == "steps" else (0 if kind == _REKEY else 1)


def _weights(items: Iterable[Item]) -> int:
    """Messages the pending entries stand for (see _weight)."""
    return sum(_weight(kind, fields) for kind, _, _, fields in items)


#: The hello is the rank's heartbeat: it goes every HELLO_S while nothing else says the rank lives
#: (before its first step, hung in a collective, in a step longer than STEPS_ALIVE_S). While its
#: step frames leave (every flush, at most wire.MAX_PACE_S apart when paced) they keep it heard, and
#: the hello goes every HELLO_MAX_S only (paced: longer, see hello_max_s), for a monitor that
#: restarted unseen (a flap quicker than a relay's look upstream; a monitor
#: this socket sees (re)appear gets one at once). At 4,096 ranks a hello every 2 s was a third of
#: the frames a monitor read.
HELLO_S = 2.0
HELLO_MAX_S = 10.0
#: ... stretched by the monitor's pace (pace ÷ flush_s) up to this: a monitor that paces hears
#: thousands of ranks (4,096 at the 2 s pace: a hello every 10 s was 410 frames a second, a tenth
#: of what it read), and one that restarts is seen (re)appearing through the relay anyway.
HELLO_PACED_MAX_S = 30.0
STEPS_ALIVE_S = 2.5
#: While a step record came within LOOK_S, a sender with nothing to send looks at the queue again
#: a flush later instead of having the next step's publish() wake it: a pipe write costs the
#: training thread ~20 µs of syscall on a VM, and the sender it wakes takes the interpreter lock
#: from it for its round (~30 µs more a step in bench/probe_costs.py at 119 ms steps; ~100 µs in
#: a bare A/B). Slower steps (and the first after a quiet spell) still wake it, one write a step.
LOOK_S = 1.0
#: No looks under a flush this short (a user's FLOWTOP_FLUSH_S of 1 ms would poll every 1 ms for a
#: second after each step): the steps' publish() wakes the sender then, as for steps slower than
#: LOOK_S.
LOOK_MIN_S = 0.05
#: The longest a stopped sender waits for ZeroMQ to hand over its last frames (see _linger_ms).
MAX_LINGER_MS = 5_000

#: A sender-side periodic job (telemetry), called about once a second.
Tick = Callable[[], None]


class Pace(NamedTuple):
    """The monitor's last "pace" command as the probe keeps it: step records wait up to
    ``flush_s`` (never less than the probe's own flush_s) until the monotonic ``until``
    (wire.PACE_TTL_S after it came), and a paced periodic job stretches to ``tick_max_s`` at most
    (its telemetry_max_s; MAX_PACED_TICK_S when it did not say). All of it lapses together."""

    flush_s: float = 0.0
    until: float = 0.0
    tick_max_s: float = MAX_PACED_TICK_S

    def holds(self) -> bool:
        return time.monotonic() < self.until


class _Tick(NamedTuple):
    """A periodic job of the sender thread (see probe.transport.publisher.Publisher.add_tick)."""

    interval_s: float
    fn: Tick
    paced: bool


class SenderLoop:
    """The sender thread's loop (a mixin of :class:`probe.transport.publisher.Publisher`, whose
    ``__init__`` sets the attributes declared here)."""

    # No slots of its own, so Publisher's slots (publish()'s attributes) and its one __dict__ and
    # __weakref__ are what instances have. Hidden from mypy, which would read the declarations
    # below as attributes this empty __slots__ leaves no room for.
    if not TYPE_CHECKING:
        __slots__ = ()

    if TYPE_CHECKING:
        key: wire.RankKey
        addr: str
        curve_dir: str | None
        max_age_s: float
        flush_s: float
        own_flush_s: float
        _pace: Pace
        _queue: Deque[Queued]
        _queue_size: int
        _asleep: bool
        _popped: int
        _local: list[Item]
        _sent: int
        _send_drops: int
        _seq: int
        _stop: bool
        _stop_by: float
        _ticks: list[_Tick]
        _watched: list[tuple[int, OnReadable]]
        _again_at: float
        _nudge_r: int
        _nudge_w: int
        waker: Waker | None
        rounds: int
        _control_handlers: list[Callable[[str], None]]
        _sock: Any
        _round: Round | None
        subscribers: int
        control_rejected: int
        commands_dropped: int

        @property
        def hello_fields(self) -> dict[str, Any] | None: ...

        @property
        def drops(self) -> int: ...

        def paced_interval(self, interval_s: float) -> float: ...

        def current_flush_s(self) -> float: ...

    def _run(self) -> None:
        try:
            import zmq
        except Exception as exc:
            warn_once("zmq-import", f"pyzmq unavailable ({exc}); probe publishes nothing")
            return
        try:
            # Its own context, not the process's shared one: stopping, the sender waits in term()
            # for what ZeroMQ still holds (see _linger_ms), which must never wait on sockets the
            # training code owns. (After a fork pyzmq leaves both alone in the child.)
            ctx = zmq.Context(io_threads=1)
        except Exception as exc:  # EMFILE and friends: say so once, never a thread traceback
            warn_once("sender-socket", f"cannot create the probe's ZeroMQ context ({exc}); probe publishes nothing")
            return
        sock: Any = None
        link: Link | None = None
        linger_ms = 0
        try:
            sock = ctx.socket(zmq.XPUB)
            curve = curve_keys(self.curve_dir)
            # The relays set theirs alike; RCVHWM among them: what a command flood's pause lets queue (see gate).
            for name, value in upstream_options(self.addr):
                sock.setsockopt(getattr(zmq, name), value)
            apply_curve(sock, curve)
            link = Link(zmq, sock)  # before connect, or the first handshake is missed
            sock.connect(self.addr)
            self._sock = sock
            self._loop(zmq, sock, link)
            linger_ms = self._linger_ms()
        except Exception as exc:  # the probe never takes training down
            warn_once("sender", f"sender thread stopped: {type(exc).__name__}: {exc}")
        finally:
            end_context(ctx, sock, link, linger_ms)

    def _linger_ms(self) -> int:
        """How long the stopped socket may still hand what it holds to the monitor: the rest of
        close()'s time. LINGER 0 (while it runs: exit never waits, a restarted monitor gets
        nothing stale) dropped the frames just sent, a job's last batch and its bye among them,
        whenever ZeroMQ had not yet written them (a busy host, a slow monitor)."""
        return max(0, min(int((self._stop_by - time.monotonic()) * 1000), MAX_LINGER_MS))

    def _loop(self, zmq: Any, sock: Any, link: Link) -> None:
        r = self._round = Round(self.hello_fields)
        waker = self.waker = Waker(zmq, [sock, link.events], self._nudge_r)
        readable = True
        while True:
            self.rounds += 1
            stopping = self._stop
            if self._asleep:
                self._asleep = False
            # A command flood's pause (probe.transport.gate) leaves the socket alone, sends too: what
            # is pending waits; the round that ends it reads and sends, even if its read pauses again
            # (a monitor that floods still gets the rank's frames, once a pause), and a stop's bye goes.
            hold = waker.muted is not None and link.muted(time.monotonic()) and not stopping
            if readable or waker.muted is not None:  # a pause's end reads the socket (see _listen)
                self._listen(link, r, waker, sock)
            now = r.clock.round()  # monotonic: the sender's timers (see SenderClock)
            if not stopping:  # before sending: what a job queues (a telemetry sample) goes now
                self._run_ticks(r, now)
            if self._local:  # ahead of the queue's messages: never after a bye
                r.pending.extend(self._local)
                self._local.clear()
            steps = self._take(r, stopping, now)
            self._queue_hello(r, now)
            self._resend_count(r, now)
            self._expire(r.pending, now)  # before sending: a monitor that appears gets nothing stale
            sent_all = True if hold else self._send(zmq, sock, r, now)
            r.refused(not sent_all)
            if stopping:
                self._send_drops += _weights(r.pending)
                return
            while len(self._watched) > r.watched:
                waker.watch(*self._watched[r.watched])
                r.watched += 1
            readable = waker.wait(self._wait_s(r, sent_all, steps, link.gate.paused_until))
            while not waker.woken and self._look_again(r):  # an empty look: no round
                readable = waker.wait(min(self.current_flush_s(), r.look_until - time.monotonic()))
            if waker.degraded:  # its pipe is gone: nobody writes into a number the process may reuse
                self._nudge_w = -1

    def _listen(self, link: Link, r: "Round", waker: Waker, sock: Any) -> None:
        """Subscriptions, connection events and the monitor's commands since the last round (the
        socket left alone while a command flood's pause lasts: probe.transport.gate)."""
        now = time.monotonic()
        subscriptions = self.subscribers = link.poll(now)
        waker.mute(sock, link.muted(now))
        self.commands_dropped = link.gate.dropped
        if subscriptions > 0 and not r.listening:
            r.next_hello = r.hello_at = -math.inf  # a monitor (re)appeared: the hello goes now
            r.resend_count = r.flops is not None  # and the FLOP count in force after it
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
        longest = self.hello_max_s()
        if now - r.steps_at >= STEPS_ALIVE_S or now - r.hello_at >= longest:
            r.pending.appendleft(("hello", now, r.clock.wall(now), self.hello_fields))
            r.hello_at, r.next_hello = now, now + HELLO_S
        else:  # looked at again when the steps would have to stop, or the longest gap ends
            r.next_hello = min(r.steps_at + STEPS_ALIVE_S, r.hello_at + longest)

    def hello_max_s(self) -> float:
        """The longest gap between two hellos while step frames leave: HELLO_MAX_S, stretched by
        a monitor's pace while one holds (not by the probe's own start pace: the monitor it would
        reach may be one that restarted unseen), as telemetry is, up to HELLO_PACED_MAX_S."""
        pace = self._pace
        if not pace.holds():
            return HELLO_MAX_S
        return paced_interval(HELLO_MAX_S, self.flush_s, max(self.flush_s, pace.flush_s), HELLO_PACED_MAX_S)

    def _resend_count(self, r: "Round", now: float) -> None:
        """After a monitor (re)appeared: the latest FLOP count again, right after the hello (a
        count is sent once, when counted) — unless one is still pending (it goes anyway) or a bye
        is pending or said (nothing of the rank after it)."""
        if not r.resend_count or r.flops is None:
            return
        r.resend_count = False
        if r.said_bye or any(kind in ("flops", "bye") for kind, _, _, _ in r.pending):
            return
        at = 1 if r.pending and r.pending[0][0] == "hello" else 0
        r.pending.insert(at, ("flops", now, r.clock.wall(now), r.flops))

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
                    r.resend_count = True  # then its FLOP count (the count holds, the key changed)
                    self._resend_count(r, now)
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

    def _wait_s(self, r: "Round", sent_all: bool, steps: int, paused_until: float = 0.0) -> float:
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
        if paused_until > now:  # a command flood's pause ends: the socket is read again
            due.append(paused_until - now)
        look = math.inf
        if r.batch:
            due.append(r.batch_at(flush) - now)
        elif steps and r.gap < flush:  # steps flow: the next batch is due a wait after the last
            due.append(r.flushed_at + flush - now)
        elif self._looks(r, now, flush):  # steps slower than the flush: it looks again in a flush
            look = flush
        else:  # quiet: the next step's publish() wakes the sender (Dekker's order: its
            self._asleep = True  # append, then this flag; here this flag, then the queue; sound
            if self._queue:  # under the GIL, which orders both threads' reads and writes; the
                self._asleep = False  # free-threaded build would need more than this)
                r.look_until = -math.inf
                return MIN_WAIT_S
        if self._nudge_w < 0:  # no wake-up pipe (see Waker.degraded): nothing wakes it, it looks
            due.append(min(DEGRADED_WAIT_S, flush))
        rate = r.step_rate(taken, elapsed, now, steps)
        if rate > 0:  # before a fast loop could fill the queue (a long pace)
            due.append(QUEUE_SHARE * self._queue_size / rate)
        due.extend(t - now for t in r.next_tick if t > -math.inf)
        if r.listening and self.hello_fields is not None and not r.said_bye:  # none after it: a
            due.append(r.next_hello - now)  # past due time would make every wait the shortest
        if not sent_all:
            due.append(r.retry_s)
        pace = self._pace
        lapses_in = pace.until - time.monotonic()
        if pace.flush_s > self.own_flush_s and lapses_in > 0:  # a long pace lapses: a batch is due sooner then
            due.append(lapses_in)
        if r.pending and not r.listening:  # expired in bunches (see _expire), not one wake-up a message
            oldest = min((at for k, at, _, _ in r.pending if k != _REKEY), default=math.inf)
            due.append(oldest + 1.5 * self.max_age_s - now)
        wait = min(HELLO_MAX_S, max(MIN_WAIT_S, min(due)))  # the longest sleep (a paced hello waits more of them)
        r.look_until = now + wait if look < wait else -math.inf  # the looks' end: a round is due
        return min(look, wait)

    @staticmethod
    def _looks(r: "Round", now: float, flush: float) -> bool:
        """Whether a sender with nothing to send looks at the queue a flush later rather than
        sleep until publish() wakes it (see LOOK_S, LOOK_MIN_S)."""
        return now - r.newest < LOOK_S and r.gap < LOOK_S and flush >= LOOK_MIN_S

    def _look_again(self, r: "Round") -> bool:
        """After a look that woke to nothing: whether to sleep on without a round (~0.1 ms of the
        sender's CPU each on a VM), because nothing was queued, nothing else is due yet and it
        still looks."""
        now = time.monotonic()
        return (not self._queue and not self._stop and now + MIN_WAIT_S < r.look_until
                and self._looks(r, now, self.current_flush_s()))

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
                if item[0] == "flops":
                    r.flops = item[2]
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
                control = wire.decode_control(frame)
            except wire.WireError:
                self.control_rejected += 1
                continue
            cmd, job, rank = control.cmd, control.job, control.rank
            if (job is not None and job != self.key.job) or (rank is not None and rank != self.key.rank):
                continue  # for another rank: every rank of the monitor's connection sees it
            if cmd == "pace" and control.flush_s is not None:  # the sender's own business: no handler
                self._pace = Pace(control.flush_s, time.monotonic() + wire.PACE_TTL_S,
                                  control.telemetry_max_s or MAX_PACED_TICK_S)
                continue
            for handler in self._control_handlers:
                try:
                    handler(cmd)
                except Exception as exc:
                    warn_once("control", f"control command {cmd} failed: {exc}")
