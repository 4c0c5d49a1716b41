"""A digest of what the rank view shows, for checking that a faster rank view shows the same.

Run it on the base commit and on a branch (``PYTHONPATH=<checkout>``): equal digests, equal
views. Two parts, each printed as a SHA-256:

* ``data``: for synthetic 4,096-rank snapshots (tests/synthetic/cluster.py, ``--snapshots``
  ticks) under many view specs (worst first and every column sort, each reversed; grouped and
  flat; filters by host, status and rank range; nodes opened by hand), every row of
  flowtop.monitor.rankview.build_view (its key, and its cells as the table formats them: the
  lag, nesting and node aggregates included), the view's counts, the percentile line's figures,
  and the rank map's bins and picked ranks for every metric at three map sizes;
* ``screen``: the real app (FlowtopApp, headless) at 200x50 and 80x24, grouped, flat and
  filtered, each snapshot shown and painted, then the cursor moved and a node opened: the
  screen's text and styles (Textual's SVG export) after every step.

Usage::

    PYTHONHASHSEED=0 PYTHONPATH=. python bench/rank_view_digest.py [--snapshots 8] [--part data|screen]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/synthetic

from flowtop.monitor.rankfilter import parse_filter  # noqa: E402
from flowtop.monitor.rankstats import METRICS, job_percentiles, map_layout, map_slots, rank_grid  # noqa: E402
from flowtop.monitor.rankview import ALL_SORTS, WORST, ViewSpec, build_view  # noqa: E402
from flowtop.tui.widgets._rank_cells import columns_for, row_cells  # noqa: E402
from synthetic.cluster import cluster_snapshot  # noqa: E402

CASES = (("grouped", ()), ("flat", ("g",)), ("filtered", ("slash", *"node0*", "enter")))
#: After each snapshot of a screen case: the cursor down, a node opened, the cursor down again.
STEPS = ((), ("down", "down", "down"), ("space",), ("down", "down"))


def specs(job_hosts: set[str]) -> list[ViewSpec]:
    filters = [parse_filter(text, set(), job_hosts) for text in ("", "node0*", "stalled", "128-1300", "node30*")]
    out = []
    for sort in (WORST, *ALL_SORTS):
        for reverse in (False, True):
            for grouped in (True, False):
                out.append(ViewSpec(sort=sort, reverse=reverse, grouped=grouped))
    for flt in filters[1:]:
        out += [ViewSpec(filter=flt), ViewSpec(filter=flt, grouped=False), ViewSpec(sort="mfu", filter=flt)]
    out.append(ViewSpec(opened=frozenset({"node037", "node300", "node154"})))
    out.append(ViewSpec(filter=filters[1], closed=frozenset({"node001"}), opened=frozenset({"node002"})))
    return out


def data_digest(count: int) -> str:
    h = hashlib.sha256()
    for t in range(count):
        job = cluster_snapshot(t, n_ranks=4096).jobs[0]
        columns = columns_for(job)
        for spec in specs({r.host for r in job.ranks}):
            view = build_view(job, spec)
            counts = (view.total, view.shown, view.nodes, view.grouped, view.open_default, len(view.rows))
            h.update(repr(counts).encode())
            for row in view.rows:
                h.update(repr((row.key, row_cells(row, columns))).encode())
        h.update(repr(job_percentiles(job)).encode())
        for metric in METRICS:
            for cols, rows in ((184, 34), (64, 8), (30, 4)):
                grid = rank_grid(job, metric, map_layout(map_slots(job), cols, rows))
                h.update(repr((grid.layout, grid.bins, [r.rank if r is not None else None for r in grid.ranks],
                               [grid.key_at(c) for c in range(grid.layout.cells)])).encode())
    return h.hexdigest()


async def screen_case(h: "hashlib._Hash", size: tuple[int, int], keys: tuple[str, ...], count: int) -> None:
    from rank_view import rank_view_app

    snaps = [cluster_snapshot(t, n_ranks=4096) for t in range(count + 1)]
    async with rank_view_app(snaps[0], size, keys) as (app, pilot):
        for i, snap in enumerate(snaps[1:]):
            app.screen.show(snap)  # type: ignore[attr-defined]
            await pilot.pause()
            h.update(app.export_screenshot().encode())
            for key in STEPS[i % len(STEPS)]:
                await pilot.press(key)
            await pilot.pause()
            h.update(app.export_screenshot().encode())


def screen_digest(count: int) -> str:
    h = hashlib.sha256()
    for size in ((200, 50), (80, 24)):
        for _, keys in CASES:
            asyncio.run(screen_case(h, size, keys, count))
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--snapshots", type=int, default=8)
    ap.add_argument("--part", choices=("data", "screen"), action="append", help="default: both")
    args = ap.parse_args()
    parts = args.part or ["data", "screen"]
    if "data" in parts:
        print("data  ", data_digest(args.snapshots), flush=True)
    if "screen" in parts:
        print("screen", screen_digest(args.snapshots), flush=True)


if __name__ == "__main__":
    main()
