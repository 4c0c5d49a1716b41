"""What is live at the end of ``bench/ingest.py --memory``, by the line that allocated it: the
traced bytes a rank, grouped by the innermost frame in flowtop/ or probe/ (or the innermost frame),
largest first, with the count of blocks and their mean size.

    python bench/mem_where.py 1024 [TOP]      # from a checkout's root: ranks, lines printed (30)

Runs ingest's ``memory(ranks)`` under tracemalloc (12 frames) and snapshots before tracemalloc
stops (the measured phases' end, the latest kernel window measured apart not included), as
bench/size_classes.py does. Where a change moves the traced KB a rank, this says which line.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from traced_end import memory_at_end  # noqa: E402 - bench/


def _where(tb: tracemalloc.Traceback) -> str:
    frames = list(tb)  # oldest first: the innermost frame is the last
    for f in reversed(frames):
        if "/flowtop/" in f.filename or "/probe/" in f.filename:
            return f"{f.filename.split('/')[-1]}:{f.lineno}"
    f = frames[-1]
    return f"{f.filename.split('/')[-1]}:{f.lineno}"


def main() -> None:
    ap = argparse.ArgumentParser(description="the model's live traced bytes a rank by allocating line")
    ap.add_argument("ranks", type=int, nargs="?", default=1024)
    ap.add_argument("top", type=int, nargs="?", default=30, help="lines printed")
    args = ap.parse_args()
    ranks, top = args.ranks, args.top
    r, snap = memory_at_end(ranks, 12)
    print(r["kb_per_rank"], r["parts_kb_per_rank"])
    size: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for t in snap.traces:
        w = _where(t.traceback)
        size[w] += t.size
        count[w] += 1
    total = sum(size.values())
    print(f"traced at the end: {total / ranks / 1024:.2f} KB a rank")
    for w, b in size.most_common(top):
        print(f"{b / ranks / 1024:7.2f} KB/rank  {count[w] / ranks:7.1f} blocks/rank  {b / count[w]:7.0f} B each  {w}")


if __name__ == "__main__":
    main()
