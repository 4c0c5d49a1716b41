"""Whether a monitor listens at an address, said before a command or a relay starts. No Textual.

``flowtop run`` and ``flowtop relay`` say once, before anything is sent, that nothing listens yet
at a loopback monitor address (the training runs anyway, and a monitor started later sees it), or
that a remote monitor's host name does not resolve here (the sockets would retry it quietly).
``flowtop snapshot`` that finds its address taken by another monitor says how to read that one's
snapshot instead (:func:`snapshot_elsewhere`).
"""

from __future__ import annotations

import os
import shlex
import sys

def no_monitor_note(addr: str, curve_dir: str | None = None) -> str | None:
    """A word for a user who started the training first: nothing listens on ``addr``, a loopback
    monitor address (the probes send nothing until a monitor does; a remote one is not tried,
    a connection attempt could hang on a firewall). None when something listens there.
    ``curve_dir``: the keys the probes (or the relay) hold upstream, which the monitor named
    must hold too."""
    import socket

    from flowtop.monitor.collector import AddressError, parse_tcp

    if addr.startswith("ipc://"):
        # a relay's path, on this host: something listens when a connection is accepted there
        # (a stale socket file refuses it)
        return None if _unix_listens(addr[len("ipc://"):]) else _nothing_there(addr, curve_dir)
    try:
        host, port = parse_tcp(addr)
    except AddressError:
        return None
    if host not in LOOPBACK:
        return unresolved_note(host, addr)
    # The kernel's table first; a knock only where it shows no listener (it cannot be read
    # here, or a listener it does not show: another network namespace, a forwarded port).
    listens = _listens(host, port)
    if not listens:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                listens = True
        except OSError:
            listens = False
    if listens:
        return None
    return _nothing_there(addr, curve_dir)


def _nothing_there(addr: str, curve_dir: str | None) -> str:
    who = "relay" if addr.startswith("ipc://") else "monitor"
    command = listen_command(addr, curve_dir)
    if command is None:  # no command of ours listens there: naming one would fail when run
        return f"no {who} listens on {addr} yet; the training runs meanwhile"
    return (f"no {who} listens on {addr} yet: start `{command}` (another terminal) to watch "
            "this job; the training runs meanwhile, and the monitor sees it from when it starts")


def listen_command(addr: str, curve_dir: str | None = None) -> str | None:
    """The command that listens on ``addr``: a plain ``flowtop`` binds only the default address
    (advice without ``--listen`` elsewhere would start a monitor that never hears this job); an
    ipc:// path is a node relay's, which forwards to a monitor (MONITOR: its tcp address), and
    only where ``flowtop relay --listen`` takes it (relay_setup.check_listen: an absolute path;
    an @abstract or relative one it refuses): None there. With ``curve_dir`` (the keys the
    sender holds) the monitor's command takes ``--curve-dir DIR`` too: one started as advised
    without it refused every handshake of a ``flowtop run --curve-dir`` job (a trial)."""
    from flowtop.tools.relay_setup import RelayError, check_listen
    from probe.wire import DEFAULT_ADDR

    if addr.startswith("ipc://"):
        try:
            check_listen(addr)
        except RelayError:
            return None
        return f"flowtop relay --listen {addr} --connect MONITOR"
    keys = f" --curve-dir {shlex.quote(os.path.abspath(curve_dir))}" if curve_dir else ""
    if addr == DEFAULT_ADDR:
        return f"flowtop{keys}"
    return f"flowtop --listen {addr}{keys}"


def _unix_listens(path: str) -> bool:
    """Whether a socket accepts connections at ``path`` (``@NAME``: a Linux abstract socket)."""
    import socket

    where = "\0" + path[1:] if path.startswith("@") else path
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(where)
        except OSError:
            return False
    return True


#: Seconds a monitor host's name may take to resolve before :func:`unresolved_note` stops waiting
#: (a resolver that does not answer says nothing about the name).
RESOLVE_WAIT_S = 2.0


def unresolved_note(host: str, addr: str, wait_s: float | None = None) -> str | None:
    """A word when the monitor's host name does not resolve here (a typo, another site's name):
    the probes' sockets retry it quietly forever, and the job would look as if no monitor ever
    listened. None when it resolves, is an address, or the resolver does not answer in time."""
    import socket
    import threading

    result: list[BaseException | None] = []

    def resolve() -> None:
        try:
            socket.getaddrinfo(host, None)
            result.append(None)
        except OSError as exc:
            result.append(exc)

    worker = threading.Thread(target=resolve, name="flowtop-resolve", daemon=True)
    worker.start()
    worker.join(RESOLVE_WAIT_S if wait_s is None else wait_s)
    if not result or result[0] is None:
        return None
    reason = getattr(result[0], "strerror", None) or str(result[0])
    return (f"the monitor's host {host!r} ({addr}) does not resolve here: {reason}; the training runs, "
            "its ranks send nothing until it does")


#: Seconds :func:`served_snapshot_url` waits for a monitor's HTTP answer (on this host).
HTTP_WAIT_S = 0.5


def served_snapshot_url(listen: str, http: str | None = None, wait_s: float = HTTP_WAIT_S) -> str | None:
    """The ``/snapshot.json`` URL of the monitor that holds ``listen``, when it serves HTTP at
    ``http`` (HOST:PORT; default ``flowtop serve``'s ``--prometheus``, on this host) and its
    snapshot's ``listen`` is on the same port (the address a bind found taken); None when nothing
    answers there in ``wait_s``, or another monitor does. Made only once a bind failed; the first
    4 KB of the answer are read (the server renders it once per snapshot: little to it either)."""
    import re
    import urllib.request

    from flowtop.export.metrics_http import parse_hostport
    from flowtop.monitor.collector import AddressError, parse_tcp
    from flowtop.tools.common import SERVE_PROMETHEUS

    where = parse_hostport(http or SERVE_PROMETHEUS)
    host = "127.0.0.1" if where.host == "0.0.0.0" else "::1" if where.host == "::" else where.host
    base = f"http://[{host}]:{where.port}" if ":" in host else f"http://{host}:{where.port}"
    try:
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this host: never a proxy
        with direct.open(f"{base}/snapshot.json", timeout=wait_s) as answer:
            text = answer.read(4096).decode("utf-8", "replace")  # "listen" comes first; the rest is left unread
    except (OSError, ValueError):  # nothing there, no HTTP, a timeout, no snapshot yet (503)
        return None
    found = re.search(r'"listen": ?"([^"]*)"', text)
    if found is None:
        return None

    def port(addr: str) -> str:
        try:
            return str(parse_tcp(addr)[1])
        except AddressError:
            return addr  # ipc://PATH: the whole address

    return f"{base}/snapshot.json" if port(found.group(1)) == port(listen) else None


def snapshot_elsewhere(listen: str, http: str | None = None) -> str:
    """What ``flowtop snapshot`` says when another monitor holds ``listen`` (the ranks report to
    that one; a snapshot listens for them itself, so it cannot run beside it): the running
    monitor's snapshot URL when :func:`served_snapshot_url` finds it, else how to find it."""
    url = served_snapshot_url(listen, http)
    if url is not None:
        return (f"a monitor already listens on {listen} and serves its snapshot: "
                f"curl -s {url}  (the JSON of flowtop snapshot --json)")
    from flowtop.tools.common import SERVE_PROMETHEUS

    return (f"another monitor holds {listen}: read its snapshot over HTTP instead, "
            f"curl -s http://HOST:PORT/snapshot.json at its --prometheus address (flowtop serve: "
            f"{SERVE_PROMETHEUS} by default; flowtop top only when started with --prometheus); or give this "
            f"snapshot another --listen and point the training there (FLOWTOP_ADDR, flowtop run --connect)")


#: The monitor addresses :func:`no_monitor_note` looks at, and the addresses a socket listening
#: for each of them may be bound to (its own, or every address of its family).
LOOPBACK = {"127.0.0.1": ("127.0.0.1", "::ffff:127.0.0.1", "0.0.0.0", "::"), "::1": ("::1", "::"),
            "localhost": ("127.0.0.1", "::ffff:127.0.0.1", "::1", "0.0.0.0", "::")}


def _listens(host: str, port: int) -> bool | None:
    """Whether a socket on this host listens on ``host``:``port``, read from the kernel's socket
    tables; None where they cannot be read (not Linux, or a form not known here). Read before
    knocking: a connection to the monitor's port, however short, is one more upstream connection
    of the node while the node's relay holds its one (seen in tests/test_relay.py when a second
    ``flowtop run`` started), and a connection the monitor's socket accepts for nothing."""
    try:
        listening = _proc_listeners()
    except (ValueError, IndexError):  # a table in a form not known here: knock instead
        return None
    if listening is None:
        return None
    bound = LOOPBACK[host]
    return any(p == port and ip in bound for ip, p in listening)


def _proc_listeners() -> list[tuple[str, int]] | None:
    """(address, port) of every listening TCP socket, from Linux's /proc/net/tcp and tcp6 (None
    without them: elsewhere the caller knocks). psutil finds the same by walking every process's
    descriptors, ~10 ms here and more on a node whose processes hold thousands (once per
    ``flowtop run``, per rank of an srun); addresses are written as psutil writes them."""
    import ipaddress

    out: list[tuple[str, int]] = []
    found = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            cols = line.split()
            if len(cols) < 4 or cols[3] != "0A":  # 0A: LISTEN
                continue
            addr, _, port = cols[1].partition(":")
            raw = bytes.fromhex(addr)  # each 32-bit word printed in the host's byte order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
            if len(words) == 4:
                ip = str(ipaddress.IPv4Address(words))
            else:
                v6 = ipaddress.IPv6Address(words)  # an IPv4-mapped one written as psutil (and Python 3.13) do
                ip = f"::ffff:{v6.ipv4_mapped}" if v6.ipv4_mapped is not None else str(v6)
            out.append((ip, int(port, 16)))
    return out if found else None
