"""The collector: a zmq.asyncio XSUB bound where probes connect. No Textual.

Frames are drained in batches (one poll, then non-blocking receives on a
synchronous shadow of the same socket — an await per message halves the rate),
decoded and validated by :mod:`probe.wire`, and applied to the :class:`Model`.
Commands (``kernels_now``) go back upstream on the same XSUB socket, so only probes that
connected to this monitor (CURVE-admitted where keys are set) ever hear them, and a probe
listens on no port that anyone else could reach.

Security (design.md §8): binding anything but loopback needs CURVE keys
(``curve=``, CLI ``--curve-dir``; only probes whose public key is admitted get in,
traffic encrypted) or an explicit ``allow_remote=True`` (CLI ``--insecure-bind``).
A ZAP handler always runs (loopback only, when unauthenticated), MAXMSGSIZE caps
frames, and messages are msgpack only (never pickle).
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import zmq
import zmq.asyncio

from flowtop.model import Model
from flowtop.snapshot import MonitorSnapshot
from probe import wire

if TYPE_CHECKING:
    from flowtop.kernel_worker import KernelWorker

ZAP_DOMAIN = "flowtop"
#: Most frames handled per drain before yielding to the event loop (UI stays responsive).
BATCH = 5000


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


class Collector:
    """Receives probe messages into a :class:`Model`; a ``SnapshotSource`` for the UI."""

    def __init__(
        self,
        model: Model,
        listen: str = wire.DEFAULT_ADDR,
        allow_remote: bool = False,
        recorder: Any = None,
        curve: Any = None,
    ) -> None:
        self.model = model
        self.recorder = recorder  # flowtop.recording.Recorder: raw frames to replay later
        self.last_recorder = recorder  # kept after stop, for its error
        self.curve = curve  # flowtop.keys.ServerKeys: encrypted, only admitted probes
        self.listen = check_listen(listen, allow_remote or curve is not None)
        self._ctx: zmq.asyncio.Context | None = None
        self._sub: Any = None
        self._send: Any = None  # a synchronous shadow of the XSUB for commands (never blocks)
        self._events: Any = None  # the XSUB's socket monitor (failed handshakes), synchronous
        self._events_async: Any = None
        self._task: asyncio.Task[None] | None = None
        #: Builds kernel windows off the loop, when the model has them.
        self.kernel_worker: KernelWorker | None = None
        self._auth: Any = None
        self._allow_remote = allow_remote
        from flowtop.limits import KernelBudget

        self._kernel_budget = KernelBudget(model.limits, time.monotonic)
        #: Why :meth:`start` failed ("" until it does); the CLI reports it after the UI closes.
        self.start_error = ""

    async def start(self) -> None:
        """Bind the sockets (inside the running loop) and start receiving.

        Raises :class:`AddressError` when the address cannot be bound; any failure is also
        kept in :attr:`start_error`.
        """
        try:
            await self._start()
        except Exception as exc:
            self.start_error = self.start_error or f"{type(exc).__name__}: {exc}"
            raise

    async def _start(self) -> None:
        raise_fd_limit()
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
        try:
            sub.bind(self.listen)
        except zmq.ZMQError as exc:
            sub.close(0)
            self._auth.stop()
            ctx.term()
            self.start_error = f"cannot bind {self.listen}: {exc} (is another flowtop running?)"
            raise AddressError(self.start_error) from None
        self._sub = sub
        # Failed handshakes (a wrong CURVE key) are counted like rejected frames, not lost.
        events = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        self._events_async = events  # owns the socket; read through a synchronous shadow
        self._events = zmq.Socket.shadow(events.underlying)
        self._send = zmq.Socket.shadow(sub.underlying)
        self._send.send(b"\x01", zmq.NOBLOCK)  # subscribe to everything (kept for later peers)
        if self.model.builds_kernels:
            from flowtop.kernel_worker import KernelWorker
            from flowtop.wiring import apply_kernel_stats, build_kernel_stats

            self.kernel_worker = KernelWorker(self.model, build_kernel_stats)
            self.model.offload_kernels(self.kernel_worker.submit, apply_kernel_stats)
        self._task = asyncio.get_running_loop().create_task(self._run())

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

    async def _run(self) -> None:
        sub = self._sub
        sync = zmq.Socket.shadow(sub.underlying)  # non-blocking drain without awaits
        while True:
            await sub.poll(500, zmq.POLLIN)
            now = time.monotonic()
            for _ in range(BATCH):
                try:
                    parts = sync.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                if len(parts) == 1:
                    self.handle_frame(parts[0], now)
                else:  # a node relay's batch (flowtop.relays)
                    self.handle_batch(parts, now)
            self._handshake_failures()
            await asyncio.sleep(0)

    def _handshake_failures(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        for _ in range(64):
            try:
                event = parse_monitor_message(self._events.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            except Exception:  # a malformed monitor message: nothing to count
                continue
            if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.model.reject("handshake refused: a probe's CURVE key is not in the monitor's clients/")
            else:
                self.model.reject("handshake failed: a probe without CURVE keys, or with mismatched ones")

    def handle_batch(self, parts: list[bytes], now: float) -> None:
        """A relay's ``[stamp, frame, ...]``: each frame applied at the time the relay got it."""
        try:
            via, times = self.model.relays.unstamp(parts, now)
        except wire.WireError as exc:
            self.model.reject(str(exc))
            return
        for frame, t in zip(parts[1:], times):
            self.handle_frame(frame, t, via)

    def handle_frame(self, frame: bytes, now: float, via: str | None = None) -> None:
        """Decode one frame and apply it; a bad frame is counted, never raised."""
        if self.recorder is not None:
            try:
                self.recorder.write(now, frame)
            except Exception as exc:  # disk full, file gone: stop recording, keep monitoring
                self._stop_recording(exc)
        try:
            msg = wire.decode(frame, self._kernel_budget)
        except wire.WireError as exc:
            self.model.reject(str(exc))
            return
        try:
            self.model.ingest(msg, now, via)
        except Exception as exc:  # a hostile-but-valid message must not kill the monitor
            self.model.reject(f"ingest: {type(exc).__name__}: {exc}")

    def _stop_recording(self, exc: Exception) -> None:
        recorder, self.recorder = self.recorder, None
        path = getattr(recorder, "path", "?")
        frames = getattr(recorder, "frames", 0)
        print(
            f"flowtop: recording to {path} stopped after {frames} frames: {type(exc).__name__}: {exc}; "
            "monitoring goes on",
            file=sys.stderr,
        )
        recorder.close()
        recorder.error = recorder.error or f"recording {path} stopped after {frames} frames: {exc}"

    def snapshot(self) -> MonitorSnapshot:
        """An immutable snapshot of the model now."""
        return self.model.snapshot(time.monotonic(), self.listen)

    def request_kernels(self, job: str, rank: int) -> None:
        """Ask one rank's probe for a kernel window at its next step (never blocks)."""
        if self._send is None:
            return
        try:
            self._send.send(wire.encode_control("kernels_now", job, rank), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    async def stop(self) -> None:
        """Stop receiving and close the sockets."""
        if self.kernel_worker is not None:
            self.kernel_worker.close()
            self.kernel_worker = None
            self.model.build_kernels_here()  # a later replay into this model builds inline
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        self._send = None  # a shadow of the socket closed below
        if self._events is not None:
            self._sub.disable_monitor()
            self._events_async.close(0)
        if self._sub is not None:
            self._sub.close(0)
        if self._auth is not None:
            self._auth.stop()
        if self._ctx is not None:
            self._ctx.term()
        if self.recorder is not None:
            self.recorder.close()
