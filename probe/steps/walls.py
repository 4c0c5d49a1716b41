"""The unsampled steps' wall times, as the runtime reads them: an EWMA and the last five.

:class:`StepWalls` is a base of :class:`probe.steps.tracker.StepTracker`. The tracker's boundary
appends each quiet step's wall time to ``walls`` (one list append on its fast path); the folding
happens here, when the runtime reads them at a sampled step, off the per-step path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Deque

__all__ = ["StepWalls"]


class StepWalls:
    """The reading side of StepTracker's ``walls`` (see the module docstring)."""

    if not TYPE_CHECKING:
        # No instance layout of its own: StepTracker's slots and __dict__ hold the state (hidden
        # from mypy, which would check the assignments below against this empty tuple).
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's, set in its __init__
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
