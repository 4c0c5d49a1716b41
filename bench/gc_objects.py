"""What the monitor's full collection walks: the garbage collector's tracked objects per rank.

    python bench/gc_objects.py --ranks 4096            # counts, families, collect() wall time
    python bench/gc_objects.py --ranks 1024 --top 40 --json /tmp/gc.json

A full collection (flowtop.monitor.gcpolicy: gc.unfreeze, then gc.collect) stops every thread for
a time proportional to the objects the collector tracks, so this builds a model the way
``bench/ingest.py --memory`` does, in-process, from real wire frames decoded as the collector
decodes them (hello, FLOP count, ``stepcols`` step frames, telemetry, two kernel windows a rank
whose tables come back pickled as from the builder process), ticking at 2 Hz and freezing after
every tick as a live monitor does (gc.freeze; no collection between, as ``gcpolicy.paused``), to a
steady state: the step ring turned over, views rebuilt, a round of ticks. Then, the process's own
objects (imports, this script) counted before the model is built and taken off:

* ``tracked_per_rank_frozen``: what the next full collection starts on (unfrozen, uncollected:
  a tuple of atomic values is untracked by the first collection that walks it, and frozen objects
  are walked by none until the full one);
* ``tracked_per_rank``: what is left tracked after that collection (what later ones walk);
* ``collect_first_ms``: that first collection's wall time; ``collect_ms``: the median of
  ``--repeat`` more (``*_cpu_ms``: the same in the process's CPU time, which other processes on
  the cores move less);
* ``families``: tracked objects per rank by type, and for containers (tuple, list, dict, set) by
  what holds them (``Type.attribute`` of an instance, or the container type inside its holder);
* ``traced_kb_per_rank`` (``--traced``): tracemalloc's figure for the whole model as built (its
  frozen garbage included), slower; tracing stops before the collections are timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

CONTAINERS = (tuple, list, dict, set, frozenset)


def build(ranks: int, telemetry: int, freeze: bool) -> tuple[Any, Any]:
    """A model fed ``ranks`` ranks to steady state, and its last snapshot."""
    import ingest  # bench/ingest.py: the H200 recording's frames and the simulator's step columns

    from flowtop.monitor import gcpolicy, rankstate
    from flowtop.monitor.rankkernels import build_window
    from flowtop.monitor.recording import feed
    from flowtop.monitor.wiring import make_model
    from probe import wire

    gc.set_threshold(*gcpolicy.THRESHOLDS)
    tpl = ingest._templates()
    rng = random.Random(0)
    cols = ingest._Columns(0.01, rng)
    model = make_model()
    keys = [wire.RankKey(ingest.JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
    seq = dict.fromkeys(keys, 0)
    clock = [1000.0]
    snap: list[Any] = [None]

    def send(key: wire.RankKey, kind: str, fields: dict[str, Any]) -> None:
        seq[key] += 1
        feed(model, wire.encode(kind, key, seq[key], clock[0], fields), clock[0])

    def ingest(key: wire.RankKey, kind: str, fields: dict[str, Any]) -> None:
        # telemetry straight into the model (its samples are most of the frames: encoding and
        # decoding 300 a rank took minutes at 4,096 ranks); the fields are what decode gives
        seq[key] += 1
        model.ingest(wire.Message(kind, key, seq[key], clock[0], fields), clock[0])

    def tick() -> None:
        gc.disable()  # gcpolicy.paused
        snap[0] = model.tick(clock[0])
        if freeze:
            gc.freeze()  # gcpolicy.after_tick, no full collection due
        gc.enable()

    for key in keys:
        send(key, "hello", {**tpl["hello"], "world_size": ranks, "local_rank": key.rank % 8})
        send(key, "flops", dict(tpl["flops"]))
    tick()
    # Two kernel windows a rank, each its own table as the builder process's pickles give.
    blob = pickle.dumps(build_window(tpl["kernels"]))
    for key in keys:
        for _ in range(2):
            model.apply_kernels(key, pickle.loads(blob))
    step, per_frame = 1, 100  # a 10 ms step under a 1 s pace
    for i in range(max(telemetry, 2 * rankstate.RING // per_frame + 1)):
        clock[0] += 0.05  # ticks every ten of these: the ring turns over in the first few
        for key in keys:
            if i <= 2 * rankstate.RING // per_frame:
                send(key, "stepcols", cols.fields(step, step + per_frame - 1))
            if i < telemetry:
                gpu = {**tpl["telemetry"]["gpu"], "power_w": 500.0 + rng.random(), "tensor_active": rng.random()}
                ingest(key, "telemetry", {**tpl["telemetry"], "gpu": gpu})
        step += per_frame
        if i % 10 == 9:
            tick()
    for _ in range(model.ticks_per_round(ranks) + 1):  # every view rebuilt on its turn
        clock[0] += 0.5
        for key in keys:
            send(key, "stepcols", cols.fields(step, step + per_frame - 1))
        step += per_frame
        tick()
    return model, snap[0]


def families(top: int, ranks: int, skip: set[int]) -> list[dict[str, Any]]:
    """Tracked objects by type, containers by their holder, per rank, largest first."""
    objs = gc.get_objects()
    holder: dict[int, str] = {}
    kinds: dict[int, type] = {}
    for o in objs:
        t = type(o)
        if t in CONTAINERS:
            kinds[id(o)] = t
    for o in objs:
        t = type(o)
        if t in CONTAINERS:
            for r in gc.get_referents(o):
                if id(r) in kinds and id(r) not in holder:
                    holder[id(r)] = "@" + str(id(o))
            continue
        slots = [s for c in t.__mro__ for s in getattr(c, "__slots__", ())]
        named = {id(getattr(o, s)): s for s in slots if isinstance(s, str) and hasattr(o, s)}
        attrs = getattr(o, "__dict__", None)
        if isinstance(attrs, dict):
            named.update({id(v): k for k, v in attrs.items()})
            holder.setdefault(id(attrs), f"{t.__name__}.__dict__")
        for r in gc.get_referents(o):
            if id(r) in kinds and id(r) not in holder:
                holder[id(r)] = f"{t.__name__}.{named.get(id(r), '?')}"

    def label(i: int, depth: int = 0) -> str:
        h = holder.get(i, "(no tracked holder)")
        if not h.startswith("@"):
            return h
        parent = int(h[1:])
        inner = label(parent, depth + 1) if depth < 3 else "..."
        return f"{kinds[parent].__name__} in {inner}"

    count: Counter[str] = Counter()
    for o in objs:
        if id(o) in skip:
            continue
        t = type(o)
        count[f"{t.__name__} <- {label(id(o))}" if t in CONTAINERS else f"{t.__module__}.{t.__qualname__}"] += 1
    return [{"family": k, "per_rank": round(v / ranks, 2), "objects": v} for k, v in count.most_common(top)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--telemetry", type=int, default=300, help="telemetry samples a rank (the sparklines' length)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-freeze", action="store_true", help="collect as CPython does, no freezing at ticks")
    ap.add_argument("--traced", action="store_true", help="also tracemalloc's memory per rank (slower)")
    ap.add_argument("--json", help="append the result as one JSON line")
    args = ap.parse_args()
    import ingest  # noqa: F401  (imported before the base count: its module objects are not the model's)

    from flowtop.monitor import wiring  # noqa: F401
    from probe import wire  # noqa: F401

    gc.collect()
    before = gc.get_objects()  # kept alive: their ids stay theirs
    base = len(before)
    if args.traced:
        import tracemalloc
        tracemalloc.start()
        mem0 = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    model, snap = build(args.ranks, args.telemetry, not args.no_freeze)
    out: dict[str, Any] = {"ranks": args.ranks, "build_s": round(time.perf_counter() - t0, 1)}
    if args.traced:  # stopped before the collections are timed: tracing slows them several times
        out["traced_kb_per_rank"] = round((tracemalloc.get_traced_memory()[0] - mem0) / args.ranks / 1024, 1)
        tracemalloc.stop()
    gc.unfreeze()
    out["tracked_per_rank_frozen"] = round((len(gc.get_objects()) - base) / args.ranks, 1)
    t, c = time.perf_counter(), time.process_time()
    gc.collect()
    out["collect_first_ms"] = round(1000 * (time.perf_counter() - t), 1)
    out["collect_first_cpu_ms"] = round(1000 * (time.process_time() - c), 1)
    out["tracked_per_rank"] = round((len(gc.get_objects()) - base) / args.ranks, 1)
    walls, cpus = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        gc.collect()
        walls.append(1000 * (time.perf_counter() - t))
        cpus.append(1000 * (time.process_time() - c))
    out["collect_ms"] = round(statistics.median(walls), 1)
    out["collect_cpu_ms"] = round(statistics.median(cpus), 1)  # what other processes on the cores move less
    out["collect_ms_all"] = [round(w, 1) for w in walls]
    out["families"] = families(args.top, args.ranks, {id(o) for o in before})
    print(f"{args.ranks} ranks: tracked per rank {out['tracked_per_rank_frozen']} as the full collection starts, "
          f"{out['tracked_per_rank']} after; collect {out['collect_first_ms']} ms first, "
          f"{out['collect_ms']} ms median of {args.repeat} "
          f"(CPU {out['collect_first_cpu_ms']} / {out['collect_cpu_ms']} ms)"
          + (f"; traced {out['traced_kb_per_rank']} KB per rank" if args.traced else ""))
    for f in out["families"]:
        print(f"  {f['per_rank']:8.2f}  {f['family']}")
    if args.json:
        with open(args.json, "a") as fh:
            fh.write(json.dumps(out) + "\n")
    del model, snap
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
