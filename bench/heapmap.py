"""Where a process's resident memory is: glibc's arenas and the anonymous mappings (Linux, glibc).

    from bench import heapmap; heapmap.arenas(); heapmap.smaps()     # in the process measured
    python bench/heapmap.py PID                                      # another process's mappings

:func:`arenas` reads ``malloc_info`` (glibc's XML): per arena (0 is the main one, the others the
threads' arenas: glibc gives a thread that finds the main arena's lock taken an arena of its
own, up to 8 × cores of them) the MB it holds from the system and the MB free in it (free counts
pages a trim gave back as well: free is not resident). :func:`smaps` sums the resident MB of
/proc/PID/smaps by kind of mapping: the main arena (``[heap]``), the threads' arenas (64 MiB
aligned heaps, each followed by its reserved, unmapped rest), the other anonymous mappings
(Python's 1 MiB object arenas, glibc's mmapped blocks of 128 KiB and more, thread stacks) and
files (code, shared libraries). Used by bench/ingest.py's JSON (``arenas``, ``smaps``) and
``--memory N --rss``.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import tempfile

_HEAP_ALIGN = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heaps start aligned to it


def arenas() -> list[dict[str, float]]:
    """Per glibc arena, in malloc_info's order: ``system_mb`` held, ``free_mb`` free in it (fast
    bins and the rest), ``used_mb`` the difference; empty where there is no malloc_info."""
    try:
        libc = ctypes.CDLL(None)
        info, fdopen, fclose = libc.malloc_info, libc.fdopen, libc.fclose
    except (OSError, AttributeError, TypeError):
        return []
    fdopen.restype = ctypes.c_void_p
    fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryFile() as f:
        fp = fdopen(os.dup(f.fileno()), b"w")
        info(0, fp)
        fclose(fp)
        f.seek(0)
        text = f.read().decode("ascii", "replace")
    out = []
    mb = 1 / 2**20
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', text, re.S):
        free = sum(int(s) for s in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', heap))
        current = re.search(r'<system type="current" size="(\d+)"/>', heap)
        system = int(current.group(1)) if current else 0
        out.append({"system_mb": round(system * mb, 1), "free_mb": round(free * mb, 1),
                    "used_mb": round((system - free) * mb, 1)})
    return out


def smaps(pid: int | str = "self") -> dict[str, float]:
    """Resident MB of /proc/PID/smaps by kind: ``main_arena`` ([heap]), ``thread_arenas`` (rw
    mappings at a 64 MiB boundary followed by an unmapped reserve: glibc's non-main heaps),
    ``other_anon`` (Python's object arenas, glibc's mmapped blocks, stacks), ``files``; and
    ``thread_arena_count``."""
    maps: list[tuple[int, int, str, str, int]] = []  # start, end, perms, name, rss kB
    try:
        with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as f:
            for line in f:
                head = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$", line)
                if head:
                    maps.append((int(head.group(1), 16), int(head.group(2), 16), head.group(3),
                                 head.group(4).strip(), 0))
                elif line.startswith("Rss:") and maps:
                    s, e, p, n, _ = maps[-1]
                    maps[-1] = (s, e, p, n, int(line.split()[1]))
    except OSError:
        return {}
    out = {"main_arena": 0.0, "thread_arenas": 0.0, "other_anon": 0.0, "files": 0.0, "thread_arena_count": 0}
    for i, (start, end, perms, name, rss) in enumerate(maps):
        mb = rss / 1024
        if name == "[heap]":
            out["main_arena"] += mb
        elif name.startswith("/"):
            out["files"] += mb
        elif name in ("", "[stack]") or name.startswith("[anon"):
            reserve = i + 1 < len(maps) and maps[i + 1][0] == end and maps[i + 1][2].startswith("---")
            if start % _HEAP_ALIGN == 0 and perms.startswith("rw") and (reserve or end - start == _HEAP_ALIGN):
                out["thread_arenas"] += mb
                out["thread_arena_count"] += 1
            else:
                out["other_anon"] += mb
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


if __name__ == "__main__":
    print(smaps(sys.argv[1] if len(sys.argv) > 1 else "self"))
