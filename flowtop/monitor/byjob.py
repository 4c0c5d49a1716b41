"""Figures of a job snapshot remembered by the snapshot's identity. No Textual.

A kept job's snapshot (flowtop.monitor.endedjobs) is the very same object from tick to tick,
yet the TUI's rank table (order, filter, node groups), its percentile line and the exporter's
percentiles and node figures were computed again from its ranks for every snapshot shown or
scraped: at 4,096 ranks a few ms each, for figures that cannot have changed. A snapshot is
immutable, so a figure of the same object is the same figure.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, Hashable, TypeVar

T = TypeVar("T")

#: Jobs remembered per figure: the jobs a monitor shows at once, with room (an exporter
#: scrapes every job; the TUI shows one). Past it the oldest is forgotten.
JOBS = 64


class ByJob(Generic[T]):
    """``get(job, make)``: ``make(job)``, remembered per job name for the last object asked about.
    Holding the snapshot keeps it alive until that job's next one (or its name's eviction).
    Thread-safe: the exporter's HTTP threads and the TUI share one (``make`` runs unlocked: two
    threads may both compute a figure, the same one)."""

    def __init__(self, size: int = JOBS) -> None:
        self._size = size
        self._held: dict[Hashable, tuple[object, T]] = {}
        self._lock = threading.Lock()

    def get(self, name: Hashable, job: object, make: Callable[[], T]) -> T:
        held = self._held.get(name)
        if held is not None and held[0] is job:
            return held[1]
        value = make()
        with self._lock:
            self._held.pop(name, None)  # re-inserted last: the dict's order is the age
            if len(self._held) >= self._size:
                del self._held[next(iter(self._held))]
            self._held[name] = (job, value)
        return value
