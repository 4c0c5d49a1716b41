"""Snapshot build time of the monitor's model at many ranks (no sockets: the model alone).

    python bench/snapshot_build.py --ranks 1024

Every rank is made of the frames of one real rank (hello, steps, FLOP count, telemetry from
the H200 recording ``tests/data/h200-gpt-small.rec.gz``) re-keyed, plus that rank's kernel
table, so a snapshot carries what a live one does. Prints, in ms (median of ``--repeat``):

* ``tick_ms`` — ``Model.tick`` (eviction, hints with their hysteresis, the view it publishes);
* ``snapshot_all_changed_ms`` — a snapshot after every rank got one step since the last one;
* ``snapshot_tenth_changed_ms`` — after a tenth of the ranks did (the rest are reused);
* ``snapshot_none_changed_ms`` — after none did;
* ``reused_share`` — the share of RankSnapshot objects that a snapshot after no change took
  over from the one before (1.0: all of them).

On a model without ``tick`` (before the data side moved to its own thread) ``snapshot`` did
eviction and hints too; the script then reports only the snapshot figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

REC = ROOT / "tests" / "data" / "h200-gpt-small.rec.gz"


def _template() -> tuple[dict[str, dict], list[dict], object]:
    """One rank's last fields per kind, its step records and a built kernel window."""
    from flowtop.monitor.recording import read_frames
    from flowtop.monitor.rankkernels import build_window
    from probe import wire

    last: dict[str, dict] = {}
    steps: list[dict] = []
    stats = None
    for _, frame in read_frames(REC):
        msg = wire.decode(frame)
        if msg.kind == "step":
            steps.append(dict(msg.fields))
        elif msg.kind == "kernels":
            if stats is None:
                stats = build_window(msg.fields)
        else:
            last[msg.kind] = dict(msg.fields)
    return last, steps, stats


def main() -> int:
    """Build the model, time the snapshots, print JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from flowtop.monitor.recording import feed
    from flowtop.monitor.rankkernels import add_window
    from flowtop.monitor.wiring import make_model
    from probe import wire

    last, steps, stats = _template()
    model = make_model()
    keys = [wire.RankKey("bench", f"node{r // 8:04d}", 20_000 + r, r, 0) for r in range(args.ranks)]
    seq = dict.fromkeys(keys, 0)
    now = 100.0

    def send(key: wire.RankKey, kind: str, fields: dict) -> None:
        seq[key] += 1
        feed(model, wire.encode(kind, key, seq[key], 0.0, fields), now)

    hello = {**last["hello"], "world_size": args.ranks}
    for key in keys:
        send(key, "hello", {**hello, "local_rank": key.rank % 8})
    step = 0
    for step, fields in enumerate(steps[:64], 1):
        now += 0.01
        for key in keys:
            send(key, "step", {**fields, "step": step})
    for key in keys:
        send(key, "flops", last["flops"])
        send(key, "telemetry", last["telemetry"])
        add_window(model.ranks[key], stats)
    has_tick = hasattr(model, "tick")

    def advance(share: float) -> None:
        nonlocal now, step
        now += 0.1  # well inside every rank's stale limit: only the data changes
        step += 1
        for key in keys[: int(len(keys) * share)]:
            send(key, "step", {**steps[-1], "step": step})

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - t)

    out: dict[str, object] = {"ranks": args.ranks, "model_has_tick": has_tick}
    if has_tick:
        ticks = []
        for _ in range(args.repeat):
            advance(1.0)
            ticks.append(timed(lambda: model.tick(now)))
        out["tick_ms"] = statistics.median(ticks)
    for name, share in (("all", 1.0), ("tenth", 0.1), ("none", 0.0)):
        times = []
        for _ in range(args.repeat):
            model.snapshot(now)  # the previous snapshot, the one the next builds on
            advance(share)
            times.append(timed(lambda: model.snapshot(now)))
        out[f"snapshot_{name}_changed_ms"] = statistics.median(times)
    prev = model.snapshot(now)
    advance(0.0)
    snap = model.snapshot(now)
    old = {(r.rank, r.pid): r for j in prev.jobs for r in j.ranks}
    ranks = [r for j in snap.jobs for r in j.ranks]
    out["reused_share"] = sum(old.get((r.rank, r.pid)) is r for r in ranks) / max(1, len(ranks))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
