"""The UI thread's own work per rank-view refresh, in instructions (deterministic, load-proof).

bench/rank_view.py times a refresh in wall and CPU time, which a shared box moves by ±30 %.
This drives the same thing (the real FlowtopApp, MainScreen, synthetic 4,096-rank snapshots
from tests/synthetic/cluster.py: ``screen.show(snapshot)`` then the message loop settling and
the screen painting) under valgrind's callgrind, with collection on only around each measured
refresh: a tiny C helper (compiled here with the system C compiler into a temporary folder)
issues callgrind's client requests (toggle collection; dump the counts at each case's end).
Each case (terminal size x grouped / flat / filtered view) runs its own app, shows
``--warm`` snapshots first (caches, first paint, layout) and then counts ``--snapshots``.
Usage::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/rc.%p \\
        python bench/refresh_cost.py [--ranks 4096] [--snapshots 4] [--size 200x50 --size 80x24]
    python bench/refresh_cost.py --report /tmp/rc.PID      # instructions per refresh, per case

(``python`` must be the interpreter itself, not a pyenv shim script: valgrind follows no exec;
``$(python -c 'import sys; print(sys.executable)')`` names it.)

Without valgrind the client requests are no-ops (the run only checks the harness). It refuses
to run without PYTHONHASHSEED=0: set and dict orders, hence counts, must repeat.
The per-function split of a case: ``callgrind_annotate /tmp/rc.PID.N``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/synthetic

_HELPER_C = r"""
#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_dump(const char *what) { CALLGRIND_DUMP_STATS_AT(what); }
"""

CASES = (("grouped", ()), ("flat", ("g",)), ("filtered", ("slash", *"node0*", "enter")))


def load_helper() -> ctypes.CDLL:
    """The client-request helper, compiled for this run."""
    tmp = Path(tempfile.mkdtemp(prefix="refresh_cost"))
    (tmp / "cg.c").write_text(_HELPER_C)
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(tmp / "cg.so"), str(tmp / "cg.c")], check=True)
    return ctypes.CDLL(str(tmp / "cg.so"))


async def run_case(cg: ctypes.CDLL, size: tuple[int, int], ranks: int, warm: int, count: int,
                   keys: tuple[str, ...], label: str) -> None:
    from flowtop.monitor import gcpolicy
    from rank_view import rank_view_app
    from synthetic.cluster import cluster_snapshot

    snaps = [cluster_snapshot(t, n_ranks=ranks) for t in range(warm + count + 1)]
    async with rank_view_app(snaps[0], size, keys) as (app, pilot):
        screen = app.screen
        for i, snap in enumerate(snaps[1:]):
            gcpolicy.after_tick()  # the data thread's freeze after the tick that made it
            measured = i >= warm
            if measured:
                cg.cg_toggle()
            screen.show(snap)  # type: ignore[attr-defined]
            await pilot.pause()
            if measured:
                cg.cg_toggle()
    cg.cg_dump(f"{label} x{count}".encode())


def report(prefix: str) -> None:
    """Instructions per refresh of each case dumped under ``prefix`` (files prefix.N)."""
    dumps = [p for p in glob.glob(prefix + ".*") if p.rsplit(".", 1)[1].isdigit()]
    for path in sorted(dumps, key=lambda p: int(p.rsplit(".", 1)[1])):
        text = Path(path).read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        totals = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
        if trigger is None or totals is None or " x" not in trigger.group(1):
            continue
        label, count = trigger.group(1).rsplit(" x", 1)
        print(f"{label:24} {int(totals.group(1)) / int(count):14,.0f} instructions per refresh")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--snapshots", type=int, default=4, help="refreshes counted per case")
    ap.add_argument("--warm", type=int, default=2, help="refreshes shown before counting")
    ap.add_argument("--size", action="append", help="terminal WxH (repeatable); default 200x50 and 80x24")
    ap.add_argument("--case", action="append", choices=[c for c, _ in CASES], help="default: all")
    ap.add_argument("--report", metavar="PREFIX", help="print the counts of a finished run")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        return
    if os.environ.get("PYTHONHASHSEED") != "0":
        sys.exit("run with PYTHONHASHSEED=0 (set and dict orders, hence counts, must repeat)")
    from flowtop.monitor import gcpolicy

    gcpolicy.for_monitor()
    cg = load_helper()
    sizes = [tuple(int(v) for v in s.split("x")) for s in (args.size or ["200x50", "80x24"])]
    for w, h in sizes:
        for name, keys in CASES:
            if args.case and name not in args.case:
                continue
            asyncio.run(run_case(cg, (w, h), args.ranks, args.warm, args.snapshots, keys, f"{w}x{h} {name}"))
            print(f"{w}x{h} {name}: done", flush=True)


if __name__ == "__main__":
    main()
