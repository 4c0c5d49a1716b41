"""The doctor's handshake check: a probe's ZeroMQ handshake with the monitor, keys and all. No Textual.

The port check only reads the listener's greeting: a monitor whose CURVE server key is not the
one in the probes' key directory (a stale or another copy) answers it the same, and then drops
every probe before its handshake completes, with nothing said on the probe's side but the
disconnection (probe.transport.link). Here the doctor connects as a probe does (an XPUB with the
directory's client keys) and reads its socket's events for a moment.
"""

from __future__ import annotations

import time
from typing import Any

from flowtop.tools.doctor_checks import FAIL, OK, WARN, Finding
from probe.wire.link import DROPPED

#: Seconds the doctor waits for the handshake's outcome.
HANDSHAKE_WAIT_S = 3.0


def handshake_finding(listen: str, keys: tuple[bytes, bytes, bytes] | None, curve_dir: str | None,
                      wait_s: float = HANDSHAKE_WAIT_S) -> Finding:
    """Connect to ``listen`` as a probe would, with ``keys`` (monitor public, own public, own
    secret; None: no CURVE) from ``curve_dir``, and say how the handshake went."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    if "[" in listen:  # an IPv6 literal: ZeroMQ sockets are IPv4-only unless told
        sock.setsockopt(zmq.IPV6, 1)
    if keys is not None:
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = keys
    failed = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
              | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    events = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | failed)
    outcome: Any = None
    try:
        sock.connect(listen)
        deadline = time.monotonic() + wait_s
        while outcome is None and time.monotonic() < deadline:
            if not events.poll(int(1000 * max(0.0, deadline - time.monotonic())) + 1):
                break
            ev = recv_monitor_message(events)
            # "No detail" with an errno the peer's close gives: refused (probe.wire.link.DROPPED);
            # any other (a timeout) says the monitor did not answer, not that it refused.
            if ev["event"] == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and ev.get("value") not in DROPPED:
                outcome = None
                break
            outcome = ev["event"]
    finally:
        sock.disable_monitor()
        events.close(0)
        sock.close(0)
        ctx.term()
    return _finding(listen, curve_dir, outcome, zmq, wait_s)


def _finding(listen: str, curve_dir: str | None, outcome: Any, zmq: Any, wait_s: float) -> Finding:
    keyed = f"with the keys in {curve_dir}" if curve_dir else "without CURVE keys"
    details = {"outcome": str(outcome)}
    if outcome == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return Finding("handshake", OK, f"the monitor at {listen} completed a probe's handshake {keyed}", "", details)
    if outcome == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return Finding("handshake", FAIL, f"the monitor at {listen} refused the client key in {curve_dir}",
                       f"copy {curve_dir}/client.key into the monitor's clients/ directory", details)
    if outcome is None:
        return Finding("handshake", WARN, f"no handshake with {listen} within {wait_s:g} s", "", details)
    # Another failure (ZeroMQ gives no detail, or the connection just ends): a server key that
    # is not the directory's, keys on one side only.
    if curve_dir:
        return Finding("handshake", FAIL, f"the monitor at {listen} did not complete a probe's handshake {keyed}: "
                       f"its CURVE server key is not {curve_dir}/server.key (a stale or another key directory), "
                       "or it runs without keys",
                       "give the probes the monitor's own key directory (the one its --curve-dir names)", details)
    return Finding("handshake", FAIL, f"the monitor at {listen} did not complete a probe's handshake {keyed}: "
                   "it requires them", "--curve-dir DIR (the monitor's key directory) or FLOWTOP_CURVE_DIR", details)
