"""``flowtop relay``: one per node; its ranks' frames go upstream over one connection. No Textual.

Downstream the relay binds an XSUB where the node's probes connect (``ipc://`` in a per-user
0700 directory, or loopback TCP); upstream it connects an XPUB to the monitor, exactly as a probe
does (IMMEDIATE, NODROP, LINGER 0, jittered reconnect, heartbeats, CURVE client keys from
``--curve-dir``). Rank frames pass through as received bytes, never decoded or re-encoded, in
multi-part batches ``[stamp, frame, ...]`` (flowtop.monitor.relays explains the stamp: each frame's hold
time in the relay, so the monitor keeps the relay's receive times, not the upstream link's bursts).

The relay mirrors the monitor's presence downstream: it subscribes to its ranks only while a
monitor is subscribed upstream, and unsubscribes when the monitor goes away. So a probe behind a
relay behaves exactly as one connected directly: it sends only when someone listens, sends its
hello when a monitor (re)appears, queues briefly and counts drops otherwise; a relay that dies
or restarts looks to its ranks like a monitor that did. Commands from the monitor are broadcast
to every rank of the relay: each probe keeps those addressed to its (job, rank), as it does on a
direct connection; routing would mean decoding every rank frame for its key (and a ROUTER
socket) to save a few bytes per rare command on a node-local link. They pass the wire's bound on
commands first, as a probe's do (flowtop.tools.relay_commands: a flood stops at the relay).

Every :attr:`RelayConfig.report_s` the relay sends its own figures as a ``relay`` wire message
(less often while a monitor's pace holds and batches leave: see REPORT_PACED_MAX_S).

What runs once before forwarding (configuration, address checks, keys, the node's relay address,
the ipc path's lock) is in flowtop.tools.relay_setup; its names are importable from here too. What
the relay knows of its connections, from its sockets' events, is flowtop.tools.relay_links.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import os
import random
import threading
import time
from typing import Any, Deque, Sequence

import msgpack
import zmq

from flowtop import settings
from flowtop.monitor.relays import encode_stamp
from flowtop.tools.relay_commands import CommandsDown
from flowtop.tools.relay_links import Links, warn_once
from flowtop.tools.relay_setup import PathLock as PathLock, _same_file as _same_file  # importable here as before
from flowtop.tools.relay_setup import RelayConfig, RelayError, _remove_ipc, check_listen, check_upstream, client_keys
from flowtop.tools.relay_setup import node_address as node_address, node_dir as node_dir
from probe import wire
from probe.wire.host import host_name
from probe.wire.link import upstream_options
from probe.wire.pace import DEFAULT_FLUSH_S, batch_due, paced_interval

#: pyzmq's flags as plain ints (its enums' ``|`` and conversions run Python code at every call).
_NOBLOCK, _MORE = int(zmq.NOBLOCK), int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN = int(zmq.POLLIN)
#: Parts this large are sent zero-copy (pyzmq's own threshold: smaller ones it copies anyway).
COPY_THRESHOLD = zmq.COPY_THRESHOLD
#: Most recent frame counts per drain of the downstream socket (then the loop moves on).
DRAIN = 10_000
#: Longest the loop sleeps with nothing due (a frame, a command, a link event or :meth:`Relay.stop`
#: wakes it sooner). Each wake-up of a sleeping thread costs ~50-150 µs of CPU on a virtual machine
#: (2-core VM, 2026-12-05): waking every 100 ms to look for a stop took an idle relay 1.6 ms of
#: CPU a second, 0.2 ms now; 512 relays of a simulated 4,096-rank job shared two cores with it.
IDLE_WAIT_S = 1.0
#: How soon a batch that upstream refused (its queue full) is tried again.
RETRY_S = 0.01
#: Longest gap between two reports while a monitor's pace holds and batches leave: the report is
#: stretched by the pace (pace ÷ the probes' 0.1 s) as the ranks' telemetry is. A monitor paces
#: when it hears thousands of ranks: 512 relays reporting every second were 512 frames a second,
#: an eighth of what it read at 4,096 ranks. Without batches the report stays the relay's
#: heartbeat, every report_s (the monitor reads a relay heard of for 3 s as silent).
REPORT_PACED_MAX_S = 5.0


class Relay:
    """One relay: :meth:`run` binds, forwards until :meth:`stop`, then says it is closing."""

    def __init__(self, cfg: RelayConfig, context: Any = None) -> None:
        """``context``: a ZeroMQ context to share (a process hosting many relays: bench/ingest.py),
        left to its owner to end; by default the relay makes its own and ends it."""
        self.cfg = cfg
        self._context = context
        check_listen(cfg.listen)
        check_upstream(cfg.upstream)
        self._curve = client_keys(cfg.curve_dir)
        host, pid = host_name(settings.HOST.read()), os.getpid()  # the node its ranks name (FLOWTOP_HOST)
        self.id = f"{host}:{pid}:{random.getrandbits(32):08x}"
        self.key = wire.RankKey("", host, pid, 0, 0)
        self.started = time.monotonic()
        self.ready = threading.Event()  # bound and connecting (or failed: see error)
        self.error = ""
        self._stop = threading.Event()
        self._seq = 0
        self._pack = msgpack.Packer().pack  # the stamps' (one a relay: a Packer holds a buffer)
        self.frames_in = self.frames_out = self.bytes_in = self.bytes_out = 0
        self.drops = self.batches = 0
        self._commands = CommandsDown()  # the monitor's commands, bounded, on their way down
        self._links = Links(cfg.upstream, keyed=self._curve is not None)
        self._subscribed = False  # whether we subscribed downstream (a monitor listens)
        self._queue: Deque[tuple[Any, float]] = collections.deque()
        self._queued_bytes = 0
        self._last_batch = -math.inf  # when the last batch left (see _batch_at)
        self._paced = (math.nan, self.cfg.report_s)  # (a pace's flush_s, the report interval under it)
        self._retry_at = -math.inf  # upstream refused a batch: not before then
        #: The loop's wake-ups (each costs CPU: see IDLE_WAIT_S).
        self.wakes = 0
        # A pipe whose read end the loop polls, so that stop() wakes it (written under the lock:
        # its descriptors are closed when run() ends, and their numbers reused). Re-entrant:
        # `flowtop relay` runs the loop on its main thread, whose signal handlers call stop().
        self._wake: tuple[int, int] | None = None
        self._wake_lock = threading.RLock()

    @property
    def ranks(self) -> int:
        """Rank connections now."""
        return len(self._links.ranks)

    @property
    def link_ups(self) -> int:
        """Upstream connections made (1 + reconnects)."""
        return self._links.link_ups

    @property
    def commands(self) -> int:
        """Monitor commands carried down to the ranks."""
        return self._commands.carried

    @property
    def commands_dropped(self) -> int:
        """Commands dropped unread: over the wire's bound (a flood)."""
        return self._commands.dropped

    @property
    def listening(self) -> bool:
        """Whether a monitor is subscribed upstream."""
        return self._links.listening

    @property
    def stopping(self) -> threading.Event:
        """Set once :meth:`stop` was asked (what a helper thread of the relay's waits on)."""
        return self._stop

    def stop(self) -> None:
        """Ask :meth:`run` to flush, send its closing report and return (any thread)."""
        self._stop.set()
        with self._wake_lock:
            if self._wake is not None:
                try:
                    os.write(self._wake[1], b"\0")
                except OSError:  # full: a wake-up is pending already
                    pass

    def run(self) -> None:
        """Bind, forward, clean up. Raises :class:`RelayError` when the listen address cannot be
        bound (also kept in :attr:`error`, with :attr:`ready` set)."""
        try:
            wake_r, wake_w = os.pipe()
        except OSError as exc:  # out of descriptors: say so as a bind failure does
            self.error = f"cannot make the relay's wake-up pipe: {exc}"
            self.ready.set()
            raise RelayError(self.error) from None
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        with self._wake_lock:
            self._wake = (wake_r, wake_w)
        ctx = self._context if self._context is not None else zmq.Context()
        socks: list[Any] = []
        auth = None
        bound = False
        try:
            down = ctx.socket(zmq.XSUB)
            socks.append(down)
            down.setsockopt(zmq.LINGER, 0)
            down.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
            down.setsockopt(zmq.RCVHWM, 100_000)
            if self.cfg.listen.startswith("tcp://"):
                # Loopback TCP is open to every local user: admit loopback peers only (ipc is
                # guarded by its directory's permissions instead).
                from zmq.auth.thread import ThreadAuthenticator

                auth = ThreadAuthenticator(ctx)
                auth.start()
                auth.allow("127.0.0.1", "::1")
                down.setsockopt_string(zmq.ZAP_DOMAIN, "flowtop-relay")
                if "[" in self.cfg.listen:
                    down.setsockopt(zmq.IPV6, 1)
            down_events = down.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
            socks.append(down_events)
            try:
                down.bind(self.cfg.listen)
            except zmq.ZMQError as exc:
                # zmq.strerror: str(exc) repeats the address the text names first (as the collector's)
                why = zmq.strerror(exc.errno) if exc.errno else str(exc)
                raise RelayError(f"cannot bind {self.cfg.listen}: {why} (is another relay there?)") from None
            bound = True
            up = ctx.socket(zmq.XPUB)
            socks.append(up)
            for name, value in upstream_options(self.cfg.upstream):  # as a probe sets its own
                up.setsockopt(getattr(zmq, name), value)
            if self._curve is not None:
                up.curve_serverkey, up.curve_publickey, up.curve_secretkey = self._curve
            failed = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            up_events = up.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | failed
                                              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            socks.append(up_events)
            up.connect(self.cfg.upstream)
            self.ready.set()
            self._loop(down, up, down_events, up_events, wake_r)
            if self.listening:
                up.setsockopt(zmq.LINGER, 1000)  # the closing report and last batch get out
        except RelayError as exc:
            self.error = str(exc)
            raise
        finally:
            self.ready.set()
            with self._wake_lock:
                self._wake = None
                os.close(wake_r)
                os.close(wake_w)
            for s in reversed(socks):
                s.close()
            if auth is not None:
                auth.stop()
            if self._context is None:
                ctx.term()
            if bound:
                _remove_ipc(self.cfg.listen)

    # --- the loop ---------------------------------------------------------------------------

    def _loop(self, down: Any, up: Any, down_events: Any, up_events: Any, wake: int) -> None:
        poller = zmq.Poller()
        for s in (down, up, down_events, up_events, wake):
            poller.register(s, zmq.POLLIN)
        # Looked up once: a relay wakes about once a frame, and every lookup counts (bench/relay_cost.py).
        poll, monotonic, stop_asked = poller.poll, time.monotonic, self._stop.is_set
        bound, links, q = self._commands.bound, self._links, self._queue
        last_report = retry_report = -math.inf  # the last report sent; a refused one's retry
        alone = False  # upstream left alone (a command flood's pause): out of the poll, nothing sent
        listening = links.listening  # whether a monitor is subscribed upstream (only reads change it)
        while True:
            stopping = stop_asked()
            timeout = 0
            if not stopping:
                now = monotonic()
                wait = self._wait(now, self._report_due(last_report, retry_report, now), listening)
                timeout = int(wait * 1000) + 1 if wait > 0 else 0
            ready = dict(poll(timeout))
            self.wakes += 1
            now = monotonic()
            if wake in ready:
                with contextlib.suppress(OSError):
                    os.read(wake, 64)
            # Only the sockets that have something: each empty receive costs an exception.
            if down in ready or stopping:
                self._drain_down(down, now)
            # The turn that ends a pause reads and sends, even if its read pauses again (a flooding
            # monitor still gets the node's frames, once a pause); a stop's last report goes.
            ended = alone and not bound.paused(now)
            if up in ready or ended:
                self._drain_up(up, down, now)
            if alone != (bound.paused(now) and not stopping):
                alone = not alone
                poller.register(up, 0 if alone else zmq.POLLIN)  # 0: out of the poll
            if up_events in ready or down_events in ready:
                links.read(up_events, down_events)
            listening = links.listening
            if listening != self._subscribed:
                # Mirror the monitor's presence: ranks send only while someone listens.
                self._subscribed = listening
                down.send(b"\x01" if listening else b"\x00")
            if listening and (not alone or ended):
                while q and (stopping or now >= self._batch_at()):
                    if not self._send_batch(up, now):
                        self._retry_at = now + RETRY_S
                        break
                if stopping or now >= self._report_due(last_report, retry_report, now):
                    if self._send_report(up, now, closing=stopping):
                        last_report = now
                    else:  # upstream full: tried again after RETRY_S, not at every turn of the loop
                        retry_report = now + RETRY_S
            while q and now - q[0][1] > self.cfg.max_age_s:  # no monitor, or upstream full
                self._drop_oldest()
            if stopping:
                self.drops += len(q)
                q.clear()
                return

    # The next three run at every wake-up: conditional expressions, not min()/max(), which cost
    # CPython 3.11 ~1.3k instructions a call against ~0.1k (a dozen a wake: bench/relay_cost.py).

    def _report_due(self, last_report: float, retry_report: float, now: float) -> float:
        """When the next report goes: report_s after the last one, stretched by a monitor's pace
        while it holds (up to REPORT_PACED_MAX_S), yet never later than report_s after the last
        batch or report: batches say the relay lives, its report says so when none leave. Not
        before ``retry_report`` (a refused one's retry)."""
        every = self.cfg.report_s
        flush, until = self._commands.pace
        if now < until:
            if flush != self._paced[0]:  # the interval of the last pace seen (one a pace, not two a wake)
                self._paced = (flush, paced_interval(every, DEFAULT_FLUSH_S, flush, REPORT_PACED_MAX_S))
            every = self._paced[1]
        paced, last = last_report + every, self._last_batch
        alive = (last_report if last_report > last else last) + self.cfg.report_s
        due = paced if paced < alive else alive
        return due if due > retry_report else retry_report

    def _batch_at(self) -> float:
        """When the queued frames (some) leave: at once with a full batch's worth, else as
        probe.wire.pace.batch_due says (a relay of a few ranks sends a few frames a second:
        holding each for company cost a second wake-up); never before upstream may take one
        again (RETRY_S after it refused one). A batch cut short by its size leaves the rest due."""
        q = self._queue
        at = -math.inf if len(q) >= self.cfg.max_parts else batch_due(self._last_batch, q[0][1], self.cfg.flush_s)
        return at if at > self._retry_at else self._retry_at

    def _wait(self, now: float, next_report: float, listening: bool) -> float:
        """Seconds the loop may sleep: until the next batch or report (a monitor listening; not
        before a command flood's pause ends) or the oldest frame's expiry (none listening),
        IDLE_WAIT_S at most."""
        due = now + IDLE_WAIT_S
        q = self._queue
        paused_until = self._commands.bound.paused_until
        if now < paused_until < due:  # its end reads upstream (see _loop)
            due = paused_until
        if listening:
            at = next_report if next_report > paused_until else paused_until
            due = at if at < due else due
            if q:
                at = self._batch_at()
                at = at if at > paused_until else paused_until
                due = at if at < due else due
        elif q:
            at = q[0][1] + self.cfg.max_age_s
            due = at if at < due else due
        return due - now if due > now else 0.0

    def _drop_oldest(self) -> None:
        frame, _ = self._queue.popleft()
        self._queued_bytes -= len(frame)
        self.drops += 1

    def _drain_down(self, down: Any, now: float) -> None:
        q, limit, limit_bytes = self._queue, self.cfg.queue, self.cfg.queue_bytes
        recv, more = down.recv, [(down, _POLLIN)]
        for _ in range(DRAIN):
            try:
                frame = recv(_NOBLOCK)  # bytes as the probe sent them (copy=False costs more below 64 KB)
            except zmq.Again:  # woken for nothing (a stop, another socket)
                return
            q.append((frame, now))
            self.frames_in += 1
            self.bytes_in += len(frame)
            self._queued_bytes += len(frame)
            while len(q) > limit or (self._queued_bytes > limit_bytes and len(q) > 1):
                self._drop_oldest()
            # None left? Asked, not read: a failed read raises (26k instructions), getsockopt(EVENTS)
            # looks its option up in an enum (9k), a poll of the one socket costs 3k.
            if not zmq.zmq_poll(more, 0):
                return

    def _drain_up(self, up: Any, down: Any, now: float) -> None:
        links = self._links
        links.up_subs = self._commands.read(up, down, now, links.up_subs)
        if self._commands.bound.warning is not None:
            warn_once("command-flood", self._commands.bound.warning)

    def _send_batch(self, up: Any, now: float) -> bool:
        """Send the oldest frames as one batch; False when upstream is full (retried later)."""
        parts: list[Any] = []
        ages: list[int] = []
        size = 0
        for frame, t in itertools.islice(self._queue, self.cfg.max_parts):
            n = len(frame)
            if parts and size + n > self.cfg.max_batch_bytes:
                break
            parts.append(frame)
            ages.append(int((now - t) * 1e6))
            size += n
        if not _send_parts(up, encode_stamp(self.id, now, ages, self._pack), parts):
            return False
        for _ in parts:
            self._queue.popleft()
        self._queued_bytes -= size
        self.frames_out += len(parts)
        self.bytes_out += size
        self.batches += 1
        self._last_batch = now
        return True

    def _send_report(self, up: Any, now: float, closing: bool = False) -> bool:
        fields = {
            "relay": self.id, "listen": self.cfg.listen, "upstream": self.cfg.upstream, "ranks": self.ranks,
            "frames_in": self.frames_in, "frames_out": self.frames_out, "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out, "drops": self.drops, "queued": len(self._queue),
            "commands": self.commands, "link_ups": self.link_ups, "uptime_s": now - self.started,
            "closing": closing, "hosted_by": self.cfg.hosted_by, "commands_dropped": self.commands_dropped,
        }  # fmt: skip
        frame = wire.encode("relay", self.key, self._seq, time.time(), fields)
        if not _send_parts(up, encode_stamp(self.id, now, [0], self._pack), (frame,)):
            return False
        self._seq += 1
        return True


def _send_parts(up: Any, stamp: bytes, parts: Sequence[bytes]) -> bool:
    """Send ``[stamp, *parts]`` as one message; False when upstream is full. Atomic: libzmq takes
    all parts of a message or none (its HWM is checked at the first part). What send_multipart
    does, less its cost: its flags are enums whose ``|`` runs Python code (enum.Flag), ~10k
    instructions a part; plain ints here. Parts of COPY_THRESHOLD bytes and more go zero-copy,
    as send_multipart(copy=False) sent them. ``parts`` is never empty (a batch holds a frame at
    least): the stamp goes with SNDMORE and only a last part ends the message."""
    if not parts:  # a stamp alone would be glued onto the next message
        raise ValueError("a relay batch needs one part at least")
    send = up.send
    try:
        send(stamp, _MORE)
    except zmq.Again:
        return False
    last = len(parts) - 1
    for i, part in enumerate(parts):
        flags = _MORE if i < last else _NOBLOCK
        if len(part) < COPY_THRESHOLD:
            send(part, flags)
        else:
            send(part, flags, copy=False)
    return True

