"""The process's resident memory and glibc's heap trim, for kernel windows' memory accounting.

A profiler session's event storage is freed when the window ends (probe.kernels.windows._release), but
glibc keeps freed pages in its arenas; ``malloc_trim`` hands them back, so that the RSS measured
after a window shows what the session really kept. Both calls are cheap (a /proc read, one libc
call, on sampled window steps only) and never raise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_libc: Any = None
_libc_tried = False


def rss_bytes() -> int | None:
    """Resident set size now, or None where /proc is not there."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def trim() -> bool:
    """Give the heap's free pages back to the system (glibc only); True when it ran."""
    global _libc, _libc_tried
    if not _libc_tried:
        _libc_tried = True
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") else None
        except OSError:
            _libc = None
    if _libc is None:
        return False
    try:
        _libc.malloc_trim(0)
        return True
    except Exception:
        return False
