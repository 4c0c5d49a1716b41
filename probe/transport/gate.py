"""How much of the probe's time the monitor's side may take with commands (:class:`CommandGate`).

A monitor sends a handful of commands a minute: a "pace" every 2 s while it paces, a ``k`` key's
"kernels_now" (every rank behind the monitor's connection sees every rank's). Anything that
accepts the probe's connection where the monitor listens (a process squatting its port) can send
thousands a second; the sender thread read and refused them all, taking the interpreter lock from
training (+2-3 % step time, bench/command_flood.py) while nothing said so.

Commands pass the wire's bound (probe.wire.command_bound: a token bucket, BURST then RATE_PER_S,
the same a node relay keeps). Past it the frame is dropped unread and counted, and the link leaves
its socket alone for PAUSE_S: no read, no send, no poll. That last part matters: an XPUB moves
every upstream frame from its pipe into an unbounded queue of its own whenever the socket is
touched at all (a send, ``zmq_poll``, ``ZMQ_EVENTS``), so only a socket left alone lets RCVHWM and
TCP hold the flood back at the squatter (measured with real sockets: an XPUB asked for its events
every 10 ms queued all of 2.1 M frames flooded in 3 s, one that sent a frame every 10 ms 0.6 M, one
left alone 100, its RCVHWM). Subscriptions arrive on the same socket and wait with it; connections
are tracked by the socket monitor, which the pause does not touch.
"""

from __future__ import annotations

from probe.wire.command_bound import CommandBound


class CommandGate(CommandBound):
    """The bound on one link's commands (the sender thread's). Its numbers are the wire's only
    (probe.wire.command_bound: tests shorten PAUSE_S there, read when a pause starts)."""

    def __init__(self) -> None:
        super().__init__("the probe's socket")
