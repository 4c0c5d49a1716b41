"""What a node relay reads from upstream: (un)subscriptions, and the monitor's commands, which it
carries down to its ranks within the wire's bound (probe.wire.command_bound). No Textual.

Anything that accepts the relay's upstream connection (a process squatting the monitor's port) can
send commands as fast as it likes. The relay read 256 of them a poll and sent every one down to all
its ranks: its own CPU, the node's loopback and every rank's sender paid for the flood (each probe
then dropped them itself). Now commands pass the same token bucket as a probe's (BURST, then
RATE_PER_S: the monitor sends every connection the same commands, well within that bound, so the
relay drops none of a monitor's own; a rank that connects after a flood may miss a few it would
have taken directly, probe.wire.command_bound); past it a frame is dropped unread and counted (the relay's report's
``commands_dropped``, said once on the relay's stderr), what the socket queued is drained
(DRAIN_MAX, no decoding) and the relay leaves its upstream socket alone for PAUSE_S: no read, no
poll, no send (its batches and reports wait for the pause's end, whose turn sends them).

Leaving it alone is what bounds the flood, as for the probe (probe.transport.gate): the relay's
upstream socket is an XPUB set exactly as a probe's (probe.wire.link), and takes everything its pipe
holds into an unbounded queue of its own whenever it is touched. Measured with real sockets
(2-core VM, 2026-12-07; a squatter's XSUB sending 41-byte frames as fast as it could for 3 s, 1.3 to
2.9 M of them; the relay's upstream options; the frames the socket handed out afterwards, and the
growth of its process's memory): polled every 10 ms, as the relay's loop did at every turn, it took
0.46-0.52 M frames into its queue (+45-50 MB); sending a batch every 10 ms, 0.44-0.55 M (+39-42 MB);
left alone, its memory did not grow (the 70-93 k frames it handed out afterwards had waited in the
kernel's socket buffers and the squatter's own pipe). With RCVHWM 100 (now the relay's too):
polled 0.24-0.49 M (+17-28 MB), sending 0.10-0.23 M (+0-3 MB), left alone +0 MB (68-74 k after).
"""

from __future__ import annotations

import math
import time
from typing import Any

import zmq

from probe import wire
from probe.wire.command_bound import CommandBound, read_commands

#: Frames one read takes from upstream while commands stay within the bound (subscriptions too).
READ_MAX = 256
#: Largest command carried down (a monitor's are ~60 bytes; a probe refuses larger ones).
MAX_COMMAND_BYTES = 4096


class CommandsDown:
    """The relay's upstream reads: the commands' bound, what it carried down and the last pace."""

    def __init__(self) -> None:
        #: Its pauses last command_bound.PAUSE_S as it is when each starts (tests shorten it there).
        self.bound = CommandBound("the relay's upstream socket")
        self.carried = 0  # commands sent down to the ranks
        #: (flush_s, monotonic deadline) of the last pace carried down (the relay's reports slow with it).
        self.pace = (0.0, -math.inf)

    @property
    def dropped(self) -> int:
        """Commands dropped unread (over the bound)."""
        return self.bound.dropped

    def paused(self, now: float) -> bool:
        """Whether the upstream socket is to be left alone now."""
        return self.bound.paused(now)

    def read(self, up: Any, down: Any, now: float, subs: int) -> int:
        """Read what upstream sent (READ_MAX frames, or DRAIN_MAX once a command was over the
        bound, which then pauses) and carry the commands within it down to every rank (each probe
        keeps those addressed to it: flowtop.tools.relay); return the upstream subscriptions, ``subs``
        before the read."""
        return read_commands(self.bound, up.recv, zmq.NOBLOCK, zmq.Again, READ_MAX, now, subs,
                             lambda msg: self._carry(msg, down))

    def _carry(self, msg: bytes, down: Any) -> None:
        """A command within the bound, carried down to every rank (a malformed one too: the ranks
        refuse and count it; an empty or oversized one is not)."""
        if msg and len(msg) <= MAX_COMMAND_BYTES:
            self._note_pace(msg)
            try:
                down.send(msg, zmq.NOBLOCK)
                self.carried += 1
            except zmq.ZMQError:
                pass

    def _note_pace(self, msg: bytes) -> None:
        """A command on its way down: a pace slows the relay's reports too (Relay._report_due).
        (The monitor paces every job at once; a pace for one job would slow the reports of a
        relay serving others too, by as much as it slows that job's telemetry.)"""
        try:
            cmd = wire.decode_control(msg)
        except wire.WireError:
            return  # the ranks refuse and count it
        if cmd.cmd == "pace" and cmd.flush_s is not None:
            self.pace = (cmd.flush_s, time.monotonic() + wire.PACE_TTL_S)
