"""The garbage collector's thresholds for a monitor process. No Textual.

A monitor holds many long-lived objects (every rank's step history and kernel tables) and churns
short-lived ones (decoded frames, a snapshot twice a second). With CPython's default thresholds
(700, 10, 10) a flood of forged ranks and big kernels frames ran 26 full collections in 20 s,
of 190 ms median and 320 ms at most, and a collection stops every thread, the UI's included
(bench/flood.py: UI loop lag p99 203 ms, max 329 ms). Young collections every 10,000
allocations and full ones after 100 of the middle generation: no full collection in that run,
lag p99 48 ms, max 114 ms. The monitor's objects are mostly acyclic (freed by reference counts),
so collecting cycles less often costs little memory.

What a young collection costs is the young objects still alive when it runs, not the threshold:
CPython counts allocations less deallocations, so while old objects die (a rank's previous view, a
ring block dropped) the young ones pile up past it. Live at 4,096 ranks (2026-12-05, gen-0 lists
read at each collection) the young generation held 20,000-200,000 objects and a collection took
1-130 ms: 40-70 % of them arrays of step-ring blocks (each 64 steps of a column), then their
tuples and the ticks' rank views.

So a monitor also freezes at every tick (:func:`after_tick`, gc.freeze, live and in a replay)
every object the collector tracks then: a collection between two ticks walks only what was made
since the last one, and nothing is walked twice on its way to the old generation. Cyclic garbage
made between two ticks (Textual's: the data side's frames and ticks make none) is frozen with the
rest and waits for a full collection (its objects unfrozen first), which runs on the data thread
and counts as its tick. Live at 4,096 ranks (bench/ingest.py, three runs against four,
interleaved): the collections' CPU 1.7-2.2 -> 0.8-1.1 s in 32 s; before, 66-68 young collections
and one or two middle ones of 0.2-0.7 s; after, 47-50 young ones and one full one of 0.5-0.6 s.
bench/flood.py over 40 s: pauses p99 26 -> 10 ms, the longest 96 -> 125 ms (the full collection).

A full collection walks every object (0.5-0.6 s of wall time at 4,096 ranks live, 165 ms
offline) and stops every thread, the UI's too, so the next one waits until that pause is at most
:data:`FULL_SHARE` of the time from its end to the next one's start (:data:`FULL_EVERY_S` at
least, :data:`FULL_MAX_S` at most): a half-second pause comes every ~100 s, not every 30 s. The
garbage it waits for is small since the UI's lines stopped referring to themselves
(flowtop.tui.widgets._strip_cycles): 53,000-111,000 objects in 30 s before, 5,000-7,500 after
(``gc.DEBUG_SAVEALL`` at the full collection, live).

And no collection runs during a monitor's ticks (:func:`paused`, live and in a replay), the freeze
after them included: what a tick allocates is its snapshot's views and the histories its hints
read, alive until that freeze or freed by their reference counts, so a young collection inside a
tick walked them all for nothing, and more each time (the young generation grows through the
tick); with the collector back on before the freeze, the ticks' allocations started one
collection of everything they left. Live at 4,096 ranks (2026-12-06, bench/ingest.py's ``gc``
and ``tick_gc_cpu_pct``): 68-73 young collections in 32 s at 0.32-0.43 s of CPU, most of it inside
ticks, the longest 90-120 ms with every thread stopped; 3-5 at 0.05-0.1 s, the longest 15 ms,
after. Cyclic garbage made during a tick (the UI's) is frozen with the rest and waits for the
full collection.

The same commands also start the process's heap trimmer (flowtop.monitor.heaptrim): memory freed
after a backlog goes back to the system instead of staying in glibc's heaps.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable, Iterator

from flowtop.monitor import heaptrim

#: (young, middle, old) thresholds of gc.set_threshold for a monitor process.
THRESHOLDS = (10_000, 50, 100)
#: Shortest and longest seconds between two full collections of a monitor that freezes its objects
#: at ticks: the cyclic garbage of that long waits for one.
FULL_EVERY_S = 30.0
FULL_MAX_S = 300.0
#: Most of the wall time a full collection's pause may take, over the time until the next one.
FULL_SHARE = 0.005


class Freezer:
    """Freezes the process's tracked objects at each tick, and collects them whole from time to
    time: ``full_every_s`` after the last full collection, or later when that one's pause was
    longer than ``full_share`` of it (never later than ``full_max_s``)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 collect: Callable[[], object] = gc.collect, full_share: float = FULL_SHARE,
                 full_max_s: float = FULL_MAX_S) -> None:
        self.full_every_s = full_every_s
        self.full_share = full_share
        self.full_max_s = full_max_s
        self._clock = clock
        self._collect = collect
        self._next_full = clock() + full_every_s
        #: Full collections run so far.
        self.fulls = 0

    def after_tick(self) -> None:
        """Freeze every tracked object, after a full collection when one is due."""
        now = self._clock()
        if now >= self._next_full:
            gc.unfreeze()
            self._collect()
            self.fulls += 1
            end = self._clock()
            wait = min(self.full_max_s, max(self.full_every_s, (end - now) / self.full_share))
            self._next_full = end + wait
        gc.freeze()


#: The thresholds the process had before a monitor command set THRESHOLDS (see :func:`undo`).
_DEFAULT_THRESHOLDS = gc.get_threshold()
#: The process's freezer, once a monitor command set the policy (:func:`for_monitor`).
_FREEZER: Freezer | None = None


def for_monitor() -> None:
    """Set the monitor's thresholds, freeze at its ticks from now on (:func:`after_tick`) and start
    its heap trimmer (process-wide; the commands that own the process call it)."""
    global _FREEZER
    gc.set_threshold(*THRESHOLDS)
    if _FREEZER is None:
        _FREEZER = Freezer()
    heaptrim.for_process()


def undo() -> None:
    """Back to CPython's collector as it was: nothing frozen, no freezing at ticks, the thresholds
    this module found (a test that ran a monitor's command in its own process)."""
    global _FREEZER
    if _FREEZER is not None:
        _FREEZER = None
        gc.unfreeze()
        gc.set_threshold(*_DEFAULT_THRESHOLDS)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No collection while the ticks run (see the module doc) in a process whose commands set the
    monitor's policy; elsewhere, and where the collector is off already, nothing changes. The
    collector is back on after it, whoever else turned it off meanwhile (nothing in a monitor
    process does: Textual's pause of the collector while scrolling is off by default)."""
    pause = _FREEZER is not None and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


def after_tick() -> None:
    """A ticker ran ticks (flowtop.monitor.ticker, live and in a replay): freeze every tracked
    object (see the module doc). Nothing in a process whose commands did not set the monitor's
    policy (a library, a test)."""
    if _FREEZER is not None:
        _FREEZER.after_tick()
