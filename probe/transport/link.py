"""The probe sender's side of its connection: its CURVE keys, who listens (:class:`Link`) and
what it sleeps on (:class:`Waker`).

The sender thread sleeps until something is due or something happens. A timed wake-up costs a
sleeping thread 50-150 us of CPU on a loaded host (taken from training, bench/overhead.py), so it
does not wake to look: its socket (a monitor's subscription or command), the socket monitor's
events, a nudge pipe that other threads write a byte into (a message that goes at once, close)
and watched descriptors (SIGTERM's wakeup pipe) all wake one ``zmq_poll``.
"""

from __future__ import annotations

import math
import os
import signal
import weakref
from typing import Any, Callable

from probe._log import warn_once
from probe.transport.gate import CommandGate
from probe.wire.command_bound import read_commands
from probe.wire.link import ClosedHandshakes, closed_text

#: What a watched descriptor's reader is called with: the bytes read from it.
OnReadable = Callable[[bytes], None]
#: The longest sleep once the nudge pipe failed (see Waker.degraded).
DEGRADED_WAIT_S = 0.1


def nudge_pipe(owner: object) -> tuple[int, int]:
    """A non-blocking pipe (read end, write end) closed when ``owner`` is collected: never
    earlier, so another thread's nudge can never write into a descriptor number reused by a file
    the process opened since (a checkpoint)."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    # Not at exit: a daemon sender still polling them would spin on closed descriptors; the
    # process's end closes them anyway.
    weakref.finalize(owner, _close_all, r, w).atexit = False
    return r, w


def _close_all(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def nudge(fd: int) -> None:
    """Wake the thread that polls the pipe ``fd`` writes into (any thread; never blocks or raises:
    a full pipe already wakes it)."""
    if fd >= 0:
        try:
            os.write(fd, b"\0")
        except OSError:
            pass


#: Signals the sender thread never takes while it waits out its linger: a Python handler's signal
#: (SIGCHLD from a DataLoader, SIGINT, SIGTERM) delivered to it cut the wait short with EINTR, and
#: pyzmq then gives the context up unterminated (its threads, its last frames lost). Faults
#: (SIGSEGV and the like) stay deliverable: blocked, they would kill the process silently.
_FAULTS = frozenset(getattr(signal, n) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGABRT",
                                                 "SIGSYS") if hasattr(signal, n))


def end_context(ctx: Any, sock: Any, link: "Link | None", linger_ms: int) -> None:
    """The sender thread's last act: its link's monitor socket closed, its socket closed with
    ``linger_ms`` (the rest of close()'s time, see SenderLoop._linger_ms), then its own context
    terminated, which waits that long at most for ZeroMQ to hand over what it holds. Each step
    runs whatever the one before did (a failure said once), so the context never outlives the
    thread with its I/O threads and descriptors."""
    steps: list[Callable[[], object]] = []
    if link is not None:
        steps.append(link.close)
    if sock is not None:
        steps.append(lambda: sock.close(linger_ms))
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - the context below must still end
            warn_once("sender-close", f"closing the probe's socket failed: {type(exc).__name__}: {exc}")
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - _FAULTS)  # this thread only
    except (AttributeError, OSError, ValueError):  # a platform without it: the wait may end early
        pass
    try:
        ctx.destroy(0)  # anything else of it closed at once; waits out the socket's linger
    except Exception as exc:  # noqa: BLE001
        warn_once("sender-context", f"ending the probe's ZeroMQ context failed: {type(exc).__name__}: {exc}")


def curve_keys(curve_dir: str | None) -> tuple[bytes, bytes, bytes] | None:
    """(monitor public, own public, own secret) from the key directory, if one is set.

    A key directory that cannot be read stops the sender (never a silent fallback to
    plain text): the exception is logged once by the caller."""
    if not curve_dir:
        return None
    import zmq.auth

    server_public, _ = zmq.auth.load_certificate(os.path.join(curve_dir, "server.key"))
    public, secret = zmq.auth.load_certificate(os.path.join(curve_dir, "client.key_secret"))
    if secret is None:
        raise ValueError(f"{curve_dir}/client.key_secret holds no secret key")
    return server_public, public, secret


def apply_curve(sock: Any, keys: tuple[bytes, bytes, bytes] | None) -> None:
    """Make ``sock`` a CURVE client of the monitor (no-op without keys)."""
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys


class Waker:
    """One ``zmq_poll`` over the sender's sockets, its nudge pipe and watched descriptors."""

    def __init__(self, zmq: Any, sockets: list[Any], nudge_fd: int) -> None:
        self._poller = zmq.Poller()
        self._pollin = zmq.POLLIN
        self.muted: Any = None  # the socket left out of the poll (see mute)
        for sock in sockets:
            self._poller.register(sock, zmq.POLLIN)
        self._nudge_fd = nudge_fd
        if nudge_fd >= 0:
            self._poller.register(nudge_fd, zmq.POLLIN)
        self._watched: dict[int, OnReadable] = {}
        #: The nudge pipe failed (its descriptor closed under us by some library): without it the
        #: sender wakes every DEGRADED_WAIT_S to look (probe.transport.sender.SenderLoop._wait_s).
        self.degraded = False
        self.waits = 0  # the sender's rounds and its empty looks (tests, benchmarks)
        self.woken = False  # the last wait ended on something ready, not its timeout

    def mute(self, sock: Any, muted: bool) -> None:
        """Leave ``sock`` out of the poll (``muted``) or put it back: zmq_poll on a socket makes
        an XPUB queue what its pipes hold (see probe.transport.gate), and a socket left unread
        would wake every wait at once."""
        if muted != (self.muted is sock):
            self._poller.register(sock, 0 if muted else self._pollin)  # 0: out of the poll
            self.muted = sock if muted else None

    def watch(self, fd: int, on_readable: OnReadable) -> None:
        """Call ``on_readable(data)`` with what ``fd`` holds whenever it becomes readable."""
        if fd not in self._watched:
            self._poller.register(fd, self._pollin)
        self._watched[fd] = on_readable

    def wait(self, timeout_s: float) -> bool:
        """Sleep up to ``timeout_s`` (1 ms at least), less when anything polled becomes ready;
        drain what woke it (a descriptor always, so a readable one never spins the loop). True
        when a socket has something to read: else the sender need not ask them (Link.poll costs
        a cold round ~50 us; what arrives later wakes the next wait at once)."""
        self.waits += 1
        ready = self._poller.poll(max(1, math.ceil(timeout_s * 1000)))
        self.woken = bool(ready)  # by something, not by the timeout
        sockets = False
        for what, _ in ready:
            if isinstance(what, int):
                self._drain(what)
            else:
                sockets = True
        return sockets

    def _drain(self, fd: int) -> None:
        try:
            data = os.read(fd, 512)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        on_readable = self._watched.get(fd)
        if not data or (on_readable is None and fd != self._nudge_fd):
            # Closed under us (after fork; a library closing what it does not own): polled on, it
            # would be "ready" forever and the sender would spin.
            self._poller.unregister(fd)
            self._watched.pop(fd, None)
            if fd == self._nudge_fd:
                self._nudge_fd, self.degraded = -1, True
                warn_once("nudge-pipe", "the probe sender's wake-up pipe failed; it now looks every 0.1 s")
            return
        if on_readable is None:  # the nudge: its bytes say nothing
            return
        try:
            on_readable(data)
        except Exception as exc:
            warn_once(f"watch:{fd}", f"probe watcher failed and is skipped: {exc}")


def _endpoint(event: dict[str, Any]) -> str:
    """The address a socket monitor's event names, as text (it comes as bytes)."""
    raw = event.get("endpoint", b"")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return text[:80]


class Link:
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
        self._events = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | self._failed
                                               | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        self.connections = 0
        self.subscriptions = 0
        #: Connections in a row that ended before their handshake completed (see poll).
        #: CURVE handshakes in a row the monitor closed (probe.wire.link.ClosedHandshakes).
        self.closed = ClosedHandshakes()
        self._commands: list[bytes] = []
        self.overflow = 0
        #: The bound on the monitor's side's commands (probe.transport.gate): while it pauses,
        #: the sender neither reads, sends on nor polls its socket (see muted).
        self.gate = CommandGate()

    @property
    def events(self) -> Any:
        """The socket monitor's event socket (the sender's poll wakes on it too)."""
        return self._events

    def take_commands(self) -> list[bytes]:
        """Command frames received since the last call (at most 16 per poll; more are dropped)."""
        out, self._commands = self._commands, []
        return out

    def muted(self, now: float) -> bool:
        """Whether the socket is to be left alone now (a command flood: see probe.transport.gate)."""
        return self.gate.paused(now)

    def close(self) -> None:
        """Stop monitoring and close the event socket (no linger)."""
        try:
            self._sock.disable_monitor()
        finally:
            self._events.close(0)

    def poll(self, now: float) -> int:
        """Drain pending events and (un)subscriptions (not while muted at the monotonic ``now``);
        return the live subscription count."""
        zmq = self._zmq
        # Mostly there is nothing to read: asking first spares two raised zmq.Again per round.
        for _ in range(64 if self._events.getsockopt(zmq.EVENTS) & zmq.POLLIN else 0):
            try:
                event = self._recv_event(self._events, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connections += 1
                self.closed.succeeded()
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                if self.closed.failed(event.get("value"), self._sock.getsockopt(zmq.MECHANISM) == zmq.CURVE):
                    warn_once("handshake-drop", closed_text(_endpoint(event), "this probe's",
                                                            "this probe's (FLOWTOP_CURVE_DIR)", "nothing is sent"))
            elif event["event"] & self._failed:
                # Otherwise a wrong or missing CURVE key looks exactly like "no monitor there".
                why = ("refused this probe's CURVE key: add its client.key to the monitor's clients/ directory"
                       if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else
                       "did not complete the handshake: CURVE keys on one side only, or mismatched ones")
                warn_once("handshake", f"the monitor at {_endpoint(event)} {why}; nothing is sent")
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)
                if self.connections == 0:
                    self.subscriptions = 0
        if not self.gate.paused(now):
            self._read(zmq, now)
        return self.subscriptions if self.connections > 0 else 0

    def _read(self, zmq: Any, now: float) -> None:
        """(Un)subscriptions and commands: up to 64 frames, or DRAIN_MAX once a command was over
        the gate's bucket (dropped unread), which then pauses (probe.wire.command_bound.read_commands)."""
        if not self._sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return  # mostly nothing to read: asking first spares a raised zmq.Again per round
        gate = self.gate
        self.subscriptions = read_commands(gate, self._sock.recv, zmq.NOBLOCK, zmq.Again, 64, now,
                                           self.subscriptions, self._take)
        if gate.paused(now) and gate.warning is not None:  # the read was over the bound
            warn_once("command-flood", gate.warning)

    def _take(self, frame: bytes) -> None:
        """A monitor's command within the bound, kept for the sender's round."""
        if len(self._commands) < 16:
            self._commands.append(frame)
        else:
            self.overflow += 1  # more commands in one poll than anyone needs: counted
