"""Compute time of this rank's pipeline stage(s) per step (issue 14 part 2: stage imbalance).

In a pipeline every stage's step takes the same wall time — the schedule makes the fast stages
wait for the slow one — so step time cannot show which stage is heavy. What differs is the time a
stage computes: its ``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk``
calls (torch.distributed.pipelining), which the schedule makes between its sends and receives, so
their sum leaves the waits for neighbour stages out. :class:`StageTimer` wraps those three methods
on the stage *instances* the probe found (probe.steps.parallel.scan_stack): the schedule calls them as
before and nothing else changes. A DDP/FSDP gradient sync that runs inside the last backward chunk
is part of it.

Clock: host time on a CPU stage (the ops run in the call); on a CUDA stage, CUDA events around each
call, only ever *queried*, so the figure of a step arrives a step or more later (as ``device_s``
does). A failure turns the timer into a pass-through; the user's calls and exceptions are untouched.
"""

from __future__ import annotations

import collections
import functools
import time
from typing import Any, Callable, Deque

from probe._log import warn_once

METHODS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")


class StageTimer:
    """Σ duration of the stage-compute calls of each step, taken at the step boundary."""

    def __init__(self, stages: list[Any], cuda: bool = False) -> None:
        self.cuda = cuda
        self.broken = False
        self._host_s = 0.0
        self._calls = 0
        self._pairs: list[tuple[Any, Any]] = []  # CUDA events (start, end) of the open step
        self._pending: Deque[list[tuple[Any, Any]]] = collections.deque(maxlen=16)
        self._last: float | None = None
        self._patched: list[tuple[Any, str, bool, Any]] = []  # (stage, name, had own attr, original)
        for stage in stages:
            for name in METHODS:
                original = getattr(stage, name, None)
                if not callable(original) or getattr(original, "__flowtop_timed__", False):
                    continue
                own = name in getattr(stage, "__dict__", {})
                setattr(stage, name, self._wrap(original))
                self._patched.append((stage, name, own, original))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if timer.broken:
                return original(*args, **kwargs)
            start = timer._begin()
            try:
                return original(*args, **kwargs)  # the user's errors are the user's: not caught
            finally:
                timer._end(start)

        timed.__flowtop_timed__ = True  # type: ignore[attr-defined]
        return timed

    def _begin(self) -> Any:
        try:
            if self.cuda:
                import torch

                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                return ev
            return time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - timing must never hurt training
            self._fail(exc)
            return None

    def _end(self, start: Any) -> None:
        if start is None or self.broken:
            return
        try:
            self._calls += 1
            if self.cuda:
                import torch

                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self._pairs.append((start, ev))
            else:
                self._host_s += time.perf_counter() - start
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self.broken = True
        warn_once("stage-timer", f"pipeline stage timing off: {type(exc).__name__}: {exc}")

    def take(self) -> float | None:
        """At a step boundary: the stage compute seconds of the newest step whose figure is
        complete (this step's on a CPU stage), or None (no stage call yet, events pending)."""
        if self.broken:
            return None
        try:
            if not self.cuda:
                value, calls = self._host_s, self._calls
                self._host_s, self._calls = 0.0, 0
                return value if calls else None
            if self._pairs:
                self._pending.append(self._pairs)
                self._pairs = []
            # Events complete in order on the stream: a step is done when its last end event is.
            while self._pending and self._pending[0][-1][1].query():
                pairs = self._pending.popleft()
                self._last = sum(a.elapsed_time(b) for a, b in pairs) / 1000.0
            return self._last
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return None

    def close(self) -> None:
        """Give the stages their own methods back."""
        self.broken = True
        for stage, name, own, original in self._patched:
            try:
                if own:
                    setattr(stage, name, original)
                else:
                    delattr(stage, name)  # the instance attribute we added: the class's method again
            except Exception:  # noqa: BLE001
                pass
        self._patched.clear()
