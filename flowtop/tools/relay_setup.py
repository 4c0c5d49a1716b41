"""What a node relay needs before it forwards: its configuration, its checked addresses, its
CURVE keys, the node's relay directory and address, and the lock that keeps one relay per ipc path.

All of it runs once, when a relay (or ``flowtop run``, which hosts one: flowtop.tools.relay_host)
starts or ends; the forwarding itself is :class:`flowtop.tools.relay.Relay`, which re-exports
these names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


class RelayError(ValueError):
    """A relay that cannot start: bad address, unusable key directory, port or path taken."""


@dataclass(frozen=True)
class RelayConfig:
    """What a relay does; the defaults suit a node of up to a few dozen ranks."""

    listen: str  # where the node's ranks connect: ipc://PATH or tcp://LOOPBACK:PORT
    upstream: str  # the monitor (tcp://HOST:PORT)
    curve_dir: str | None = None  # CURVE client keys for the upstream link (flowtop keys DIR)
    hosted_by: str = "flowtop relay"
    flush_s: float = 0.05  # a frame waits at most this long for its batch, which leaves at once if none did for as long
    max_parts: int = 512  # frames per batch
    max_batch_bytes: int = 16 << 20
    max_age_s: float = 2.0  # frames older than this are dropped while no monitor listens
    queue: int = 20_000  # frames held at most (oldest dropped, counted)
    queue_bytes: int = 256 << 20  # ... and bytes (kernel windows are up to 8 MB each)
    report_s: float = 1.0


def check_listen(addr: str) -> str:
    """A downstream address: ``ipc://ABSOLUTE_PATH`` or ``tcp://LOOPBACK:PORT`` (the ranks of a
    relay are on its node; anything wider would let other hosts inject frames past the monitor's
    CURVE admission)."""
    from flowtop.monitor.collector import AddressError, is_loopback, parse_tcp

    if addr.startswith("ipc://"):
        path = addr[len("ipc://"):]
        if not path.startswith("/") or len(path.encode()) > 100:
            raise RelayError(f"bad relay address {addr!r}: expected ipc:///ABSOLUTE/PATH (at most 100 bytes)")
        return addr
    try:
        host, _ = parse_tcp(addr)
    except AddressError as exc:
        raise RelayError(f"{exc}, or ipc:///PATH") from None
    if not is_loopback(host):
        raise RelayError(f"refusing to listen on {addr}: a relay serves the ranks of its own node; "
                         "use ipc:///PATH or tcp://127.0.0.1:PORT")
    return addr


def check_upstream(addr: str) -> str:
    """The monitor's address: ``tcp://HOST:PORT``."""
    from flowtop.monitor.collector import AddressError, parse_tcp

    try:
        parse_tcp(addr)
    except AddressError as exc:
        raise RelayError(str(exc)) from None
    return addr


def client_keys(curve_dir: str | None) -> tuple[bytes, bytes, bytes] | None:
    """(monitor public, own public, own secret) from a key directory (flowtop.tools.keys layout)."""
    if not curve_dir:
        return None
    import zmq.auth

    d = Path(curve_dir)
    if not d.is_dir():  # ZeroMQ's loader would say "Invalid certificate file" of a file never there
        raise RelayError(f"no key directory {d} (create one with: flowtop keys {d}, or copy the monitor's)")
    try:
        server_public, _ = zmq.auth.load_certificate(str(d / "server.key"))
        public, secret = zmq.auth.load_certificate(str(d / "client.key_secret"))
    except (OSError, ValueError) as exc:
        raise RelayError(f"cannot load CURVE keys from {d}: {exc} (create them with: flowtop keys {d})") from None
    if secret is None:
        raise RelayError(f"{d / 'client.key_secret'} holds no secret key")
    return server_public, public, secret


def node_dir() -> Path:
    """This user's directory for node relays: 0700 and owned by the user, or an error (another
    user's directory there could hand our ranks to a stranger's relay)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    d = Path(base) / f"flowtop-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.lstat()
    except OSError as exc:
        raise RelayError(f"cannot create {d}: {exc.strerror}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not d.is_dir() or d.is_symlink():
        raise RelayError(f"{d} is not a private directory of this user (mode {st.st_mode & 0o777:o}); remove it")
    return d


def node_address(upstream: str, curve_dir: str | None = None) -> str:
    """The node's well-known relay address for ``upstream`` (per user, per monitor and keys)."""
    ident = f"{upstream}|{os.path.abspath(curve_dir) if curve_dir else ''}"
    return f"ipc://{node_dir()}/relay-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.sock"


class PathLock:
    """An exclusive ``flock`` beside an ipc path: one relay binds it at a time (a second bind
    would silently steal the path from the first). The kernel releases it when its holder dies;
    a holder that ends cleanly removes the lock file (nothing is left on the node after the job),
    so a lock taken on a file that was removed meanwhile is not held: it is taken again on the
    file now at the path."""

    def __init__(self, path: str) -> None:
        self.path = path + ".lock"
        self._fd: int | None = None

    def acquire(self, blocking: bool) -> bool:
        """Take the lock (waiting for it when ``blocking``); False when held elsewhere."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
                if _same_file(fd, self.path):
                    self._fd = fd
                    return True
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # its holder removed it as we waited: the next holder's file is at the path

    def release(self) -> None:
        """Let the next relay in (idempotent); the file goes while still held, so whoever waited
        on it takes the lock again on a fresh file."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is the file now at ``path``."""
    try:
        at = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (at.st_dev, at.st_ino)


def _remove_ipc(address: str) -> None:
    """Remove the socket file a relay bound (libzmq leaves it behind after closing)."""
    if address.startswith("ipc://"):
        with contextlib.suppress(OSError):
            os.unlink(address[len("ipc://"):])
