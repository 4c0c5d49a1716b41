"""How many commands a peer takes from the monitor's side, and what it does past that: part of the
protocol's contract, kept alike by both peers that receive commands (a probe's link,
probe.transport.gate; a node relay's upstream socket, flowtop.tools.relay_commands). Standard
library only, like the rest of the wire.

A monitor sends few commands: one "pace" for every job every 2 s while it paces
(flowtop.monitor.pacing.RENEW_S), a "kernels_now" per ``k`` key press, limited on its own side
(flowtop.monitor.kernel_asks), and a rare "hello_now" for ranks it forgot
(flowtop.monitor.hello_asks): its budget, MONITOR_RATE_PER_S and MONITOR_BURST below, stays far
inside the bucket, so no peer ever drops one of the monitor's own commands, however long a key is
held. It sends each on every connection at once (its XSUB), so a node relay's upstream socket
receives exactly the stream a probe connected directly does, and bounds it with these same numbers:
a flood stops at the relay instead of crossing the node's loopback to every rank. The relay's
bucket is not each rank's, though: a rank that connects after a flood starts with a full bucket
while the relay's is drained, so for up to BURST / RATE_PER_S (8 s) the relay drops commands that
rank, connected directly, would have taken. Only a flood beyond the monitor's budget drains it.

Commands pass a token bucket (BURST, then RATE_PER_S). Past it the frame is dropped unread and
counted, and the peer leaves its socket alone for PAUSE_S (no read, no send, no poll): both peers'
sockets are XPUBs, which take everything their pipe holds into an unbounded queue whenever they are
touched (measured for each: probe.transport.gate, flowtop.tools.relay_commands), so only a socket
left alone lets RCVHWM and TCP hold the flood back at the sender.
"""

from __future__ import annotations

import time
from typing import Callable

#: The bucket: a burst of BURST commands, then RATE_PER_S a second (a monitor sends ~0.5 a second;
#: a held ``k`` key repeating ~25-30 times a second fills the burst in about a second).
BURST = 32
RATE_PER_S = 4.0
#: Seconds the peer leaves its socket alone once a command was over the bucket (read here when a
#: pause starts: tests shorten it in this module, its one binding).
PAUSE_S = 1.0
#: Frames the peer's socket queues from its pipe while it is left alone (ZMQ_RCVHWM, set with the
#: rest of a sender's upstream options: probe.wire.link; the peer reads them when the pause ends).
RCVHWM = 100
#: Frames one read takes at most once a command was over the bucket: what the XPUB queued before
#: the pause (cheap to drop: ~1.5 µs each, no decoding), so its queue never grows from one pause to
#: the next.
DRAIN_MAX = 1024

# The monitor's own budget (the other side of the contract): all it sends stays well inside the
# bucket, so a peer's drops and pauses only ever meet a flood, never the user's keys.
#: Paces: one broadcast for every job at once every flowtop.monitor.pacing.RENEW_S (2 s), at most.
PACES_PER_S = 0.5
#: kernels_now (the ``k`` key; flowtop.monitor.kernel_asks): one per rank target every
#: KERNELS_TARGET_S (a press within it is folded into the one asked), and all targets together
#: KERNELS_BURST at once, then KERNELS_RATE_PER_S.
KERNELS_TARGET_S = 1.0
KERNELS_BURST = 4
KERNELS_RATE_PER_S = 1.0
#: hello_now (flowtop.monitor.hello_asks): a monitor that forgot ranks (it evicted their job while
#: they were silent) asks a job, or every job, for their hellos and FLOP counts again: HELLO_ASKS_BURST
#: at once, then HELLO_ASKS_RATE_PER_S.
HELLO_ASKS_BURST = 2
HELLO_ASKS_RATE_PER_S = 0.25
#: What the monitor sends at most: 1.75 a second (RATE_PER_S / 2.3) and 7 at once (BURST / 4.6).
MONITOR_RATE_PER_S = PACES_PER_S + KERNELS_RATE_PER_S + HELLO_ASKS_RATE_PER_S
MONITOR_BURST = KERNELS_BURST + 1 + HELLO_ASKS_BURST
assert MONITOR_RATE_PER_S <= RATE_PER_S / 2 and MONITOR_BURST <= BURST / 4, "the monitor's budget has no margin"


def bound_text() -> str:
    """The bound in words, for what the monitor says of a peer that dropped commands."""
    return f"{BURST}, then {RATE_PER_S:g} a second"


class CommandBound:
    """The token bucket of one peer's commands, its drops and its pauses (one thread's).

    ``sock``: the peer's socket in words, for :attr:`warning` ("the probe's socket"). A pause lasts
    PAUSE_S as it is when the pause starts."""

    def __init__(self, sock: str) -> None:
        self._sock = sock
        self._tokens = float(BURST)
        self._at = time.monotonic()
        self.dropped = 0  # commands dropped unread so far
        self.paused_until = 0.0  # monotonic: the socket is left alone until then
        self._seen = 0  # commands since the bucket was last full ...
        self._since = 0.0  # ... from then (its first)
        self.warning: str | None = None  # the first flood, in words (said once by the peer)

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
        """Leave the socket alone for the pause (a command was over the bucket)."""
        pause_s = PAUSE_S
        self.paused_until = now + pause_s
        if self.warning is None:
            took = now - self._since
            span = max(took, 1.0)  # a lower bound: what one read found came within a second or less
            within = f"{took:.1f} s" if took >= 1.0 else f"{took * 1000:.0f} ms"
            self.warning = (f"{self._seen / span:,.0f} commands/s or more from the monitor's side ({self._seen:,} "
                            f"within {within}), over the limit of {RATE_PER_S:g}/s (bursts of "
                            f"{BURST}): the excess is dropped unread and {self._sock} left alone "
                            f"{pause_s:g} s at a time; a port squatter, or something other than flowtop's "
                            "monitor listening where it should?")

    def paused(self, now: float) -> bool:
        return now < self.paused_until


def subscription_change(frame: bytes) -> int:
    """What a frame an XPUB receives says of its subscribers: +1 (a subscription), -1 (one
    ended) or 0 (anything else: a monitor's command sent up an XSUB)."""
    head = frame[:1]
    return 1 if head == b"\x01" else -1 if head == b"\x00" else 0


def read_commands(bound: CommandBound, recv: Callable[[int], bytes], flags: int, again: type[Exception],
                  limit: int, now: float, subs: int, take: Callable[[bytes], object]) -> int:
    """One bounded read of a peer's upstream XPUB, the same for a probe's link and a relay: up to
    ``limit`` frames, or DRAIN_MAX once a command was over ``bound`` (dropped unread), which then
    pauses. Subscriptions move ``subs`` (returned); each command within the bound goes to
    ``take``. ``recv(flags)`` reads one frame and raises ``again`` when there is none (pyzmq's
    ``sock.recv``, ``zmq.NOBLOCK``, ``zmq.Again``: passed in, the wire imports no ZeroMQ).
    A caller finds a flood by ``bound.paused(now)`` afterwards."""
    over, read = False, 0
    while read < limit:
        try:
            frame = recv(flags)
        except again:
            break
        read += 1
        change = subscription_change(frame)
        if change:
            subs = max(0, subs + change)  # an old pipe's end may come after a reset to 0
        elif not bound.admit(now):  # a command over the bound: dropped unread
            if not over:
                over, limit = True, DRAIN_MAX
        else:
            take(frame)
    if over:
        bound.pause(now)
    return subs
