"""How often the monitor asks its ranks to send their step records. No Textual.

A rank sends its step records every FLOWTOP_FLUSH_S (0.1 s): ten frames a second whatever its
step rate. A step frame costs the data thread ~10-15 µs to check and apply (bench/ingest.py
--costs), so 4,096 ranks at ten frames a second would take half a core or more on frames alone.
Past :data:`STEP_FRAMES_PER_S` ranks-times-ten, the monitor asks every rank (a "pace" command,
broadcast on the data connection and carried down by relays) to hold its records longer, so that
all of them together send about that many step frames a second. The probe never goes faster than
its own FLOWTOP_FLUSH_S, and a pace lapses after wire.PACE_TTL_S unless renewed: a monitor that
restarts, or hears fewer ranks, gets the ranks' own pace back within seconds.

That budget is a guess about the machine. A monitor whose data thread cannot keep up (a slow or
shared login node, a flood of kernel windows, ticks of thousands of ranks) lowers it: the share of
wall time its data thread spent busy — not waiting for frames — is measured between two renewals
(:class:`BusyMeter`), and past :data:`BUSY_HIGH` the budget shrinks by :data:`SLOWER`, below
:data:`BUSY_LOW` it grows back by :data:`FASTER`, up to STEP_FRAMES_PER_S. Frames the monitor cannot
take would otherwise queue (seconds of latency) and then be dropped by the senders; held in the
probes they arrive late but whole. Only the pace depends on the load, never what a tick does: a
replay still reproduces the live hints.

What it costs: a step reaches the monitor up to the pace later (0.41 s at 4,096 ranks instead of
0.1 s); counts, kernel windows and byes still go at once; no record is lost. A paced probe samples
its telemetry less often by the same factor, to at most every 5 s
(probe.transport.publisher.paced_interval).
"""

from __future__ import annotations

import math
import time
from typing import Callable

from probe import wire

#: Step frames a second the monitor takes from all its ranks together before it paces them (the
#: budget of a monitor that keeps up).
STEP_FRAMES_PER_S = 10_000
#: The least share of STEP_FRAMES_PER_S the budget shrinks to under load (a pace is at most
#: wire.MAX_PACE_S anyway: 2 s, 2,048 frames a second at 4,096 ranks).
MIN_SCALE = 0.025
#: The data thread's busy share above which the budget shrinks, and below which it grows back.
BUSY_HIGH = 0.7
BUSY_LOW = 0.4
#: Factors the budget is multiplied by at a renewal: when busy, and when idle enough (it shrinks
#: faster than it grows back: a monitor that falls behind queues more every second).
SLOWER = 0.6
FASTER = 1.5
#: The probes' default flush interval (FLOWTOP_FLUSH_S): below it a pace asks for nothing.
DEFAULT_FLUSH_S = 0.1
#: Granularity of a pace, seconds.
STEP_S = 0.05
#: Seconds between two "pace" broadcasts while pacing (well inside wire.PACE_TTL_S).
RENEW_S = 2.0


def pace_for(ranks: int, frames_per_s: float = STEP_FRAMES_PER_S) -> float | None:
    """The flush interval to ask of ``ranks`` live ranks so that they send about ``frames_per_s``
    step frames a second together, or None when their own will do."""
    flush = ranks / frames_per_s
    if flush <= DEFAULT_FLUSH_S:
        return None
    # In steps of 50 ms, up: a job whose live ranks come and go by a few does not change its pace.
    return min(wire.MAX_PACE_S, round(math.ceil(round(flush / STEP_S, 9)) * STEP_S, 3))


def next_scale(scale: float, busy: float | None) -> float:
    """The budget's share of STEP_FRAMES_PER_S after a renewal at which the data thread was
    ``busy`` (0..1; None: not measured, the share holds)."""
    if busy is None:
        return scale
    if busy > BUSY_HIGH:
        return max(MIN_SCALE, scale * SLOWER)
    if busy < BUSY_LOW:
        return min(1.0, scale * FASTER)
    return scale


class BusyMeter:
    """The share of wall time a loop spent busy, between two readings: the loop reports the
    seconds it waited idle (:meth:`idle`), everything else counts as busy — its own work, and its
    waits for the interpreter or a core on a machine that is short of them.

    Args:
        clock: Wall clock (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._since = clock()
        self._idle = 0.0

    def idle(self, seconds: float) -> None:
        """Count ``seconds`` the loop spent waiting with nothing to do."""
        self._idle += seconds

    def share(self) -> float | None:
        """The busy share (0..1) since the last reading (None over less than 0.1 s), and start
        a new interval."""
        now = self._clock()
        span, idle = now - self._since, self._idle
        if span < 0.1:
            return None
        self._since, self._idle = now, 0.0
        return min(1.0, max(0.0, 1.0 - idle / span))


class Pacer:
    """When to broadcast which pace (the collector calls :meth:`due` as its clock advances)."""

    def __init__(self) -> None:
        self.current: float | None = None  # the pace last asked for (None: not pacing)
        #: The share of STEP_FRAMES_PER_S asked of all ranks together (1 unless the monitor could
        #: not keep up, see next_scale).
        self.scale = 1.0
        #: The data thread's busy share at the last renewal (None before one was measured).
        self.busy: float | None = None
        self._next = 0.0

    def due(self, now: float, live_ranks: int, busy: float | None = None) -> float | None:
        """The pace to broadcast now, or None (not due, or nothing to ask). ``busy``: the data
        thread's busy share since the last renewal (see :class:`BusyMeter`)."""
        if now < self._next:
            return None
        self._next = now + RENEW_S
        self.busy = busy
        scale = next_scale(self.scale, busy)
        # Shrunk only where a smaller budget asks something of these ranks: a monitor busy with
        # other work (a flood of kernel windows) does not bank a pace for ranks that join later.
        if scale >= self.scale or pace_for(live_ranks, STEP_FRAMES_PER_S * scale) is not None:
            self.scale = scale
        self.current = pace_for(live_ranks, self.budget)
        return self.current

    @property
    def budget(self) -> float:
        """Step frames a second asked of all ranks together now."""
        return STEP_FRAMES_PER_S * self.scale


def pace_notice(live: int, pace: float | None, budget: float, busy: float | None) -> str:
    """What the user is told when the pace asked of ``live`` ranks changes."""
    if pace is None:
        return f"{live} ranks talk: they send their steps at their own pace again"
    asked = f"{live} ranks talk: each is asked to send its steps every {pace:.2f} s"
    if budget >= STEP_FRAMES_PER_S:
        return f"{asked} (the monitor takes ~{STEP_FRAMES_PER_S:,} step frames a second)"
    load = f"; its data thread was busy {busy:.0%} of the last {RENEW_S:g} s" if busy is not None else ""
    return f"{asked} (as many as this monitor keeps up with: ~{budget:,.0f} step frames a second{load})"
