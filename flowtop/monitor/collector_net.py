"""The collector's sockets: listen addresses, security and the XSUB's setup. No Textual.

Security (docs/design.md, "Transport"): binding anything but loopback needs CURVE keys
(``curve=``, CLI ``--curve-dir``; only probes whose public key is admitted get in,
traffic encrypted) or an explicit ``allow_remote=True`` (CLI ``--insecure-bind``).
A ZAP handler always runs (loopback only, when unauthenticated), MAXMSGSIZE caps
frames, and messages are msgpack only (never pickle).

:class:`CollectorSockets` is a base of :class:`flowtop.monitor.collector.Collector`, not an object
it calls: the drain loop reaches these methods through ``self`` as before (no extra call layer). Its
state is set by ``Collector.__init__``. Every name here stays importable from flowtop.monitor.collector.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import os
import resource
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlparse

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from flowtop.monitor.hello_asks import HelloAsks, Lack, lack_of
from flowtop.monitor.kernel_asks import KernelAsk, KernelAsks
from flowtop.monitor.pacing import PACED_TELEMETRY_S
from probe import wire

if TYPE_CHECKING:
    from flowtop.monitor.clock import MonitorClock
    from flowtop.monitor.model import Model

ZAP_DOMAIN = "flowtop"
#: Events of the listening socket that the user must hear of (a failed accept is not one of
#: them: libzmq retries it at once, for ever — see flowtop.monitor.fdwatch).
_LISTENER_EVENTS = zmq.EVENT_CLOSED | zmq.EVENT_BIND_FAILED
#: As plain ints: an IntFlag operand makes each test build an enum member (~2 k instructions).
_EVENTS, _FD, _POLLIN = int(zmq.EVENTS), int(zmq.FD), int(zmq.POLLIN)


class AddressError(ValueError):
    """A listen address that cannot or must not be bound."""


def parse_tcp(addr: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` → (host, port); an IPv6 host is written ``[::1]`` and returned bare.

    Raises :class:`AddressError` for anything else, including a port outside 1..65535.
    """
    parsed = urlparse(addr)
    try:
        port = parsed.port  # raises ValueError for a non-numeric or out-of-range port
    except ValueError:
        port = None
    if parsed.scheme != "tcp" or not parsed.hostname or port is None or not 0 < port < 65536:
        raise AddressError(f"bad address {addr!r}: expected tcp://HOST:PORT (PORT 1-65535, IPv6 as [::1])")
    return parsed.hostname, port


def is_ipv6(host: str) -> bool:
    """Whether ``host`` is an IPv6 literal (the zmq sockets then need ``zmq.IPV6``)."""
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def tcp_addr(host: str, port: int) -> str:
    """The zmq address of ``host``:``port``, brackets around an IPv6 literal."""
    return f"tcp://[{host}]:{port}" if is_ipv6(host) else f"tcp://{host}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface (``localhost``, 127.0.0.0/8, ``::1``)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(listen: str, allow_remote: bool) -> str:
    """Validate a listen address; loopback only unless ``allow_remote``."""
    host, _ = parse_tcp(listen)
    if not is_loopback(host) and not allow_remote:
        raise AddressError(
            f"refusing to bind {listen}: only loopback is safe without authentication; "
            "use --curve-dir DIR (keys from 'flowtop keys DIR') or pass --insecure-bind"
        )
    return listen


def raise_fd_limit() -> int:
    """Each probe connection costs a file descriptor: raise the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft



class CollectorSockets:
    """The XSUB the probes connect to, its authenticator and socket monitor, and the commands sent
    back upstream on it (see flowtop.monitor.collector.Collector)."""

    # Set by Collector.__init__ (see there for what each holds).
    model: Model
    clock: MonitorClock
    listen: str
    curve: Any
    _allow_remote: bool
    _ctx: zmq.asyncio.Context | None
    _sub: Any
    _send: Any
    #: The drain loop's wait, while it waits (see _wait_frames, _WakingSocket).
    _woke: asyncio.Future[None] | None = None
    #: The loop and descriptor the waits read, registered once (see _wait_frames; None: not yet).
    _reading: tuple[asyncio.AbstractEventLoop, int] | None = None
    _events: Any
    _events_async: Any
    _auth: Any
    kernel_asks: KernelAsks
    hello_asks: HelloAsks

    def _open_sockets(self) -> Any:
        """Create the context, the authenticator and the XSUB (configured, subscribed, not bound yet)
        with its socket monitor; each is kept on ``self`` as soon as it exists (a failed start's stop
        closes what was opened). Returns the XSUB."""
        ctx = self._ctx = zmq.asyncio.Context()
        from zmq.auth.asyncio import AsyncioAuthenticator

        self._auth = AsyncioAuthenticator(ctx)
        self._auth.start()
        if self.curve is not None:
            # The certificates are looked up by the sockets' ZAP domain, not a wildcard.
            self._auth.configure_curve(domain=ZAP_DOMAIN, location=str(self.curve.clients_dir))
        elif not self._allow_remote:
            self._auth.allow("127.0.0.1", "::1")
        # XSUB, not SUB: it can also send upstream, which is how commands reach the probes.
        sub = ctx.socket(zmq.XSUB)
        self._secure(sub)
        self._ipv6(sub, self.listen)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sub.setsockopt(zmq.SNDHWM, 1000)
        events = sub.get_monitor_socket(  # failed handshakes (a wrong CURVE key) are counted like rejected frames
            zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | _LISTENER_EVENTS
        )
        self._events_async = events  # owns the socket; read through a synchronous shadow
        self._events = zmq.Socket.shadow(events.underlying)
        self._send = _WakingSocket(sub.underlying, self)
        self._send.send(b"\x01", zmq.NOBLOCK)  # subscribe to everything (kept for later peers)
        self._sub = sub
        return sub

    def _close_sockets(self) -> None:
        """Close this start's sockets, authenticator and context."""
        self._stop_reading()
        if self._events is not None:
            self._socket_events()  # a full monitor pipe would block disable_monitor
            self._sub.disable_monitor()
            self._events_async.close(0)
        if self._sub is not None:
            self._sub.close(0)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()

    def _secure(self, sock: Any) -> None:
        if self.curve is not None:
            sock.curve_secretkey = self.curve.secret
            sock.curve_publickey = self.curve.public
            sock.curve_server = True

    @staticmethod
    def _ipv6(sock: Any, addr: str) -> None:
        # zmq sockets are IPv4-only unless told otherwise; an IPv6 literal would not bind.
        try:
            host, _ = parse_tcp(addr)
        except AddressError:
            return
        if is_ipv6(host):
            sock.setsockopt(zmq.IPV6, 1)

    async def _wait_frames(self, sync: zmq.Socket[bytes], timeout_s: float) -> None:
        """Return once a message waits on the XSUB (``sync``: its synchronous shadow), or after
        ``timeout_s``: the drain loop's wait, on the socket's descriptor as a reader of the loop.
        pyzmq's asyncio poll made a poller, three futures and their callbacks, and four turns of
        the loop, per wait: a wait, a receive and a turn of the loop cost ~439 k instructions so,
        ~191 k this way (callgrind, 1,000 waits on an inproc pair), more than a step frame's
        decode and ingest where a drain takes a batch or two (bench/frame_path.py). The descriptor is edge-triggered: it
        says something changed, ZMQ_EVENTS whether a message waits (and re-arms it). The XSUB's
        asyncio socket is then never used on the loop: pyzmq registers no reader of its own for
        that descriptor (it would on its first poll)."""
        if cast(int, sync.get(_EVENTS)) & _POLLIN:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if self._reading is None:
            # Registered once and kept (until the sockets close): adding and removing the reader
            # at each wait cost ~58 k instructions a wait (callgrind; the selector's modify and its
            # epoll_ctl calls each way). Between waits its callback finds no wait and does
            # nothing: the loop turns only at the drain's sleep(0) then, and the next wait asks
            # ZMQ_EVENTS before it waits, so a message that came meanwhile is never missed.
            fd = cast(int, sync.get(_FD))
            # A reader left by a socket closed before this one (pyzmq's authenticator leaves its
            # own at stop) makes add_reader swap the callback only, never telling epoll: kept for
            # the socket's life, the descriptor would never end a wait. Removed first (once).
            loop.remove_reader(fd)
            loop.add_reader(fd, self._readable)
            self._reading = (loop, fd)
        while True:
            woke = self._woke = loop.create_future()
            timer = loop.call_at(deadline, _wake, woke)
            try:
                await woke
            finally:
                self._woke = None
                timer.cancel()
            if cast(int, sync.get(_EVENTS)) & _POLLIN or loop.time() >= deadline:
                return

    def _readable(self) -> None:
        """The XSUB's descriptor is readable: end the drain loop's wait, if it waits."""
        woke = self._woke
        if woke is not None and not woke.done():
            woke.set_result(None)

    def _stop_reading(self) -> None:
        """Unregister the waits' descriptor (before its socket closes)."""
        if self._reading is not None:
            loop, fd = self._reading
            self._reading = None
            if not loop.is_closed():
                loop.remove_reader(fd)

    def _socket_events(self) -> None:
        # All of them: a full monitor pipe would block libzmq's I/O thread (see flowtop.monitor.fdwatch).
        for _ in range(10_000):
            # Asked first: at every drain there is nearly never an event, and the Again a receive
            # raises then costs ~28 k instructions against ~10 k for the question (callgrind).
            if not self._events.get(_EVENTS) & _POLLIN:
                return
            try:
                event = parse_monitor_message(self._events.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except Exception:  # a malformed monitor message: nothing to count
                continue
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.model.reject("handshake refused: a probe's CURVE key is not in the monitor's clients/")
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                self.model.reject("handshake failed: a probe without CURVE keys, or with mismatched ones")
            else:
                self._listener_event(kind, int(event.get("value") or 0))

    def _listener_event(self, kind: int, value: int) -> None:
        """The listening socket was closed or could not be bound again: the user must know (ranks
        that cannot connect are invisible otherwise)."""
        if kind == zmq.EVENT_CLOSED:
            text = f"the listening socket {self.listen} was closed: no new probe can connect"
        else:
            text = f"cannot bind {self.listen} again: {os.strerror(value) if value else 'unknown error'}"
        self.model.notices.error(text, self.clock.now())

    def _broadcast_pace(self, pace: float | None) -> None:
        """Send ``pace`` to every rank (down through relays); None: nothing to send."""
        if pace is not None and self._send is not None:
            try:
                self._send.send(wire.encode_control("pace", None, None, pace, PACED_TELEMETRY_S), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _ask_hellos(self, now: float) -> None:
        """Ask ranks the monitor forgot for their hello and FLOP count (flowtop.monitor.hello_asks)."""
        ask = self.hello_asks.due(now, self._lacks_hello)
        if ask is not None and self._send is not None:
            try:
                self._send.send(wire.encode_control("hello_now", ask.job, None), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _lacks_hello(self, key: wire.RankKey) -> Lack:
        """What a rank still lacks of its hello and FLOP count ("nothing" once gone or ended)."""
        return lack_of(self.model.ranks.get(key))

    def request_kernels(self, job: str, rank: int) -> KernelAsk:
        """Ask one rank's probe for a kernel window at its next step (never blocks), within the
        monitor's budget of such requests (flowtop.monitor.kernel_asks): what became of it, for the UI."""
        if self._send is None:
            return KernelAsk(False, f"rank {rank} of {job} not asked: the monitor is not listening", "warning")
        ask = self.kernel_asks.ask(job, rank)
        if not ask.sent:
            return ask
        asked = self.clock.now()
        for st in self.model.ranks.values():  # a refusal soon after is said (Model._refused)
            if st.key.rank == rank and st.key.job == job:
                st.kernels_asked_at = asked
        try:
            self._send.send(wire.encode_control("kernels_now", job, rank), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        return ask


class _WakingSocket(zmq.Socket):
    """The XSUB's shadow that sends commands upstream. libzmq takes in the socket's pending
    commands at a send, among them the one that says a frame waits: the descriptor then stays
    quiet, and a command sent during the drain loop's wait (the ``k`` key, a refresh's pace or
    hello ask, from DataThread.call) left a frame waiting until the wait's timeout, up to 500 ms
    (a review, in the base's asyncio poll too). Each send wakes the wait to ask ZMQ_EVENTS again."""

    _owner: Any = None  # class level: pyzmq's __setattr__ refuses a name it does not know

    def __init__(self, underlying: int, owner: Any) -> None:
        super().__init__(shadow=underlying)
        self._owner = owner

    def send(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().send(*args, **kwargs)
        finally:
            woke = self._owner._woke
            if woke is not None:
                _wake(woke)


def _wake(woke: asyncio.Future[None]) -> None:
    if not woke.done():
        woke.set_result(None)


def bind_hint(errno_: int | None) -> str:
    """What a failed bind most likely means, by its errno (the hint had blamed another flowtop
    for an address no interface of this host has; a hostile-input trial)."""
    if errno_ == errno.EADDRINUSE:
        return " (is another flowtop running?)"
    if errno_ == errno.EADDRNOTAVAIL:
        return " (no network interface of this host has that address: listen on one of its own, or 0.0.0.0)"
    return ""
