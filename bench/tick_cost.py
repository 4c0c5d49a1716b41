"""What a round of the model's ticks costs the data thread at N ranks (in-process, the model alone).

    python bench/tick_cost.py --ranks 4096 --spread 8          # ms per tick (CPU time), JSON
    python bench/tick_cost.py --ranks 4096 --digest            # and a digest of every tick's output
    valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no --toggle-collect=starmap_next \\
        --callgrind-out-file=/tmp/tick.cg "$(python -c 'import sys; print(sys.executable)')" \\
        bench/tick_cost.py --ranks 4096 --spread 8 --callgrind
    callgrind_annotate --inclusive=yes /tmp/tick.cg | head -60

(valgrind must run the interpreter itself, not a pyenv shim. Another checkout's code: run it
from that checkout, ``cd BASE && python /path/to/bench/tick_cost.py ...``: the working
directory's ``flowtop`` is imported.)

Fills a model (``make_model``: the real hint engine, kernel tables) with a job of ``--ranks``
ranks, each node's 8 ranks through a node relay (a stamped batch a frame, as the collector
applies it, bench/ended_idle.py), every frame a real wire frame through the model's ingest path:
a hello and a FLOP count each, the H200 recording's kernel window each (bench/snapshot_build.py),
step columns at the wire's 2 s pace of a 10 ms step (200 records a frame, a quarter of the ranks
each tick, bench/ingest.py's simulator columns), telemetry every 10 s; and a second job of 16
ranks. It ticks at 2 Hz through ``--warmup`` ticks, then measures ``--ticks`` ticks (a round of
8 by default) with the frames between them fed outside the measure. What happens in the job while
it runs, so that every path of a tick is taken: rank 77 straggles (its forward ends 40 % of a
step late), node 5's 8 ranks and their relay fall silent 2 s before the measured ticks (stale,
the relay's cut, during them), node 1's 8 ranks say bye at the 3rd measured tick, the 16-rank
job ends at the 6th, rank 200 restarts (a new incarnation) at the 7th (which hides the ended and silent
ranks from then on: an earlier run's, flowtop.monitor.claims).

``--spread`` is the model's tick spread (flowtop.monitor.thinning: 8 under load, 64 ranks' views
a tick). ``--digest`` prints a SHA-256 over every measured tick's snapshot (its ``repr``: every
field of every rank, job, hint and relay; and the JSON snapshot), the notices raised, the
refusals, and the Prometheus text of the last tick: two code versions that agree make the same
digest (``--seed`` picks the jitter). Under callgrind (``--callgrind``) only the measured ticks
count: each runs inside ``itertools.starmap`` (the toggle; nothing in flowtop calls it); the
build runs uninstrumented (``--instr-atstart=no``, ~10x faster) until the harness turns
instrumentation on with ``callgrind_control`` before the first measured tick; the digest is not
taken (it is taken without callgrind, with the same run).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.getcwd())  # the code version under test: the working directory's
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import ingest as B  # noqa: E402  (bench/ingest.py: the simulator's step columns and templates)

sys.path.insert(0, os.getcwd())  # again: ingest put its own checkout first (no flowtop imported yet)

T0 = 1000.0  # the monitor clock at the first frame
TICK_S = 0.5
STEP_S = 0.01
PACE_TICKS = 4  # a rank's step frame every 4 ticks: the wire's 2 s pace
TELEMETRY_TICKS = 20
STRAGGLER, STALLED_NODE, ENDING_NODE, RESTARTING = 77, 5, 1, 200


class Job:
    """The simulated ranks: their keys, sequence numbers, the steps they sent."""

    def __init__(self, name: str, ranks: int, seed: int) -> None:
        from probe import wire

        self.rng = random.Random(seed)
        self.columns = B._Columns(STEP_S, self.rng)
        self.keys = [wire.RankKey(name, f"{name}-node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
        self.seq = [0] * ranks
        self.last = [0] * ranks
        self.alive = [True] * ranks


class Sim:
    """Feeds the model as the collector would, at the monitor clock ``now``."""

    def __init__(self, model: Any, tpl: dict[str, dict[str, Any]], window: Any) -> None:
        self.model, self.tpl, self.window = model, tpl, window
        self.now = T0

    def send(self, job: Job, i: int, kind: str, fields: dict[str, Any]) -> None:
        from flowtop.monitor.relays import encode_stamp
        from probe import wire

        job.seq[i] += 1
        key = job.keys[i]
        frame = wire.encode(kind, key, job.seq[i], self.now + 1.8e9, fields)
        # As Collector.handle_batch: the relay's clock 900 s ahead of the monitor's, 2 ms queued.
        via, (at,) = self.model.relays.unstamp([encode_stamp(f"{key.host}:1:1", self.now + 900.0, [2000]), frame],
                                               self.now)
        self.model.ingest(wire.decode(frame), at, via)

    def start(self, job: Job, i: int) -> None:
        from flowtop.monitor.rankkernels import add_window

        world = len(job.keys)
        self.send(job, i, "hello", {**self.tpl["hello"], "world_size": world, "local_rank": i % 8})
        self.send(job, i, "flops", dict(self.tpl["flops"]))
        self.send(job, i, "telemetry", dict(self.tpl["telemetry"]))
        add_window(self.model.ranks[job.keys[i]], self.window)

    def steps(self, job: Job, i: int) -> None:
        upto = int((self.now - T0) / STEP_S)
        if upto <= job.last[i]:
            return
        late = 0.4 * STEP_S if i == STRAGGLER else 0.0
        self.send(job, i, "stepcols", job.columns.fields(job.last[i] + 1, upto, late))
        job.last[i] = upto

    def between(self, job: Job, tick: int) -> None:
        """The frames ``job``'s ranks send in the half second before ``tick``."""
        for i in range(len(job.keys)):
            if not job.alive[i]:
                continue
            if (i + tick) % PACE_TICKS == 0:
                self.steps(job, i)
            if (i + tick) % TELEMETRY_TICKS == 0:
                tel = self.tpl["telemetry"]
                self.send(job, i, "telemetry", {**tel, "gpu": {**tel["gpu"], "power_w": 500.0 + (i * 7 + tick) % 100}})

    def bye(self, job: Job, i: int) -> None:
        self.steps(job, i)
        self.send(job, i, "bye", {"reason": "exit", "steps": job.last[i], "drops": 0})
        job.alive[i] = False


def build(ranks: int, spread: int, warmup: int, seed: int) -> tuple[Any, Any, Sim, list[Job]]:
    """The model and its ticker (flowtop.monitor.ticker: the collector paused in a tick, a freeze
    after it, as live) after ``warmup`` ticks; the simulator."""
    from flowtop.monitor.rankkernels import build_window
    from flowtop.monitor.wiring import make_model

    from flowtop.monitor import gcpolicy
    from flowtop.monitor.ticker import Ticker

    gcpolicy.for_monitor()  # as the monitor's commands do: its collector thresholds, a freeze a tick
    # ... but no full collection: the freezer runs one every 30 s of wall time (a run under
    # callgrind is 50x slower), which would land in some measured ticks and not in others.
    gcpolicy._FREEZER = gcpolicy.Freezer(full_every_s=1e12, full_max_s=1e12)
    tpl = B._templates()
    model = make_model()
    model.set_spread(spread)
    sim = Sim(model, tpl, build_window(tpl["kernels"]))
    ticker = Ticker(lambda at: model.tick(at, "bench"), T0, TICK_S)
    jobs = [Job("bench", ranks, seed), Job("small", 16, seed + 1)]
    for job in jobs:
        for i in range(len(job.keys)):
            sim.start(job, i)
    big = jobs[0]
    for t in range(1, warmup + 1):
        sim.now = T0 + t * TICK_S
        if t == warmup - 4:  # 2 s before the measured ticks: stale 5 s after its last frame, in them
            for i in range(8 * STALLED_NODE, min(ranks, 8 * STALLED_NODE + 8)):
                big.alive[i] = False
        for job in jobs:
            sim.between(job, t)
        ticker.catch_up(sim.now)
    return model, ticker, sim, jobs


def events(sim: Sim, jobs: list[Job], k: int) -> None:
    """What happens before the ``k``-th measured tick besides the steps (see the module's doc)."""
    big, small = jobs
    if k == 2:
        for i in range(8 * ENDING_NODE, min(len(big.keys), 8 * ENDING_NODE + 8)):
            sim.bye(big, i)
    if k == 6 and RESTARTING < len(big.keys):
        big.keys[RESTARTING] = big.keys[RESTARTING]._replace(pid=90_000, inc=1)
        big.seq[RESTARTING] = 0
        sim.start(big, RESTARTING)
    if k == 5:
        for i in range(len(small.keys)):
            sim.bye(small, i)


def kernel_reprs_once() -> None:
    """Each kernel table's ``repr`` made once (the same table is every rank's window here: its
    text, 45 MB a snapshot at 1,024 ranks, would take the digest seconds a tick). By value still:
    the cache is keyed by the object, kept alive, and the text is its own dataclass ``repr``."""
    from flowtop.monitor.kernels.aggregate import KernelWindowStats
    from flowtop.monitor.kernels.merge import JobKernelStats

    for cls in (KernelWindowStats, JobKernelStats):
        if getattr(cls, "_bench_cached", False):
            continue
        made: dict[int, tuple[object, str]] = {}

        def cached(self: object, _orig: Any = cls.__repr__, _made: dict[int, tuple[object, str]] = made) -> str:
            hit = _made.get(id(self))
            if hit is None:
                hit = _made[id(self)] = (self, _orig(self))
            return hit[1]

        cls.__repr__ = cached  # type: ignore[method-assign]
        cls._bench_cached = True  # type: ignore[attr-defined]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, measure the ticks, and digest them (unless under callgrind)."""
    model, ticker, sim, jobs = build(args.ranks, args.spread, args.warmup, args.seed)
    if args.callgrind:  # valgrind --instr-atstart=no: instrument from here (the build runs ~5x faster)
        import subprocess

        subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=False,
                       stdout=subprocess.DEVNULL)
    h = hashlib.sha256()
    cpu: list[float] = []
    snap = None
    for k in range(args.ticks):
        sim.now = T0 + (args.warmup + 1 + k) * TICK_S
        events(sim, jobs, k)
        for job in jobs:
            sim.between(job, args.warmup + 1 + k)
        c = time.process_time()
        snap = next(itertools.starmap(ticker.catch_up, [(sim.now,)]))  # the callgrind toggle
        cpu.append(1e3 * (time.process_time() - c))
        if snap is None:
            raise SystemExit(f"no tick was due at {sim.now}")
        if args.digest and not args.callgrind:
            from flowtop.monitor.snapshot_json import to_json

            kernel_reprs_once()
            h.update(repr(snap).encode())
            h.update(json.dumps(to_json(snap, with_kernels=False), sort_keys=True, default=repr).encode())
    out: dict[str, Any] = {"ranks": args.ranks, "spread": args.spread, "ticks": args.ticks,
                           "tick_ms_mean": round(statistics.mean(cpu), 2), "tick_ms_max": round(max(cpu), 2),
                           "tick_ms": [round(c, 1) for c in cpu]}
    if args.digest and not args.callgrind and snap is not None:
        from prometheus_client.exposition import generate_latest
        from prometheus_client.registry import CollectorRegistry

        from flowtop.export.exporter import snapshot_families

        final = snap

        class _Snap:
            def collect(self) -> Any:
                return snapshot_families(final)

        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Snap())  # type: ignore[arg-type]
        h.update(generate_latest(reg))
        h.update(repr(list(model.notices.history)).encode())
        h.update(repr((sorted(model.rejected_reasons.items()), model.received, model.rejected)).encode())
        out["hints"] = dict(sorted(Counter(f"{j.job}:{x.id}" for j in snap.jobs for x in j.hints).items()))
        out["statuses"] = dict(sorted(Counter(f"{j.job}:{r.status}" for j in snap.jobs for r in j.ranks).items()))
        out["digest"] = h.hexdigest()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--spread", type=int, default=1, help="the model's tick spread (1, 2, 4, 8)")
    ap.add_argument("--ticks", type=int, default=8, help="ticks measured (a round of 8 by default)")
    ap.add_argument("--warmup", type=int, default=24, help="ticks before the measured ones")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digest", action="store_true", help="print a digest of every measured tick's output")
    ap.add_argument("--callgrind", action="store_true", help="under callgrind: no digest")
    args = ap.parse_args()
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
