"""Ticks: the model's clock-driven state advances at fixed instants, live and in replay. No Textual.

A tick evicts finished jobs and advances the hints' hysteresis (see :meth:`Model.tick`); a
snapshot only reads. Ticks fall on ``t0 + k·TICK_S`` of the monitor clock, ``t0`` being the
instant a recording counts from, and a tick at instant S comes after every frame received
before S and before every frame received at S or later — so a replay that interleaves the
recorded frames with ticks on the same instants reproduces the hints the live monitor showed,
without taking a single snapshot.
"""

from __future__ import annotations

import math
from typing import Callable

from flowtop.monitor import gcpolicy
from flowtop.monitor.clock import TICK_S, tick_at
from flowtop.monitor.snapshot import MonitorSnapshot


class Ticker:
    """Calls ``tick(instant)`` for every instant ``t0 + k·period`` (k ≥ 1) that is due.

    Args:
        tick: What a tick does (``Model.tick`` with the listen address bound); returns the
            snapshot it built.
        t0: The schedule's origin (monitor clock).
        period: Seconds between ticks.
        max_behind: When more ticks than this are due at once (a tick that takes longer than
            the period: an overloaded monitor), only the latest runs and the others are counted
            in :attr:`skipped` — running them all would only fall further behind. None (replay):
            every tick runs.
    """

    def __init__(self, tick: Callable[[float], MonitorSnapshot], t0: float, period: float = TICK_S,
                 max_behind: int | None = None) -> None:
        if not period > 0:
            raise ValueError(f"tick period must be positive, got {period!r}")
        self._tick = tick
        self.t0 = t0
        self.period = period
        self._k = 1
        self.max_behind = max_behind
        #: Ticks not run because the ticker had fallen too far behind.
        self.skipped = 0
        #: The snapshot the latest tick built (None before the first tick).
        self.last: MonitorSnapshot | None = None

    @property
    def next_at(self) -> float:
        """The instant of the next tick."""
        return tick_at(self.t0, self._k, self.period)

    @property
    def ticks(self) -> int:
        """Ticks run so far."""
        return self._k - 1

    def catch_up(self, now: float) -> MonitorSnapshot | None:
        """Run, in order, every tick due at ``now``; the last one's snapshot, or None if none was due."""
        snap = None
        if self.max_behind is not None and now >= self.next_at:
            due = max(self._k, math.floor((now - self.t0) / self.period))
            while tick_at(self.t0, due + 1, self.period) <= now:
                due += 1
            while due > self._k and tick_at(self.t0, due, self.period) > now:
                due -= 1
            if due - self._k + 1 > self.max_behind:
                self.skipped += due - self._k
                self._k = due
        with gcpolicy.paused():  # a tick's objects are alive until the freeze below: nothing to collect
            while now >= self.next_at:
                snap = self._tick(self.next_at)
                self._k += 1
            if snap is not None:
                self.last = snap
                # What is alive now is frozen out of the collections to come, before the collector
                # is back: the ticks' allocations would start a collection of all of it at once.
                gcpolicy.after_tick()
        return snap
