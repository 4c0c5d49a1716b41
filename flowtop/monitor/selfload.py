"""The monitor's own load: its CPU share and the frames per second it takes in. No Textual.

One :class:`LoadMeter` per monitor process is read by whoever shows the figures (the TUI's
footer, the Prometheus exporter at scrape time), so both show the same number computed here.
Rates are over the last :data:`WINDOW_S` seconds of readings: CPU is the process's CPU time
(every thread: UI, data thread, kernel worker, HTTP) per second of wall time, 1.0 being one core
busy; frames per second come from the ``received`` counts of successive snapshots against their
``taken_at`` (the monitor clock), so they need no reading of the collector.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

#: Seconds of readings a rate is taken over (the oldest reading within it is the base).
WINDOW_S = 5.0
#: Fewest seconds between the base and the newest reading for a rate (None before).
MIN_SPAN_S = 0.5


@dataclass(frozen=True)
class Load:
    """The monitor's load now; None where too few readings exist yet."""

    cpu_ratio: float | None  # process CPU seconds per wall second (1.0 = one core)
    frames_per_s: float | None  # frames received per second of the monitor clock


class LoadMeter:
    """Rates of the process CPU time and of snapshots' ``received`` counts. Thread-safe.

    Args:
        wall: Wall clock for the CPU rate (injectable for tests).
        cpu: CPU time of the process (``time.process_time``: every thread).
        window_s: Seconds of readings kept.
    """

    def __init__(self, wall: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.process_time,
                 window_s: float = WINDOW_S) -> None:
        self._wall = wall
        self._cpu = cpu
        self._window = window_s
        self._lock = threading.Lock()
        self._cpu_samples: deque[tuple[float, float]] = deque()
        self._frames: deque[tuple[float, int]] = deque()

    def read(self, taken_at: float | None = None, received: int | None = None) -> Load:
        """Take a reading (and, given a snapshot's ``taken_at`` and ``received``, a frame count)
        and return the rates over the window."""
        with self._lock:
            now, cpu = self._wall(), self._cpu()
            cpu_ratio = _rate(self._cpu_samples, now, cpu, self._window)
            frames = None
            if taken_at is not None and received is not None:
                frames = _rate(self._frames, taken_at, received, self._window)
            elif self._frames:
                frames = _span_rate(self._frames)
            return Load(cpu_ratio=cpu_ratio, frames_per_s=frames)


def _rate(samples: deque, at: float, value: float, window: float) -> float | None:
    """Append (at, value) unless it repeats the newest instant, drop readings older than the
    window (keeping one as the base), and return the rate against the oldest one."""
    if samples and at < samples[-1][0]:  # a clock that went back (a restarted source): start over
        samples.clear()
    if not samples or at > samples[-1][0]:
        samples.append((at, value))
    while len(samples) > 2 and at - samples[1][0] >= window:
        samples.popleft()
    return _span_rate(samples)


def _span_rate(samples: deque) -> float | None:
    (t0, v0), (t1, v1) = samples[0], samples[-1]
    if t1 - t0 < MIN_SPAN_S or v1 < v0:
        return None
    return (v1 - v0) / (t1 - t0)


#: The meter of this process (the footer and the exporter read the same one).
METER = LoadMeter()
