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

The same commands also start the process's heap trimmer (flowtop.monitor.heaptrim): memory freed
after a backlog goes back to the system instead of staying in glibc's heaps.
"""

from __future__ import annotations

import gc

from flowtop.monitor import heaptrim

#: (young, middle, old) thresholds of gc.set_threshold for a monitor process.
THRESHOLDS = (10_000, 50, 100)


def for_monitor() -> None:
    """Set the monitor's thresholds and start its heap trimmer (process-wide; the commands that
    own the process call it)."""
    gc.set_threshold(*THRESHOLDS)
    heaptrim.for_process()
