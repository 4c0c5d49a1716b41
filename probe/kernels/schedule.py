"""When to take a kernel window: spacing sampled steps so their amortised cost stays in budget.

Pure arithmetic on step numbers and monotonic times (no torch); :class:`probe.kernels.windows.
KernelWindowSampler` asks it before each step and reports each window's cost back.
"""

from __future__ import annotations

import math

#: Fewest seconds between two windows when the second was requested by the monitor.
MIN_REQUEST_S = 1.0


class WindowScheduler:
    """Spaces profiled windows so that their amortised cost stays inside a budget.

    After each window the caller reports what it cost the training thread (the profiled step's
    wall time beyond a typical step, extraction of the records included); the next window comes
    ``ceil(cost / (budget × typical step))`` steps later — so ``cost / (interval × step)`` ≤
    budget — clamped to ``[min_interval_steps, max_interval_steps]``.  The budget is
    ``budget_large`` for steps ≥ ``large_step_s`` and ``budget_small`` below (small steps pay a far
    larger relative profiler overhead: docs/design.md, "Overheads").  A window is also due after
    ``max_interval_s`` of wall time (at least ``min_interval_steps`` steps), so tables stay fresh
    on slow jobs; :meth:`request_now` makes the next step a window whatever the interval.

    With ``align_steps`` (the default) a due window waits for the next step index that is a
    multiple of the interval rounded up to a power of two, so every rank of a synchronous job
    profiles the same steps (a window on one rank would otherwise stall all of them).
    """

    def __init__(
        self,
        *,
        budget_large: float = 0.005,
        budget_small: float = 0.02,
        large_step_s: float = 0.1,
        min_interval_steps: int = 10,
        max_interval_steps: int = 10_000,
        max_interval_s: float = 600.0,
        align_steps: bool = True,
        min_request_s: float = MIN_REQUEST_S,
    ) -> None:
        self.budget_large = budget_large
        self.budget_small = budget_small
        self.large_step_s = large_step_s
        self.min_interval_steps = min_interval_steps
        self.max_interval_steps = max_interval_steps
        self.max_interval_s = max_interval_s
        self.align_steps = align_steps
        self.min_request_s = min_request_s
        self.interval_steps = min_interval_steps
        self.requested = False
        self.refused = 0  # requests turned down by the rate limit (sent to the monitor)
        self._last_cost_s = 0.0
        self._last_typical_s: float | None = None
        self._last_window_s: float | None = None
        self._anchor_step: int | None = None  # the last window's step (or the first step seen)
        self._anchor_s = 0.0

    def request_now(self, now_s: float) -> bool:
        """Sample the next step (the monitor's manual trigger); False when refused.

        Whoever asks, requested windows stay inside the same budget as scheduled ones: a
        request within ``max(MIN_REQUEST_S, last window's cost / budget)`` of the last window
        is refused and counted (a flood of requests costs at most one window per that time, on top
        of the scheduled ones).
        A request while one is pending is merged into it."""
        if self.requested:
            return True
        last = self._last_window_s
        if last is not None and now_s - last < self.request_interval_s():
            self.refused += 1
            return False
        self.requested = True
        return True

    def request_interval_s(self) -> float:
        """Fewest seconds between the last window and a requested one."""
        typical = self._last_typical_s
        if not typical or typical <= 0:
            return self.min_request_s
        return max(self.min_request_s, self._last_cost_s / self.budget(typical))

    def due(self, step: int, now_s: float) -> bool:
        """Whether step ``step`` (starting at monotonic time ``now_s``) should be profiled."""
        if self.requested:
            return True
        if self._anchor_step is None:
            self._anchor_step, self._anchor_s = step, now_s
            return False
        since = step - self._anchor_step
        if since < self.min_interval_steps:
            return False
        wall_due = now_s - self._anchor_s >= self.max_interval_s
        if self.align_steps:
            # In synchronous training one rank's profiled step stalls every rank at the next
            # collective: windows must fall on the *same* steps everywhere. Periods are powers
            # of two of the step index, so ranks that chose different intervals still meet.
            if step % _pow2_at_least(self.interval_steps) == 0:
                return True
            return wall_due and step % _pow2_at_least(self.min_interval_steps) == 0
        return since >= self.interval_steps or wall_due

    def budget(self, typical_step_s: float) -> float:
        """The amortised-cost budget for steps of this length."""
        return self.budget_large if typical_step_s >= self.large_step_s else self.budget_small

    def record(self, step: int, now_s: float, cost_s: float, typical_step_s: float | None) -> int:
        """Account a window taken at ``step``; returns (and keeps) the next interval in steps."""
        # The rate limit's inputs first: the sender thread may test a request in between.
        self._last_cost_s, self._last_typical_s = max(0.0, cost_s), typical_step_s
        self._last_window_s = now_s
        self.requested = False
        self._anchor_step, self._anchor_s = step, now_s
        if typical_step_s is None or typical_step_s <= 0:
            steps = self.max_interval_steps  # cannot amortise without a step time: the wall cap rules
        else:
            # The small epsilon keeps an exact quotient (50.000000000000001) from adding a step.
            steps = math.ceil(max(0.0, cost_s) / (self.budget(typical_step_s) * typical_step_s) - 1e-9)
        self.interval_steps = max(self.min_interval_steps, min(self.max_interval_steps, steps))
        return self.interval_steps


def _pow2_at_least(n: int) -> int:
    """The smallest power of two ≥ ``n`` (1 for n ≤ 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, n))))
