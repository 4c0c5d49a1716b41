"""Which live allocations sit in pymalloc's largest size classes (257-512 bytes) at the end of
``bench/ingest.py --memory``: a size class whose pools are mostly free (``py_free_classes`` of
``--memory N --rss``) is pinned by the few blocks still live in it; this names them.

    python bench/size_classes.py 256        # from a checkout's root: ranks; its code is imported

Runs ingest's ``memory(ranks)`` under tracemalloc (8 frames), snapshots before tracemalloc stops,
and prints, per 16-byte size class, the live blocks by their two innermost frames. 2026-12-07, 256
ranks: at c42204a six blocks a rank in the 496-byte class were the step ring's tails (grown by
array.extend, stepring.py); on the tails branch they are 512-byte blocks of their final size.
"""

from __future__ import annotations

import collections
import os
import sys
import tracemalloc

sys.path.insert(0, os.getcwd())  # the checkout under test: the working directory's
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__))))
import ingest  # noqa: E402 - bench/

snaps: list[tracemalloc.Snapshot] = []
_start, _stop = tracemalloc.start, tracemalloc.stop


def _stop_after_snapshot() -> None:
    if not snaps:  # the first stop: the end of the measured phases
        snaps.append(tracemalloc.take_snapshot())
    _stop()


tracemalloc.start = lambda *a: _start(8)  # type: ignore[assignment]
tracemalloc.stop = _stop_after_snapshot  # type: ignore[assignment]


def main() -> None:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    r = ingest.memory(ranks, traced=True)
    print(r["kb_per_rank"], r["parts_kb_per_rank"])
    by_cls: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for t in snaps[0].traces:
        if 256 < t.size <= 512:
            where = " < ".join(f"{f.filename.split('/')[-1]}:{f.lineno}" for f in reversed(list(t.traceback)[-2:]))
            by_cls[(t.size + 15) // 16 * 16][where] += 1
    for cls in sorted(by_cls):
        c = by_cls[cls]
        print(f"class {cls}: {sum(c.values())} live blocks ({sum(c.values()) * cls / 1e6:.2f} MB)")
        for k, v in c.most_common(6):
            print(f"    {v:7d}  {k}")


if __name__ == "__main__":
    main()
