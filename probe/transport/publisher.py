"""Publisher: bounded deque on the training thread, a daemon sender thread owns the sockets.

The training thread only ever calls :meth:`Publisher.publish`, which appends a
tuple to a ``collections.deque(maxlen=...)`` — no locks, no Events, no syscalls
(a lock held by a thread interrupted with KeyboardInterrupt can hang exit).
Everything else — msgpack encoding, ZeroMQ sends, telemetry sampling, control
messages from the monitor — happens on the sender thread.

Socket choices (docs/design.md, "Transport"): the publisher connects, LINGER 0, IMMEDIATE 1
(nothing is queued for a monitor that is not there, so a restarted monitor sees
no stale flood), randomised reconnect interval, every send NOBLOCK. It is an
XPUB rather than a PUB: a PUB silently discards what it sends before the
monitor's subscription has arrived (the hello and first steps would vanish),
while an XPUB *receives* the subscriptions, so the sender knows whether anyone
listens. Until then — and when the monitor goes away — messages wait up to
``max_age_s`` and are then dropped and counted. XPUB_NODROP turns a full
high-water mark into EAGAIN, handled the same way.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from typing import Any, Callable, Deque, NamedTuple

from probe import wire
from probe.wire.link import upstream_options
from probe.wire.pace import DEFAULT_FLUSH_S, pace_for
from probe._log import warn_once

#: Queue marker (never sent): frames after it go out under a new rank key.
_REKEY = "_rekey"
#: publish()'s clock, a module global: the training thread calls it each step, after a long step
#: has left the caches cold (an attribute lookup less).
_clock = time.time

def _flush(pending: Deque[tuple[str, float, dict[str, Any]]], batch: list[tuple[str, float, dict[str, Any]]]) -> None:
    """Queue the step records of ``batch`` as one frame (a ``stepcols`` frame, a lone record too:
    columns cost the monitor less to check than a plain "step" map)."""
    if batch:
        pending.append(("steps", batch[0][1], {"records": [f for _, _, f in batch]}))
    batch.clear()


def _weight(kind: str, fields: dict[str, Any]) -> int:
    """Messages one pending entry stands for (a batch: its step records), for drop counts."""
    return len(fields["records"]) if kind == "steps" else (0 if kind == _REKEY else 1)


#: The hello is the rank's heartbeat: it goes every HELLO_S while nothing else says the rank lives
#: (before its first step, hung in a collective, in a step longer than STEPS_ALIVE_S). While its
#: step frames leave (every flush, at most wire.MAX_PACE_S apart when paced) they keep it heard, and
#: the hello goes every HELLO_MAX_S only, for a monitor that restarted behind a relay (a monitor
#: this socket sees (re)appear gets one at once). At 4,096 ranks a hello every 2 s was a third of
#: the frames a monitor read.
HELLO_S = 2.0
HELLO_MAX_S = 10.0
STEPS_ALIVE_S = 2.5

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

    # publish()'s two attributes, as slots in the object itself: not among the values of the
    # attributes the sender thread writes, whose cache lines another core dirties (a miss for
    # the training thread's publish() at each step). The rest live in __dict__.
    __slots__ = ("_queue", "_appended", "__dict__")

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
        self._queue: Deque[tuple[str, float, dict[str, Any]]] = collections.deque(maxlen=queue_size)
        self._queue_size = queue_size
        self._appended = 0  # training thread only
        self._popped = 0  # sender thread only
        self._local: list[tuple[str, float, dict[str, Any]]] = []  # sender thread only
        self._sent = 0  # sender thread only
        self._send_drops = 0  # sender thread only
        self._seq = 0
        self._stop = False
        self._ticks: list[_Tick] = []  # may grow while the sender runs
        self._control_handlers: list[Callable[[str], None]] = []
        self._thread: threading.Thread | None = None
        self._sock: Any = None  # the sender thread's socket, while it runs
        self.hello_fields: dict[str, Any] | None = None  # re-sent every few seconds
        self.subscribers = 0  # monitors listening now (sender thread writes, others may read)
        self.control_rejected = 0  # malformed command frames from the monitor (sender thread)

    # --- training thread ------------------------------------------------------------

    def publish(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one message from the training thread. O(1), never blocks, never raises."""
        self._queue.append((kind, _clock(), fields))
        self._appended += 1  # after the append: the sender never sees a phantom drop

    def rekey(self, key: wire.RankKey, why: str) -> None:
        """Training thread: frames queued from now on go out as ``key``; the old key says bye
        (``why``) first, so a monitor that saw it does not keep a second, silent rank."""
        self.publish(_REKEY, {"key": key, "why": why})

    def publish_local(self, kind: str, fields: dict[str, Any]) -> None:
        """Queue one message from the sender thread itself (its periodic jobs)."""
        self._local.append((kind, time.time(), fields))

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
            self._thread = threading.Thread(target=self._run, name="flowtop-probe-sender", daemon=True)
            self._thread.start()

    def close(self, timeout_s: float = 0.5) -> None:
        """Flush what can be flushed within ``timeout_s``, then stop the thread."""
        thread = self._thread
        if thread is None:
            return
        deadline = time.monotonic() + timeout_s
        while self._queue and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        self._stop = True
        thread.join(max(0.0, deadline - time.monotonic()) + 0.2)

    def on_sender_thread(self) -> bool:
        """Whether the caller is the sender thread (the only one that may touch the socket)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def send_now(self, kind: str, fields: dict[str, Any]) -> None:
        """Sender thread only: send one message at once, ahead of anything pending (a bye
        just before the process dies). Never blocks; a full pipe loses it."""
        sock = self._sock
        if sock is None or not self.on_sender_thread():
            return
        import zmq

        try:
            sock.send(wire.encode(kind, self.key, self._seq, time.time(), fields), zmq.NOBLOCK)
            self._seq += 1
        except zmq.ZMQError:
            pass

    def abandon(self) -> None:
        """Forget the thread and sockets without touching them (after fork in a child)."""
        self._thread = None
        self._stop = True
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
        link: _Link | None = None
        try:
            curve = self._curve_keys()
            for name, value in upstream_options(self.addr):  # the relays set theirs alike
                sock.setsockopt(getattr(zmq, name), value)
            _apply_curve(sock, curve)
            link = _Link(zmq, sock)  # before connect, or the first handshake is missed
            sock.connect(self.addr)
            self._sock = sock
            self._loop(zmq, sock, link)
        except Exception as exc:  # the probe never takes training down
            warn_once("sender", f"sender thread stopped: {type(exc).__name__}: {exc}")
        finally:
            if link is not None:
                link.close()
            sock.close(0)

    def _loop(self, zmq: Any, sock: Any, link: "_Link") -> None:
        pending: Deque[tuple[str, float, dict[str, Any]]] = collections.deque()
        batch: list[tuple[str, float, dict[str, Any]]] = []  # step records not yet flushed
        next_tick: list[float] = []
        next_hello = hello_at = steps_at = -math.inf  # when the hello is checked, was sent; steps sent
        listening = False
        last_hello = self.hello_fields
        while True:
            stopping = self._stop
            subscriptions = self.subscribers = link.poll()
            if (subscriptions > 0 and not listening) or self.hello_fields is not last_hello:
                next_hello = hello_at = -math.inf  # a monitor (re)appeared or the hello changed: send it now
                last_hello = self.hello_fields
            listening = subscriptions > 0
            self._take(pending, batch, stopping)
            if self._local:
                pending.extend(self._local)
                self._local.clear()
            now = time.time()
            if listening and self.hello_fields is not None and now >= next_hello:
                if now - steps_at >= STEPS_ALIVE_S or now - hello_at >= HELLO_MAX_S:
                    pending.appendleft(("hello", now, self.hello_fields))
                    hello_at, next_hello = now, now + HELLO_S
                else:  # looked at again when the steps would have to stop, or the longest gap ends
                    next_hello = min(steps_at + STEPS_ALIVE_S, hello_at + HELLO_MAX_S)
            sent_all = True
            while pending and (listening or pending[0][0] == _REKEY):
                kind, t, fields = pending[0]
                if kind == _REKEY:
                    pending.popleft()
                    self._switch_key(zmq, sock, fields, t, listening)
                    if listening and self.hello_fields is not None:
                        pending.appendleft(("hello", t, self.hello_fields))  # the new key's hello
                    continue
                if kind == "steps":  # step records leave as columns (wire MINOR 3, probe.wire.steps)
                    frame = wire.encode_steps(self.key, self._seq, t, fields["records"], self.drops)
                else:
                    frame = wire.encode(kind, self.key, self._seq, t,
                                        dict(fields, drops=self.drops) if kind == "step" else fields)
                if len(frame) > wire.MAX_FRAME_BYTES and kind == "steps":
                    pending.popleft()  # too big together: one by one, so only an oversized record is lost
                    pending.extendleft(reversed([("step", t, dict(r)) for r in fields["records"]]))
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
                    sent_all = False  # high-water mark reached (XPUB_NODROP): retry next round
                    break
                pending.popleft()
                self._seq += 1
                self._sent += 1
                if kind == "steps" or kind == "step":
                    steps_at = now
            if not sent_all or not listening:
                self._expire(pending, now)
            if stopping:
                self._send_drops += sum(_weight(k, f) for k, _, f in pending)
                return
            ticks = list(self._ticks)
            next_tick.extend([0.0] * (len(ticks) - len(next_tick)))
            for i, tick in enumerate(ticks):
                if now >= next_tick[i]:
                    next_tick[i] = now + (self.paced_interval(tick.interval_s) if tick.paced else tick.interval_s)
                    try:
                        tick.fn()
                    except Exception as exc:
                        warn_once(f"tick:{i}", f"periodic probe job failed and is skipped: {exc}")
            self._handle_control(link.take_commands())
            self.control_rejected += link.overflow
            link.overflow = 0
            # Each round costs this thread 0.1-0.4 ms of CPU (cold caches; bench/overhead.py), taken
            # from training on a busy host: wake as seldom as a step record's wait allows (10 Hz
            # with the default flush_s; 20 Hz at most), sooner when a batch is due.
            idle = min(0.1, max(0.05, self.flush_s))
            due = batch[0][1] + self.current_flush_s() - time.time() if batch else idle
            time.sleep(min(idle, max(0.001, due)))

    def start_for(self, world_size: int) -> None:
        """Hold step records as a monitor would ask of a job of ``world_size`` ranks
        (probe.wire.pace) while no monitor's pace holds: thousands of ranks starting, or back on
        their own after their monitor restarted, do not flood it before its first command."""
        self.own_flush_s = max(self.flush_s, pace_for(world_size) or 0.0)

    def current_flush_s(self) -> float:
        """How long step records wait now: a monitor's pace while one holds (never below
        flush_s: it knows how many ranks it hears), else own_flush_s."""
        pace, until = self._pace
        return max(self.flush_s, pace) if time.monotonic() < until else self.own_flush_s

    def _take(self, pending: Deque[tuple[str, float, dict[str, Any]]],
              batch: list[tuple[str, float, dict[str, Any]]], stopping: bool) -> None:
        """Move the training thread's queue to ``pending``, step records through ``batch``:
        flushed when the oldest is ``flush_s`` old, when it is full, and before any other
        message (order is kept: a count or a bye never overtakes the steps before it)."""
        while True:
            try:
                item = self._queue.popleft()
            except IndexError:
                break
            self._popped += 1
            if item[0] == "step":
                batch.append(item)
                if len(batch) >= wire.MAX_BATCH:
                    _flush(pending, batch)
            else:
                _flush(pending, batch)
                pending.append(item)
        if batch and (stopping or time.time() - batch[0][1] >= self.current_flush_s()):
            _flush(pending, batch)

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

    def _expire(self, pending: Deque[tuple[str, float, dict[str, Any]]], now: float) -> None:
        """Drop (and count) what waited longer than ``max_age_s``, wherever it sits (a key
        switch is never dropped: what follows it must go out under the new key)."""
        if pending and now - min(item[1] for item in pending) > self.max_age_s:
            fresh = [item for item in pending if now - item[1] <= self.max_age_s or item[0] == _REKEY]
            self._send_drops += sum(_weight(k, f) for k, _, f in pending) - sum(_weight(k, f) for k, _, f in fresh)
            pending.clear()
            pending.extend(fresh)

    def _curve_keys(self) -> tuple[bytes, bytes, bytes] | None:
        """(monitor public, own public, own secret) from the key directory, if one is set.

        A key directory that cannot be read stops the sender (never a silent fallback to
        plain text): the exception is logged once by the caller."""
        if not self.curve_dir:
            return None
        import os

        import zmq.auth

        server_public, _ = zmq.auth.load_certificate(os.path.join(self.curve_dir, "server.key"))
        public, secret = zmq.auth.load_certificate(os.path.join(self.curve_dir, "client.key_secret"))
        if secret is None:
            raise ValueError(f"{self.curve_dir}/client.key_secret holds no secret key")
        return server_public, public, secret

    def _handle_control(self, frames: list[bytes]) -> None:
        """Commands the monitor sent upstream on the data connection (see :class:`_Link`)."""
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


def _apply_curve(sock: Any, keys: tuple[bytes, bytes, bytes] | None) -> None:
    """Make ``sock`` a CURVE client of the monitor (no-op without keys)."""
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys


class _Link:
    """Whether a monitor listens: connections from the socket monitor, subscriptions from the XPUB.

    An XPUB reports an unsubscription when a subscriber's pipe ends, but not reliably
    when the peer vanishes mid-handshake or is replaced on the same port; the socket
    monitor's DISCONNECTED event is the ground truth that resets the count.
    """

    def __init__(self, zmq: Any, sock: Any) -> None:
        from zmq.utils.monitor import recv_monitor_message

        self._zmq = zmq
        self._sock = sock
        self._recv_event = recv_monitor_message
        self._failed = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        self._events = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | self._failed)
        self.connections = 0
        self.subscriptions = 0
        self._commands: list[bytes] = []
        self.overflow = 0

    def take_commands(self) -> list[bytes]:
        """Command frames received since the last call (at most 16 per poll; more are dropped)."""
        out, self._commands = self._commands, []
        return out

    def close(self) -> None:
        """Stop monitoring and close the event socket (no linger)."""
        try:
            self._sock.disable_monitor()
        finally:
            self._events.close(0)

    def poll(self) -> int:
        """Drain pending events and (un)subscriptions; return the live subscription count."""
        zmq = self._zmq
        # Mostly there is nothing to read: asking first spares two raised zmq.Again per round.
        for _ in range(64 if self._events.getsockopt(zmq.EVENTS) & zmq.POLLIN else 0):
            try:
                event = self._recv_event(self._events, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connections += 1
            elif event["event"] & self._failed:
                # Otherwise a wrong or missing CURVE key looks exactly like "no monitor there".
                why = ("refused this probe's CURVE key: add its client.key to the monitor's clients/ directory"
                       if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                       "did not complete the handshake: CURVE keys on one side only, or mismatched ones")
                warn_once("handshake", f"the monitor at {event.get('endpoint', b'')!r:.80} {why}; nothing is sent")
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)
                if self.connections == 0:
                    self.subscriptions = 0
        for _ in range(64 if self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN else 0):
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if frame[:1] == b"\x01":
                self.subscriptions += 1
            elif frame[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)
            elif len(self._commands) < 16:  # an XSUB's upstream message: a monitor's command
                self._commands.append(frame)
            else:
                self.overflow += 1  # more commands in one poll than anyone needs: counted
        return self.subscriptions if self.connections > 0 else 0
