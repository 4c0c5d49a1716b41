"""What a monitor costs while it watches only ended jobs (in-process, the model alone).

    python bench/ended_idle.py --jobs 15 --ranks 64
    python bench/ended_idle.py --jobs 2 --ranks 4096 --ticks 16
    python bench/ended_idle.py --jobs 15 --ranks 64 --silent
    python bench/ended_idle.py --jobs 15 --ranks 64 --silent --relay

Fills a model (``make_model``: the real hint engine, kernel tables) with ``--jobs`` jobs of
``--ranks`` ranks, every frame a real wire frame through the model's ingest path (hello, step
columns, FLOP count, telemetry; each rank a kernel table of the H200 recording's window), ticks
it at 2 Hz while they run, then every rank says bye. After a few ticks that see the byes, it
times ``--ticks`` ticks of nothing but the clock (0.5 s apart) and as many ``snapshot()`` calls,
and prints, as JSON, the CPU per tick and per snapshot (median and max, ms). ``--silent``: no
bye, the ranks fall silent (a crash, a lost node); the model ticks on for SETTLE_S (stale after
5 s, the hang hint past its 30 s floor) before the timed ticks. ``--relay``: each node's ranks
come through a node relay (a stamped batch a frame, as the collector applies it), which falls
silent with them under ``--silent`` (a lost node: its ranks read "relay HOST silent for N s").
``--profile N`` prints the top N
functions of the idle ticks (cProfile, cumulative time) instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Monitor time a silent job is ticked before it is timed: stale after 5 s, the hang hint's
#: 30 s floor (hints.rules: hang_all), a few seconds of margin.
SETTLE_S = 40.0
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _fill(jobs: int, ranks: int, steps: int, kernels: bool, silent: bool = False,  # type: ignore[no-untyped-def]
          relay: bool = False):
    """The model with every job run ``steps`` steps and ended; its clock at the last bye's tick.
    ``silent``: no bye, the ranks fall silent (a crash, a lost node); the model ticks on until
    every clock-driven change of theirs has happened (stale, the hang hint past its 30 s floor
    and its hysteresis: SETTLE_S), its clock at the last of those ticks. ``relay``: each node's
    ranks through a relay of its own (node host, a batch of one frame each)."""
    from flowtop.monitor.rankkernels import add_window
    from flowtop.monitor.recording import feed
    from flowtop.monitor.relays import encode_stamp
    from flowtop.monitor.wiring import make_model
    from probe import wire
    from probe.wire.steps import encode_fields
    from snapshot_build import _template

    last, _, stats = _template()
    model = make_model()
    rng = random.Random(7)
    keys = [wire.RankKey(f"job{j:02d}", f"node{r // 8:04d}", 10_000 + 100 * j + r, r, 0)
            for j in range(jobs) for r in range(ranks)]
    seq = dict.fromkeys(keys, 0)
    now = 100.0

    def send(key: wire.RankKey, kind: str, fields: dict) -> None:
        seq[key] += 1
        frame = wire.encode(kind, key, seq[key], now, fields)
        if not relay:
            feed(model, frame, now)
            return
        # As Collector.handle_batch: the relay's clock 900 s ahead of the monitor's, no queueing.
        via, (at,) = model.relays.unstamp([encode_stamp(f"{key.host}:1:1", now + 900.0, [0]), frame], now)
        model.ingest(wire.decode(frame), at, via)

    for key in keys:
        send(key, "hello", {**last["hello"], "world_size": ranks, "local_rank": key.rank % 8})
        send(key, "flops", last["flops"])
    per_frame, step, next_tick = 16, 0, now + 0.5
    while step < steps:
        now += 0.5
        for key in keys:
            recs = [{"step": step + i + 1, "wall_s": 0.03 * (1 + 0.05 * rng.random()), "tokens": 4096, "drops": 0,
                     "input_wait_s": 0.001} for i in range(per_frame)]
            send(key, "stepcols", encode_fields(recs, 0))
            send(key, "telemetry", last["telemetry"])
        step += per_frame
        while next_tick <= now:
            model.tick(next_tick)
            next_tick += 0.5
    if kernels and stats is not None:
        for key in keys:
            add_window(model.ranks[key], stats)
    now += 0.2
    if not silent:
        for key in keys:
            send(key, "bye", {"reason": "exit", "steps": step, "drops": 0})
    for _ in range(4 if not silent else int(SETTLE_S / 0.5)):  # the ticks that see the byes, or the silence
        now = next_tick
        model.tick(now)
        next_tick += 0.5
    return model, now


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64, help="steps each rank runs before its bye")
    ap.add_argument("--ticks", type=int, default=40, help="idle ticks timed (and as many snapshots)")
    ap.add_argument("--no-kernels", action="store_true", help="no kernel tables")
    ap.add_argument("--silent", action="store_true", help="the ranks fall silent instead of saying bye")
    ap.add_argument("--relay", action="store_true", help="each node's ranks come through a node relay")
    ap.add_argument("--profile", type=int, default=0, help="print the top N functions of the idle ticks")
    args = ap.parse_args()
    t0 = time.perf_counter()
    model, now = _fill(args.jobs, args.ranks, args.steps, not args.no_kernels, args.silent, args.relay)
    fill_s = time.perf_counter() - t0
    ended = {j.status for j in model.snapshot(now).jobs}
    served = model._ended_jobs.served
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.ticks):
            now += 0.5
            model.tick(now)
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.profile)
        return 0
    ticks, snaps = [], []
    for _ in range(args.ticks):
        now += 0.5
        c = time.process_time()
        model.tick(now)
        ticks.append(1000 * (time.process_time() - c))
        c = time.process_time()
        model.snapshot(now)
        snaps.append(1000 * (time.process_time() - c))
    print(json.dumps({
        "jobs": args.jobs, "ranks": args.ranks, "silent": args.silent, "relay": args.relay,
        "statuses": sorted(ended), "fill_s": round(fill_s, 1),
        "tick_ms_median": round(statistics.median(ticks), 3), "tick_ms_max": round(max(ticks), 3),
        "snapshot_ms_median": round(statistics.median(snaps), 3), "snapshot_ms_max": round(max(snaps), 3),
        "kept_served": model._ended_jobs.served - served,  # job snapshots served as kept (flowtop.monitor.endedjobs)
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
