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
"""

from __future__ import annotations

import random


def upstream_options(addr: str, rng: random.Random | None = None) -> list[tuple[str, int]]:
    """(pyzmq option name, value) pairs for an XPUB that connects to ``addr``, in order."""
    options = [
        ("LINGER", 0), ("SNDHWM", 1000), ("IMMEDIATE", 1), ("XPUB_NODROP", 1),
        ("RECONNECT_IVL", (rng or random).randint(100, 400)), ("RECONNECT_IVL_MAX", 3000),
        ("HEARTBEAT_IVL", 2000), ("HEARTBEAT_TIMEOUT", 6000),
    ]
    if "[" in addr:  # an IPv6 literal such as tcp://[::1]:5759
        options.append(("IPV6", 1))
    return options


def subscription_change(frame: bytes) -> int:
    """What a frame an XPUB receives says of its subscribers: +1 (a subscription), -1 (one
    ended) or 0 (anything else: a monitor's command sent up an XSUB). Read by the probe's link
    and a relay's upstream socket alike."""
    head = frame[:1]
    return 1 if head == b"\x01" else -1 if head == b"\x00" else 0
