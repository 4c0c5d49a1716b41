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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traced_end import memory_at_end  # noqa: E402 - bench/


def main() -> None:
    ranks = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    r, snap = memory_at_end(ranks, 8)
    print(r["kb_per_rank"], r["parts_kb_per_rank"])
    by_cls: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for t in snap.traces:
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
