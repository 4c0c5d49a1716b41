"""How much of the probe's time the monitor's side may take with commands (:class:`CommandGate`).

A monitor sends a handful of commands a minute: a "pace" every 2 s while it paces, a ``k`` key's
"kernels_now" (every rank behind the monitor's connection sees every rank's). Anything that
accepts the probe's connection where the monitor listens (a process squatting its port) can send
thousands a second; the sender thread read and refused them all, taking the interpreter lock from
training (+2-3 % step time, bench/command_flood.py) while nothing said so.

Commands pass a token bucket (BURST, then RATE_PER_S). Past it the frame is dropped unread and
counted, and the link leaves its socket alone for PAUSE_S: no read, no send, no poll. That last
part matters: an XPUB moves every upstream frame from its pipe into an unbounded queue of its own
whenever the socket is touched at all (a send, ``zmq_poll``, ``ZMQ_EVENTS``), so only a socket left
alone lets RCVHWM and TCP hold the flood back at the squatter (measured with real sockets: an XPUB
asked for its events every 10 ms queued all of 2.1 M frames flooded in 3 s, one that sent a frame
every 10 ms 0.6 M, one left alone 100, its RCVHWM). Subscriptions arrive on the same socket and wait
with it; connections are tracked by the socket monitor, which the pause does not touch.
"""

from __future__ import annotations

import time

#: The bucket: a burst of BURST commands, then RATE_PER_S a second (a monitor sends ~0.5 a second).
BURST = 32
RATE_PER_S = 4.0
#: Seconds the link leaves its socket alone once a command was over the bucket.
PAUSE_S = 1.0
#: Frames the probe's socket queues for the sender from its pipe while it is left alone (ZMQ_RCVHWM;
#: the sender reads them all when the pause ends, up to DRAIN_MAX).
RCVHWM = 100
#: Frames one poll reads at most once a command was over the bucket: what the XPUB queued before the
#: pause (cheap to drop: ~1.5 µs each, no decoding), so its queue never grows from one pause to the next.
DRAIN_MAX = 1024


class CommandGate:
    """The token bucket of one link's commands, its drops and its pauses (the sender thread's)."""

    def __init__(self) -> None:
        self._tokens = float(BURST)
        self._at = time.monotonic()
        self.dropped = 0  # commands dropped unread so far
        self.paused_until = 0.0  # monotonic: the socket is left alone until then
        self._seen = 0  # commands since the bucket was last full ...
        self._since = 0.0  # ... from then (its first)
        self.warning: str | None = None  # the first flood, in words (said once by the link)

    def admit(self, now: float) -> bool:
        """Whether one more command may be read (takes a token); False: drop it."""
        tokens = min(BURST, self._tokens + (now - self._at) * RATE_PER_S)
        self._at = now
        if tokens >= BURST or self._seen == 0:  # full again: a new count of what comes
            self._seen, self._since = 0, now
        self._seen += 1
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        self.dropped += 1
        return False

    def pause(self, now: float) -> None:
        """Leave the socket alone for PAUSE_S (a command was over the bucket)."""
        self.paused_until = now + PAUSE_S
        if self.warning is None:
            took = now - self._since
            span = max(took, 1.0)  # a lower bound: what one read found came within a second or less
            within = f"{took:.1f} s" if took >= 1.0 else f"{took * 1000:.0f} ms"
            self.warning = (f"{self._seen / span:,.0f} commands/s or more from the monitor's side ({self._seen:,} "
                            f"within {within}), over the limit of {RATE_PER_S:g}/s (bursts of "
                            f"{BURST}): the excess is dropped unread and the probe's socket left alone "
                            f"{PAUSE_S:g} s at a time; a port squatter, or something other than flowtop's "
                            "monitor listening where it should?")

    def paused(self, now: float) -> bool:
        return now < self.paused_until
