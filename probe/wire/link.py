"""How a sender's upstream socket is set: the probe's (probe.transport.publisher) and a node
relay's (flowtop.tools.relay), which stands in for its ranks and must behave like one. Option names
and values only, applied with pyzmq by each side (the wire itself imports no ZeroMQ).

LINGER 0 while a sender runs: exit never waits for a monitor (a stopping probe lingers for the
rest of its close()'s time, a stopping relay for a second: each side sets that as it closes).
SNDHWM 1000 with IMMEDIATE and XPUB_NODROP: nothing queues for a monitor not connected yet, and a
full pipe refuses the send (the sender counts a drop) instead of blocking or dropping silently.
Reconnects start at a random 100-400 ms: libzmq adds no jitter, and hundreds of ranks (a
cluster's relays) would reconnect in lockstep.
Heartbeats every 2 s, a peer silent 6 s is gone (a dead monitor behind a NAT or a pulled cable).
RCVHWM 100: what the socket takes from a command flood while its sender leaves it alone
(probe.wire.command_bound).
"""

from __future__ import annotations

import errno
import random

from probe.wire.command_bound import RCVHWM


def upstream_options(addr: str, rng: random.Random | None = None) -> list[tuple[str, int]]:
    """(pyzmq option name, value) pairs for an XPUB that connects to ``addr``, in order."""
    options = [
        ("LINGER", 0), ("SNDHWM", 1000), ("IMMEDIATE", 1), ("XPUB_NODROP", 1),
        ("RECONNECT_IVL", (rng or random).randint(100, 400)), ("RECONNECT_IVL_MAX", 3000),
        ("HEARTBEAT_IVL", 2000), ("HEARTBEAT_TIMEOUT", 6000), ("RCVHWM", RCVHWM),
    ]
    if "[" in addr:  # an IPv6 literal such as tcp://[::1]:5759
        options.append(("IPV6", 1))
    return options


#: The errno values of a handshake that failed "with no detail" because the peer closed it (a
#: timeout is EAGAIN: a monitor that does not answer, not one that refused).
DROPPED = (errno.EPIPE, errno.ECONNRESET)
#: CURVE handshakes in a row the monitor closed, past which a sender says why it may be.
CLOSED_WARN = 3


class ClosedHandshakes:
    """CURVE handshakes in a row that the monitor closed, for the probe's link and a relay's
    upstream socket alike. A monitor whose CURVE server key is not the one the sender holds (a
    stale or another key directory) cannot read its hello and closes the connection; libzmq says
    only "handshake failed, no detail" with a broken pipe, again at every reconnect, and the sender
    looked exactly as if no monitor listened. A few in a row say so (one alone: a monitor that
    stopped mid-handshake); a handshake that timed out (a stopped or overloaded monitor) is not
    counted, nor is a keyless sender's (the protocol failure says that one)."""

    def __init__(self) -> None:
        self.count = 0

    def succeeded(self) -> None:
        self.count = 0

    def failed(self, value: object, curve: bool) -> bool:
        """A "no detail" failure with errno ``value`` of a socket with (``curve``) or without CURVE
        keys: whether it is the one to warn of (the CLOSED_WARN-th in a row)."""
        if not curve or value not in DROPPED:
            return False
        self.count += 1
        return self.count == CLOSED_WARN


def closed_text(endpoint: str, who: str, keys: str, stops: str) -> str:
    """The warning of :class:`ClosedHandshakes` (``who``: "this probe's", "the relay's"; ``keys``:
    whose key the sender holds, and from where; ``stops``: what it means for the data)."""
    return (f"the monitor at {endpoint} closed {who} connection during its CURVE handshake, {CLOSED_WARN} "
            f"times in a row: its CURVE server.key is not {keys} (a stale or another key "
            f"directory), or what listens there is not a flowtop monitor; {stops}")
