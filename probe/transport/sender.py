"""The probe's sender thread: the daemon loop that owns the socket, as a part of
:class:`probe.transport.publisher.Publisher`.

The training thread only queues (probe.transport.publisher); everything else — msgpack encoding,
ZeroMQ sends, telemetry sampling, control messages from the monitor — happens here, on the sender
thread, in rounds (probe.transport.rounds); between them it sleeps until something is due. What a
round sends, and in what order, is the outbox's (probe.transport.outbox, this loop's base); this
module is the thread, its socket, what it hears from the monitor and how long it sleeps.

Socket choices (docs/design.md, "Transport"): the publisher connects, LINGER 0 while it runs (the
rest of close()'s time once it stops), IMMEDIATE 1
(nothing is queued for a monitor that is not there, so a restarted monitor sees
no stale flood), randomised reconnect interval, every send NOBLOCK. It is an
XPUB rather than a PUB: a PUB silently discards what it sends before the
monitor's subscription has arrived (the hello and first steps would vanish),
while an XPUB *receives* the subscriptions, so the sender knows whether anyone
listens. Until then — and when the monitor goes away — messages wait up to
``max_age_s`` of the time the process runs (a SIGSTOP's pause is not counted:
probe.transport.rounds.SenderClock) and are then dropped and counted (looked at at least every
``max_age_s``/2, and before anything is sent: a monitor that appears gets nothing older). XPUB_NODROP turns a full
high-water mark into EAGAIN, handled the same way.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from probe import wire
from probe.wire.link import upstream_options
from probe.wire.pace import MAX_PACED_TICK_S
from probe._log import warn_once
from probe.transport.link import (DEGRADED_WAIT_S, Link, OnReadable, Waker, apply_curve, curve_keys,
                                  end_context)
from probe.transport import outbox as _outbox
from probe.transport.outbox import Outbox, Pace, weights
from probe.transport.rounds import MIN_WAIT_S, QUEUE_SHARE, REKEY as _REKEY, Item, Round

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


class _Tick(NamedTuple):
    """A periodic job of the sender thread (see probe.transport.publisher.Publisher.add_tick)."""

    interval_s: float
    fn: Tick
    paced: bool


class SenderLoop(Outbox):
    """The sender thread's loop (a mixin of :class:`probe.transport.publisher.Publisher`, whose
    ``__init__`` sets the attributes declared here and in its base, the outbox's steps)."""

    # No slots of its own, so Publisher's slots (publish()'s attributes) and its one __dict__ and
    # __weakref__ are what instances have. Hidden from mypy, which would read the declarations
    # below as attributes this empty __slots__ leaves no room for.
    if not TYPE_CHECKING:
        __slots__ = ()

    if TYPE_CHECKING:
        addr: str
        curve_dir: str | None
        own_flush_s: float
        _queue_size: int
        _local: list[Item]
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

        def paced_interval(self, interval_s: float) -> float: ...

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
            if self._queue.asleep:
                self._queue.asleep = False
            # A command flood's pause (probe.transport.gate) leaves the socket alone, sends too: what
            # is pending waits; the round that ends it reads and sends, even if its read pauses again
            # (a monitor that floods still gets the rank's frames, once a pause), and a stop's bye goes.
            hold = waker.muted is not None and link.muted(time.monotonic()) and not stopping
            if readable or waker.muted is not None:  # a pause's end reads the socket (see _listen)
                self._listen(link, r, waker, sock)
            now = r.begin()  # monotonic: the sender's timers (see SenderClock); a pause's credit
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
                self._send_drops += weights(r.pending)
                return
            while len(self._watched) > r.watched:
                waker.watch(*self._watched[r.watched])
                r.watched += 1
            readable = self._sleep(waker, r, self._wait_s(r, sent_all, steps, link.gate.paused_until))
            while not waker.woken and self._look_again(r):  # an empty look: no round
                readable = self._sleep(waker, r, min(self.current_flush_s(), r.look_until - time.monotonic()))
            if waker.degraded:  # its pipe is gone: nobody writes into a number the process may reuse
                self._nudge_w = -1

    @staticmethod
    def _sleep(waker: Waker, r: "Round", wait_s: float) -> bool:
        """The sender sleeps (Waker.wait); one that ends late was a pause of the process, which
        what it holds does not age by (SenderClock.slept)."""
        start = r.clock.read()
        readable = waker.wait(wait_s)
        r.clock.slept(wait_s, start)
        return readable

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
            self._queue.asleep = True  # append, then this flag; here this flag, then the queue;
            if self._queue:  # sound under the GIL, which orders both threads' reads and writes;
                self._queue.asleep = False  # the free-threaded build would need more than this)
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
        # The longest sleep: HELLO_MAX_S (a paced hello waits more of them), read from its one binding.
        wait = min(_outbox.HELLO_MAX_S, max(MIN_WAIT_S, min(due)))
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
            if cmd == "hello_now":  # the monitor forgot this rank: as for a monitor that (re)appeared
                r = self._round
                if r is not None:
                    r.next_hello = r.hello_at = -math.inf  # the hello goes this round (Outbox._queue_hello)
                    r.resend_count = r.flops is not None  # and the FLOP count in force after it
                continue
            for handler in self._control_handlers:
                try:
                    handler(cmd)
                except Exception as exc:
                    warn_once("control", f"control command {cmd} failed: {exc}")
