"""How often the monitor asks its ranks to send their step records. No Textual.

A rank sends its step records every FLOWTOP_FLUSH_S (0.1 s): ten frames a second whatever its
step rate. A step frame costs the data thread ~10-15 µs to check and apply (bench/ingest.py
--costs), so 4,096 ranks at ten frames a second would take half a core or more on frames alone.
Past :data:`STEP_FRAMES_PER_S` ranks-times-ten, the monitor asks every rank (a "pace" command,
broadcast on the data connection and carried down by relays) to hold its records longer, so that
all of them together send about that many step frames a second. The probe never goes faster than
its own FLOWTOP_FLUSH_S, and a pace lapses after wire.PACE_TTL_S unless renewed: a monitor that
restarts, or hears fewer ranks, gets the ranks' own pace back within seconds.

What it costs: a step reaches the monitor up to the pace later (0.41 s at 4,096 ranks instead of
0.1 s); counts, kernel windows and byes still go at once; no record is lost. A paced probe samples
its telemetry less often by the same factor, to at most every 5 s
(probe.transport.publisher.paced_interval).
"""

from __future__ import annotations

import math

from probe import wire

#: Step frames a second the monitor takes from all its ranks together before it paces them.
STEP_FRAMES_PER_S = 10_000
#: The probes' default flush interval (FLOWTOP_FLUSH_S): below it a pace asks for nothing.
DEFAULT_FLUSH_S = 0.1
#: Granularity of a pace, seconds.
STEP_S = 0.05
#: Seconds between two "pace" broadcasts while pacing (well inside wire.PACE_TTL_S).
RENEW_S = 2.0


def pace_for(ranks: int) -> float | None:
    """The flush interval to ask of ``ranks`` live ranks, or None when their own will do."""
    flush = ranks / STEP_FRAMES_PER_S
    if flush <= DEFAULT_FLUSH_S:
        return None
    # In steps of 50 ms, up: a job whose live ranks come and go by a few does not change its pace.
    return min(wire.MAX_PACE_S, round(math.ceil(round(flush / STEP_S, 9)) * STEP_S, 3))


class Pacer:
    """When to broadcast which pace (the collector calls :meth:`due` as its clock advances)."""

    def __init__(self) -> None:
        self.current: float | None = None  # the pace last asked for (None: not pacing)
        self._next = 0.0

    def due(self, now: float, live_ranks: int) -> float | None:
        """The pace to broadcast now, or None (not due, or nothing to ask)."""
        if now < self._next:
            return None
        self._next = now + RENEW_S
        self.current = pace_for(live_ranks)
        return self.current
