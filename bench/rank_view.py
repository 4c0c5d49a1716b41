"""Refresh time of the rank view (table + map + percentile line) at 4,096 ranks, headless.

Drives the real Textual app (FlowtopApp, MainScreen) with synthetic snapshots of a 4,096-rank
job (synthetic.cluster: 512 nodes of 8, steps advancing, healthy ranks trading places
every snapshot) and times, per snapshot:

* ``show``: MainScreen.show(snapshot): building the rows (filter, worst-first sort, node
  groups), the percentiles, the map's cells, and finding which screen lines changed;
* ``paint``: the message loop settling and the screen painting the refreshed lines;
* ``refresh``: both, what a 2 Hz cadence must fit in (target <= 100 ms);
* ``cpu``: the process CPU time of the refresh (the figure that does not grow when other
  processes share the cores; the UI thread's share of a 500 ms cadence);

and how many lines the table and the map refreshed. The process runs the monitor's garbage
collector policy, as ``flowtop top`` does (flowtop.monitor.gcpolicy: its thresholds, and the freeze
the data thread makes after each tick, made here before each snapshot is shown); ``--gc cpython``
keeps CPython's defaults, whose collections of the 4,096-rank snapshots made the maxima (a refresh
of 129-153 ms at most against 36-56 ms, medians alike, 2026-12-05). Usage::

    python bench/rank_view.py [--ranks 4096] [--snapshots 12] [--size 200x50 --size 80x24] [--gc cpython]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/synthetic

from flowtop.monitor import gcpolicy  # noqa: E402
from flowtop.monitor.snapshot import MonitorSnapshot  # noqa: E402
from flowtop.tui.app import FlowtopApp  # noqa: E402
from flowtop.tui.widgets.rank_map import RankMap
from flowtop.tui.widgets.rank_table import RankTable
from synthetic.cluster import cluster_snapshot
from synthetic.replay import ReplaySource

if TYPE_CHECKING:
    from textual.pilot import Pilot  # noqa: TID251 - a bench of the UI, for the annotation only


@contextlib.asynccontextmanager
async def rank_view_app(first: MonitorSnapshot, size: tuple[int, int],
                        keys: tuple[str, ...]) -> AsyncIterator[tuple[FlowtopApp, Pilot]]:
    """The real app headless at ``size``, showing ``first``, ``keys`` pressed and settled: what
    this bench, bench/refresh_cost.py and bench/rank_view_digest.py then show snapshots to."""
    app = FlowtopApp(ReplaySource([first], advance=False), refresh_s=0)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
        await pilot.pause()
        yield app, pilot


async def run(size: tuple[int, int], ranks: int, count: int, keys: tuple[str, ...]) -> dict[str, list[float]]:
    snaps = [cluster_snapshot(t, n_ranks=ranks) for t in range(count + 1)]
    out: dict[str, list[float]] = {"show": [], "paint": [], "refresh": [], "cpu": [], "table_lines": [], "map_lines": []}
    async with rank_view_app(snaps[0], size, keys) as (app, pilot):
        screen = app.screen
        table, rank_map = screen.query_one(RankTable), screen.query_one(RankMap)
        for snap in snaps[1:]:
            gcpolicy.after_tick()  # the data thread's, after the tick that made the snapshot
            c0, t0 = time.process_time(), time.perf_counter()
            screen.show(snap)  # type: ignore[attr-defined]
            t1 = time.perf_counter()
            await pilot.pause()
            t2, c2 = time.perf_counter(), time.process_time()
            out["cpu"].append((c2 - c0) * 1e3)
            out["show"].append((t1 - t0) * 1e3)
            out["paint"].append((t2 - t1) * 1e3)
            out["refresh"].append((t2 - t0) * 1e3)
            out["table_lines"].append(table.lines_refreshed)
            out["map_lines"].append(rank_map.lines_refreshed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--snapshots", type=int, default=12)
    ap.add_argument("--size", action="append", help="terminal WxH (repeatable); default 200x50 and 80x24")
    ap.add_argument("--gc", choices=("monitor", "cpython"), default="monitor",
                    help="the monitor's garbage collector policy (as flowtop top) or CPython's defaults")
    args = ap.parse_args()
    if args.gc == "monitor":
        gcpolicy.for_monitor()
    sizes = [tuple(int(v) for v in s.split("x")) for s in (args.size or ["200x50", "80x24"])]
    print(f"rank view refresh, {args.ranks:,} ranks, {args.snapshots} snapshots each (ms; median / max)")
    for size in sizes:
        for label, keys in (("grouped, worst first", ()), ("flat, worst first", ("g",)), ("grouped, filter", ("slash", *"node0*", "enter"))):
            r = asyncio.run(run(size, args.ranks, args.snapshots, keys))  # type: ignore[arg-type]
            fig = "  ".join(f"{k} {statistics.median(r[k]):5.1f} / {max(r[k]):5.1f}" for k in ("show", "paint", "refresh", "cpu"))
            lines = f"lines refreshed: table {statistics.median(r['table_lines']):.0f}, map {statistics.median(r['map_lines']):.0f}"
            print(f"{size[0]}x{size[1]:<3} {label:22} {fig}   {lines}")


if __name__ == "__main__":
    main()
