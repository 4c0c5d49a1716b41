"""Handing a monitor's freed heap back to the system (glibc's ``malloc_trim``). No Textual.

A monitor's heap peaks when a backlog builds (a large job's start: every rank's hello and first
frames at a short pace, queued in libzmq and decoded by the data thread) and most of that peak is
freed once the backlog drains, but glibc keeps freed memory that is not at the top of its heaps:
at 4,096 ranks through 512 relays (bench/ingest.py) the monitor's RSS was 619 MB, of which 313 MB
was memory glibc had freed and kept (mallinfo2) against 100 MB of its allocations in use
(Python's small-object arenas are mapped apart, in neither). ``malloc_trim(0)`` also gives back
the whole free pages inside the heaps; its cost grows with the free chunks it walks (~90 ms of
CPU with 565 MB free; well under 1 ms on a heap it just trimmed). A thread of its own calls it
every ``FLOWTOP_HEAP_TRIM_S`` (10 s; 0: never): ctypes lets go of the interpreter lock for the
call, so the data and UI threads go on, only waiting for the allocator's lock of the arena being
trimmed if they allocate from it meanwhile. Measured there: RSS 130-135 KB a rank without trims,
90-106 KB trimming every 30 s (memory freed between two trims is touched again), 62-64 KB every
10 s (8 trims, 75 ms of CPU in all over 80 s: 0.1 % of a core), about what the live objects took
(Python's blocks in use and glibc's in use: 63 KB a rank; 48-52 KB since a large job's views hold
only what the UI shows, README Scale).

Only where the C library has ``malloc_trim`` (glibc); elsewhere nothing runs. Never raises: a
failing call is logged once and the thread ends. The probe trims after its kernel windows with
its own pair of calls (probe.kernels.heap): the monitor imports nothing from the probe but its
wire schema, so the two few-line helpers are kept apart.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from flowtop import settings

_log = logging.getLogger("flowtop.monitor.heaptrim")

try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE = 4096


def glibc_trim() -> Callable[[], object] | None:
    """The C library's ``malloc_trim(0)`` as a callable, or None where there is none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) (Windows)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return lambda: fn(0)


def rss_bytes() -> int:
    """This process's resident set (Linux; 0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Trims:
    """What the trims did so far: how many, their CPU seconds, bytes of RSS they gave back."""

    count: int
    cpu_s: float
    released_bytes: int


class HeapTrimmer:
    """Calls ``trim`` (default: :func:`glibc_trim`'s) every ``every_s`` on a daemon thread
    (:meth:`start`) until :meth:`stop`."""

    def __init__(self, every_s: float, trim: Callable[[], object] | None = None) -> None:
        self.every_s = every_s
        self._trim = trim if trim is not None else glibc_trim()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._count, self._cpu, self._released = 0, 0.0, 0

    def start(self) -> bool:
        """Start the thread; False (nothing started) where there is nothing to call, or it runs."""
        with self._lock:
            if self._trim is None or self._thread is not None or self.every_s <= 0:
                return False
            self._thread = threading.Thread(target=self._run, name="flowtop-heap-trim", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def trim_once(self) -> int:
        """One trim now (on the calling thread); the bytes of RSS it gave back (0 or more)."""
        if self._trim is None:
            return 0
        before, cpu = rss_bytes(), time.thread_time()
        self._trim()
        released = max(0, before - rss_bytes())
        with self._lock:
            self._count += 1
            self._cpu += time.thread_time() - cpu
            self._released += released
        return released

    def trims(self) -> Trims:
        with self._lock:
            return Trims(self._count, self._cpu, self._released)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.trim_once()
            except Exception as exc:  # noqa: BLE001 - memory hygiene must never take the monitor down
                _log.warning("heap trimming stopped: %s: %s", type(exc).__name__, exc)
                return


#: The process's trimmer, once a monitor command started it (:func:`for_process`).
_PROCESS: HeapTrimmer | None = None
_PROCESS_LOCK = threading.Lock()


def for_process() -> HeapTrimmer:
    """The process's one trimmer, started on the first call at FLOWTOP_HEAP_TRIM_S (the commands
    that own a monitor process call it, through flowtop.monitor.gcpolicy.for_monitor)."""
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None:
            _PROCESS = HeapTrimmer(settings.HEAP_TRIM_S.read())
            _PROCESS.start()
        return _PROCESS


def current() -> HeapTrimmer | None:
    """The process's trimmer if one was started (read-only: starts nothing)."""
    return _PROCESS
