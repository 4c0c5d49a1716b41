#!/usr/bin/env python
"""A relay's timing decisions, this tree against another (the base of a change to them): the same
seeded random states through Relay._report_due, _wait and _batch_at, digested.

    python bench/relay_timing_equiv.py --tree /path/to/base --tree .     # two digests, equal or not

Each state: a last report and its retry, the last batch, a refused batch's retry, a pace (none,
lapsed or holding, one of several flush_s), a command flood's pause, listening or not, 0-6 queued
frames of various ages, max_parts 4. Times are drawn on a 1 ms grid around now, -inf included.
Adapts to either signature of the helpers (before: _report_due(last, now) with the retry applied
by the loop, _wait(now, next_report) reading the links; after: both passed in).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import random
import subprocess
import shutil
import sys
import tempfile


def _states(n: int, seed: int = 11) -> list[dict[str, object]]:
    rng = random.Random(seed)

    def t() -> float:
        return -math.inf if rng.random() < 0.1 else round(100.0 + rng.uniform(-6, 3), 3)

    return [{"now": 100.0, "last_report": t(), "retry_report": t(), "last_batch": t(), "retry_at": t(),
             "pace": rng.choice([None, (0.4, 99.0), (0.4, 200.0), (0.8, 200.0), (2.0, 200.0), (0.05, 200.0)]),
             "paused_until": rng.choice([-math.inf, 99.5, 100.4, 100.9]), "listening": rng.random() < 0.8,
             "queue": sorted(round(100.0 - rng.uniform(0, 3), 3) for _ in range(rng.randint(0, 6)))}
            for _ in range(n)]


def child(n: int) -> int:
    from flowtop.tools.relay import Relay, RelayConfig

    d = tempfile.mkdtemp(prefix="fte")
    relay = Relay(RelayConfig(f"ipc://{d}/r.sock", "tcp://127.0.0.1:5999", max_parts=4))
    new = "retry_report" in inspect.signature(relay._report_due).parameters
    h = hashlib.sha256()
    for s in _states(n):
        now = float(s["now"])  # type: ignore[arg-type]
        relay._last_batch, relay._retry_at = s["last_batch"], s["retry_at"]
        relay._commands.pace = s["pace"] or (0.0, -math.inf)
        relay._commands.bound.paused_until = s["paused_until"]
        relay._links.up_conns = relay._links.up_subs = 1 if s["listening"] else 0
        relay._queue.clear()
        relay._queue.extend((b"f", t) for t in s["queue"])  # type: ignore[attr-defined]
        if new:
            due = relay._report_due(s["last_report"], s["retry_report"], now)
            wait = relay._wait(now, due, bool(s["listening"]))
        else:
            due = max(relay._report_due(s["last_report"], now), s["retry_report"])
            wait = relay._wait(now, due)
        at = relay._batch_at() if relay._queue else None
        h.update(repr((due, wait, at)).encode())
    print(json.dumps({"states": n, "digest": h.hexdigest()}))
    shutil.rmtree(d, ignore_errors=True)  # the relay never bound there: only its folder
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--states", type=int, default=100_000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.states)
    for tree in args.tree or ["."]:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--states", str(args.states)],
                             env=env, capture_output=True, text=True, check=True).stdout
        print(tree, out.strip(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
