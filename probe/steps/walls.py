"""The unsampled steps' wall times, as the runtime reads them: an EWMA and the last five; and
the step clock's start and its reading for the hello (off the per-step path).

:class:`StepWalls` is a base of :class:`probe.steps.tracker.StepTracker`. The tracker's boundary
appends each quiet step's wall time to ``walls`` (one list append on its fast path); the folding
happens here, when the runtime reads them at a sampled step, off the per-step path.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Deque

__all__ = ["StepWalls"]


class StepWalls:
    """The reading side of StepTracker's ``walls`` (see the module docstring)."""

    if not TYPE_CHECKING:
        # No instance layout of its own: StepTracker's slots and __dict__ hold the state (hidden
        # from mypy, which would check the assignments below against this empty tuple).
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's, set in its __init__
        step: int
        _last_boundary: float
        _input_origin: float
        _root_lost: bool
        walls: list[float]
        _ewma_step_s: float | None
        _recent_walls: Deque[float]

    @property
    def ewma_step_s(self) -> float | None:
        """EWMA (weight 0.1) of the unsampled steps' wall times (None before the first)."""
        self.fold_walls()
        return self._ewma_step_s

    @property
    def recent_walls(self) -> Deque[float]:
        """The last five unsampled steps' wall times."""
        self.fold_walls()
        return self._recent_walls

    def fold_walls(self) -> None:
        """Fold the walls appended since the last read, in order: the very floats that updating
        the EWMA at each step gave (the runtime reads it at a sampled step, and bounds the list by
        going through its own path every so many steps: probe.runtime.Probe._quiet_after)."""
        walls = self.walls
        if walls:
            ewma = self._ewma_step_s
            for wall in walls:
                ewma = wall if ewma is None else 0.9 * ewma + 0.1 * wall
            self._ewma_step_s = ewma
            self._recent_walls.extend(walls[-5:])
            walls.clear()

    def start_clocks(self) -> None:
        """Start step 1's wall time and input wait now, at the end of the probe's own setup:
        its hooks, its sender and the imports they need (torch._dynamo: 0.2 s, seconds on a cold
        cache) ran on the training thread between the tracker's creation and the first forward,
        and step 1 read them as input wait (a 2-rank CPU DDP job whose loop fed its batch in
        microseconds got the input_wait hint, 6-7 % of each step, from that one step). Only
        before the first step."""
        if self.step == 0:
            self._last_boundary = self._input_origin = time.perf_counter()

    def hello_step(self) -> tuple[int, float] | None:
        """Sender thread, when it builds a hello: (last completed step, seconds since its
        boundary), or None before the first step or while the model was dropped (between a
        sweep's trials: the steps so far belong to another model, and the rank is not hung).
        Reads two attributes the boundary writes anyway, without a lock: under the GIL each read
        is whole; a boundary between the two reads makes the age one step too long, once."""
        step, last = self.step, self._last_boundary
        if step == 0 or self._root_lost:
            return None
        return step, max(0.0, time.perf_counter() - last)
