"""How long a rank holds its step records before sending them: what a monitor asks of a job of
N ranks, and what a probe that knows it is one of N starts with. Standard library only.

A monitor paces its ranks (a "pace" command, flowtop.monitor.pacing) when all of them would send
more than :data:`STEP_FRAMES_PER_S` step frames a second together at their own flush interval.
A probe that knows its job's size (WORLD_SIZE, or its process group) starts at the pace such a
monitor would ask (:func:`pace_for`): 4,096 ranks starting at once, or going back to their own
pace when their monitor restarted (a pace lapses, see probe.wire.PACE_TTL_S), then send ~9,000
step frames a second, not ~41,000 before the monitor's first command reaches them all. One
formula for both sides: the monitor's budget starts where the probes do.
"""

from __future__ import annotations

import math

#: Step frames a second a monitor that keeps up takes from all its ranks together before it
#: paces them.
STEP_FRAMES_PER_S = 10_000
#: The probes' default flush interval (FLOWTOP_FLUSH_S): below it a pace asks for nothing.
DEFAULT_FLUSH_S = 0.1
#: Granularity of a pace, seconds.
STEP_S = 0.05
#: Longest flush interval a "pace" command may ask for.
MAX_PACE_S = 2.0
#: The longest a paced probe stretches a periodic job (telemetry) to when the pace does not say
#: (its ``telemetry_max_s``): a monitor from before that field reads a telemetry sample older than
#: 10 s as stale.
MAX_PACED_TICK_S = 5.0


def paced_interval(interval_s: float, flush_s: float, paced_flush_s: float,
                   max_s: float = MAX_PACED_TICK_S) -> float:
    """A periodic job's interval (telemetry, the steady hello) when step records wait
    ``paced_flush_s`` instead of the probe's own ``flush_s``: stretched by as much, to at most
    ``max_s``, never shorter than ``interval_s``."""
    factor = paced_flush_s / flush_s if flush_s > 0 else 1.0
    if factor <= 1.0:
        return interval_s
    return max(interval_s, min(interval_s * factor, max_s))


def pace_for(ranks: int, frames_per_s: float = STEP_FRAMES_PER_S) -> float | None:
    """The flush interval that makes ``ranks`` ranks send about ``frames_per_s`` step frames a
    second together, or None when their own (DEFAULT_FLUSH_S) does."""
    flush = ranks / frames_per_s
    if flush <= DEFAULT_FLUSH_S:
        return None
    # In steps of 50 ms, up: a job whose live ranks come and go by a few does not change its pace.
    return min(MAX_PACE_S, round(math.ceil(round(flush / STEP_S, 9)) * STEP_S, 3))


def batch_due(last_sent: float, first_at: float, flush_s: float) -> float:
    """When a batch whose first item came at ``first_at`` leaves, the last one having left at
    ``last_sent`` (one clock): ``flush_s`` after whichever is sooner. No item waits longer than
    ``flush_s``; while items keep coming, batches leave one a ``flush_s`` and the sender wakes
    once a batch, when it is due; an item that finds none sent for ``flush_s`` leaves at once
    (items slower than that: no wait, no second wake-up). The probe's step batches and a node
    relay's batches of frames follow it alike."""
    return min(last_sent, first_at) + flush_s
