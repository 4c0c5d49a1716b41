"""Whether what listens at ``flowtop run``'s monitor address is a flowtop monitor. No Textual.

A new user's trial: with another program on the monitor's port (``python -m http.server 5759``,
any TCP server) ``flowtop run`` said nothing, and the ranks' frames went nowhere: their sockets
connect, the handshake never completes (a silent peer times it out after 30 s, quietly, again and
again), and no probe warning fires, as none is about a peer that is no ZeroMQ at all.

So ``flowtop run`` connects once as a probe does (an XPUB with the probes' CURVE keys, if any)
on a thread of its own while CMD starts, reads the socket's events for a few seconds and says
once on stderr, with the address and what to do, where a peer accepted the connection but did
not complete a flowtop handshake. A peer that completes it (a monitor, a node relay) is fine;
nothing listening is :func:`flowtop.tools.listening.no_monitor_note`'s to say; a refused CURVE
key the probes say themselves (probe.transport.link). It never delays or touches CMD.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

#: How long the check gives a peer to complete the handshake (its socket's HANDSHAKE_IVL): a
#: monitor on loopback answers in milliseconds, one across a loaded cluster well inside this.
HANDSHAKE_S = 3.0
#: How long the check waits in all (the handshake's time out, and a moment for its event).
WAIT_S = HANDSHAKE_S + 1.5
#: How long a peer that did not complete the handshake gets to send a ZeroMQ greeting on a plain
#: connection (:func:`zmtp_mechanism`): libzmq's I/O thread writes it on accepting.
GREETING_S = 1.5
#: How long a second try gives a peer that greets as ZeroMQ does but did not complete the
#: handshake within HANDSHAKE_S (:func:`check_peer`): a monitor whose loop is that busy.
PATIENCE_S = 30.0


@dataclass(frozen=True)
class PeerOutcome:
    """What the check saw: whether a connection was made, and how its handshake ended
    ("ok", "auth" refused the key, "protocol" failed, "closed" by the peer, "timeout" with no
    answer, "none" with no handshake event at all while connected; :func:`check_peer`'s "zeromq"
    for either where the peer greets as ZeroMQ does and a second, patient try failed too)."""

    connected: bool
    handshake: str


def watch_peer(addr: str, keys: tuple[bytes, bytes, bytes] | None, stop: threading.Event,
               wait_s: float = WAIT_S, handshake_s: float = HANDSHAKE_S) -> PeerOutcome:
    """Connect to ``addr`` as a probe does and read the socket's events until the handshake's
    outcome (given ``handshake_s``), ``wait_s`` or ``stop``."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    from probe.wire.link import DROPPED

    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_s * 1000))
    if "[" in addr:  # an IPv6 literal
        sock.setsockopt(zmq.IPV6, 1)
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
    events = sock.get_monitor_socket()
    connected, handshake = False, "none"
    try:
        sock.connect(addr)
        deadline = time.monotonic() + wait_s
        while handshake == "none" and not stop.is_set() and time.monotonic() < deadline:
            if not events.poll(100):
                continue
            ev = recv_monitor_message(events)
            kind = ev["event"]
            if kind == zmq.EVENT_CONNECTED:
                connected = True
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                handshake = "ok"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                handshake = "auth"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                handshake = "protocol"
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                handshake = "closed" if ev.get("value") in DROPPED else "timeout"
    finally:
        sock.disable_monitor()
        events.close(0)
        sock.close(0)
        ctx.term()
    return PeerOutcome(connected, handshake)


def check_peer(addr: str, keys: tuple[bytes, bytes, bytes] | None, stop: threading.Event,
               patience_s: float = PATIENCE_S) -> PeerOutcome:
    """:func:`watch_peer`, and where the peer did not complete the handshake in time but speaks
    ZeroMQ (:func:`zmtp_mechanism`), a second try given ``patience_s``: a monitor answers the
    handshake only once its ZAP handler, on its loop, has, and a loop busy with a burst of hellos
    (thousands of ranks, thousands of these checks) was called "not a flowtop monitor" (a
    reviewer's repro: a real monitor's loop held 5 s). Its I/O thread greets at once all the
    same. "zeromq": the second try failed too (another ZeroMQ program, or a monitor that busy).
    Where the handshake was closed or failed, the greeting's mechanism tells a monitor whose keys
    the probes' do not match: "curve_needed", "curve_other", "curve_unwanted"."""
    outcome = watch_peer(addr, keys, stop)
    if not outcome.connected or outcome.handshake in ("ok", "auth") or stop.is_set():
        return outcome
    mechanism = zmtp_mechanism(addr, stop)
    if mechanism is None:
        return outcome
    if outcome.handshake in ("closed", "protocol"):
        # A flowtop monitor with keys, probes without (or other keys), or the other way round: its
        # greeting names its mechanism (it was told "not a flowtop monitor: stop that program").
        if mechanism == "CURVE":
            return PeerOutcome(True, "curve_other" if keys is not None else "curve_needed")
        return PeerOutcome(True, "curve_unwanted") if mechanism == "NULL" and keys is not None else outcome
    again = watch_peer(addr, keys, stop, patience_s + 1.5, patience_s)
    return again if again.handshake == "ok" or stop.is_set() else PeerOutcome(True, "zeromq")


#: The start of a ZMTP 3 greeting, its signature and major version: what makes a ZeroMQ peer send
#: the rest of its own (its mechanism: "CURVE" for a monitor with keys). No mechanism of ours: a
#: peer that read one it does not share closed before its own was flushed.
_GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03"


def zmtp_mechanism(addr: str, stop: threading.Event, wait_s: float = GREETING_S) -> str | None:
    """The security mechanism the peer at ``addr`` (tcp or ipc) names in its ZeroMQ greeting
    ("NULL", "CURVE"), read on a plain connection of its own within ``wait_s``; None where it
    writes no ZeroMQ greeting (not ZeroMQ); "" where it wrote a ZeroMQ signature only."""
    import socket

    from flowtop.monitor.collector import AddressError, parse_tcp

    try:
        if addr.startswith("ipc://"):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(wait_s)
            conn.connect(addr[len("ipc://"):])
        else:
            conn = socket.create_connection(parse_tcp(addr), timeout=wait_s)
    except (OSError, AddressError):
        return None
    got = b""
    deadline = time.monotonic() + wait_s
    try:
        conn.settimeout(0.1)
        conn.sendall(_GREETING)
        while len(got) < 32 and not stop.is_set() and time.monotonic() < deadline:
            try:
                chunk = conn.recv(32 - len(got))
            except socket.timeout:
                continue
            if not chunk:
                break
            got += chunk
    except OSError:
        pass  # what it wrote before it closed still says what it is
    finally:
        conn.close()
    if len(got) < 10 or got[0] != 0xFF or got[9] != 0x7F:
        return None
    return got[12:32].rstrip(b"\x00").decode("ascii", "replace") if len(got) == 32 else ""


#: What to say of a ZeroMQ peer whose greeting names a mechanism the probes' keys do not match.
_KEYS_NOTES = {
    "curve_needed": "requires CURVE keys (its greeting says so) and the probes have none: give the key "
                    "directory `flowtop keys` made (--curve-dir DIR, or FLOWTOP_CURVE_DIR)",
    "curve_other": "uses CURVE keys but closed the handshake with the probes' (--curve-dir): its server.key is "
                   "not the one in the probes' key directory",
    "curve_unwanted": "has no CURVE keys but the probes do (--curve-dir): start the monitor with the same "
                      "--curve-dir, or leave it out here",
}


def peer_note(addr: str, outcome: PeerOutcome, curve: bool) -> str | None:
    """What to tell the user of ``outcome`` at ``addr`` (``curve``: the probes hold keys), or None."""
    if not outcome.connected or outcome.handshake in ("ok", "auth"):
        return None  # nothing listens (said before CMD started), a monitor, or a key the probes name
    keys_note = _KEYS_NOTES.get(outcome.handshake)
    if keys_note is not None:
        return f"the monitor on {addr} {keys_note}; the training runs, but its ranks' frames go nowhere"
    fix = ("stop that program, or start the monitor on another port (flowtop --listen tcp://HOST:OTHER) "
           "and give the same address here (--connect tcp://HOST:OTHER); `flowtop doctor` checks it")
    what = {
        "protocol": "answered a flowtop probe's ZeroMQ handshake with a protocol error",
        "closed": "closed a flowtop probe's connection during its handshake",
        "timeout": f"did not answer a flowtop probe's handshake within {HANDSHAKE_S:g} s",
        "none": f"did not complete a flowtop probe's handshake within {HANDSHAKE_S:g} s",
        "zeromq": f"speaks ZeroMQ but did not complete a flowtop probe's handshake within {HANDSHAKE_S:g} s, nor "
                  f"within {PATIENCE_S:g} s more (another ZeroMQ program, or a monitor too busy to answer)",
    }[outcome.handshake]
    keyed = ""
    if outcome.handshake in ("protocol", "closed"):  # what a monitor with other keys does too
        keyed = (" (or it is a monitor whose CURVE key is not the one in the probes' key directory)" if curve else
                 " (or it is a monitor that requires CURVE keys: --curve-dir)")
    return (f"something listens on {addr} but it is not a flowtop monitor: it {what}{keyed}; the training runs, "
            f"but its ranks' frames go nowhere: {fix}")


def start_check(addr: str, keys: tuple[bytes, bytes, bytes] | None,
                say: Callable[[str], None] | None = None) -> Callable[[], None]:
    """Run the check on a daemon thread; return what stops it (and waits for it, briefly): the
    caller's end must not wait out the check, nor leave a ZeroMQ context open at exit."""
    stop = threading.Event()
    tell = say or (lambda text: print(f"flowtop run: {text}", file=sys.stderr, flush=True))

    def check() -> None:
        try:
            note = peer_note(addr, check_peer(addr, keys, stop), keys is not None)
        except Exception:  # noqa: BLE001 - a check that fails says nothing: the run goes on
            return
        if note and not stop.is_set():
            tell(note)

    thread = threading.Thread(target=check, name="flowtop-peer-check", daemon=True)
    thread.start()

    def end() -> None:
        stop.set()
        thread.join(1.0)

    return end

