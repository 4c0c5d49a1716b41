"""The data thread's cost of one frame of each kind: decode and ingest alone, in instructions.

    python bench/frame_cost.py                 # µs per frame of each kind (CPU time; noisy on a shared box)
    python bench/frame_cost.py --callgrind     # instructions per frame of each kind: runs itself under
                                               # valgrind once per kind and reads callgrind's totals
    valgrind --tool=callgrind --toggle-collect=starmap_next python bench/frame_cost.py --kind steps200 --count
                                               # one kind by hand (what --callgrind runs; prints the frames)

A monitor (``flowtop.monitor.wiring.make_model``, a ``Collector``'s byte budget as the decode's
admit, kernel windows handed to a no-op as to the worker process live) hears ``--ranks`` ranks
(256) of one job: a hello and a FLOP count each, then a few frames of the kind measured (warm-up:
the first frames of a rank cost more). Then ``--rounds`` rounds (4) of one pre-encoded frame a rank
of that kind go through ``probe.wire`` decode (``flowtop.monitor.rankkernels.decode_frame``, the
collector's) and ``Model.ingest``, inside ``itertools.starmap`` (callgrind's toggle,
``starmap_next``): nothing else is counted (no socket, no batch, no tick). The kinds:

* ``steps1``, ``steps45``, ``steps200``: a ``stepcols`` frame of 1, 45 or 200 consecutive 10 ms
  step records (every column a rank sends: wait, lead, probe time; 200 is a rank's frame at the
  2 s pace, 45 at 0.45 s), each frame continuing where the rank's last one ended;
* ``telemetry``: a telemetry frame whose power, utilization, memory and CPU figures change every
  frame (its maps are compared with the rank's last ones: unchanged maps cost less);
* ``hello``: the steady hello (its step and that step's age change each time);
* ``flops``: the FLOP count, re-sent unchanged.

Frames are made in virtual time (a rank's frame each ``n`` × 10 ms of its steps) from the recorded
H200 rank's templates (bench/ingest.py), so counts repeat exactly run to run and between checkouts:
compare a branch with its base by running this file from each checkout's root (the working
directory's ``flowtop`` and ``probe`` are imported). Counts move by ~0.5 % run to run (string
hashes are randomized: dict probes differ).

``--callgrind``, instructions a frame, 2026-12-07 (d77ef80 → framecost branch): steps1 85,543 →
84,473; steps45 130,514 → 128,878; steps200 210,524 → 172,240; telemetry 184,775 → 184,226; hello
70,384 → 70,001; flops 197,584 → 198,388 (the last three unchanged by it: noise).
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.getcwd())  # the code version under test: the working directory's
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

import ingest as B  # noqa: E402  (bench/ingest.py: the recorded rank's templates, the column maker)

sys.path.insert(0, os.getcwd())  # again: ingest put its own checkout first (no flowtop imported yet)

KINDS = ("steps1", "steps45", "steps200", "telemetry", "hello", "flops")
STEP_S = 0.01
WALL0 = 1.8e9  # the ranks' wall clock at virtual time 0
MONO0 = 1000.0  # the monitor's clock at virtual time 0
WARM = 3  # frames of the measured kind a rank sends before the measured ones


class Ranks:
    """The ranks' frames in virtual time: each rank's sequence number, last step and clock."""

    def __init__(self, ranks: int) -> None:
        import random

        from probe import wire

        self.wire = wire
        self.tpl = B._templates()
        self.rng = random.Random(0)
        self.columns = B._Columns(STEP_S, self.rng)
        self.keys = [wire.RankKey(B.JOB, f"node{r // 8:04d}", 10_000 + r, r, 0) for r in range(ranks)]
        self.seq = [0] * ranks
        self.last = [0] * ranks
        self.t = 0.0  # virtual seconds

    def frame(self, i: int, kind: str) -> bytes:
        """Rank ``i``'s next frame of ``kind`` (a measured kind, or hello0/flops0 to start)."""
        wire, tpl, rng = self.wire, self.tpl, self.rng
        if kind.startswith("steps"):
            n = int(kind[5:])
            a, b = self.last[i] + 1, self.last[i] + n
            self.last[i] = b
            fields = {**self.columns.fields(a, b), "_sent": WALL0 + self.t}
            sent_kind, at = "stepcols", WALL0 + a * STEP_S
        elif kind == "telemetry":
            gpu = {**tpl["telemetry"]["gpu"], "power_w": 500.0 + 100 * rng.random(),
                   "gpu_util": float(rng.randrange(90, 101)), "mem_used": 1_780_350_976 + rng.randrange(1 << 20)}
            proc = {**tpl["telemetry"]["proc"], "proc_cpu_pct": 90 + 10 * rng.random(),
                    "rss_bytes": 1_140_535_296 + rng.randrange(1 << 20)}
            sent_kind, at, fields = kind, WALL0 + self.t, {**tpl["telemetry"], "gpu": gpu, "proc": proc}
        elif kind.startswith("hello"):
            fields = {**tpl["hello"], "world_size": len(self.keys), "local_rank": i % 8, "argv": ["train.py"]}
            if self.last[i]:
                fields.update(last_step=self.last[i], step_age_s=round(0.5 * rng.random(), 3))
            sent_kind, at = "hello", WALL0 + self.t
        else:
            sent_kind, at, fields = "flops", WALL0 + self.t, {**tpl["flops"], "step": max(1, self.last[i])}
        out = wire.encode(sent_kind, self.keys[i], self.seq[i], at, fields)
        self.seq[i] += 1
        return out

    def round(self, kind: str) -> list[tuple[bytes, float]]:
        """One frame of every rank, and the monitor time each arrives at."""
        dt = int(kind[5:]) * STEP_S if kind.startswith("steps") else 1.0
        out = []
        for i in range(len(self.keys)):
            self.t += dt / len(self.keys)
            out.append((self.frame(i, kind), MONO0 + self.t))
        return out


def monitor(ranks: Ranks) -> tuple[Callable[[bytes, float], None], Any]:
    """The model, and the collector's decode and ingest of one frame (what --direct of
    bench/frame_path.py runs): ``apply(frame, at)``."""
    from flowtop.monitor import collector as C
    from flowtop.monitor.clock import MonitorClock
    from flowtop.monitor.rankkernels import decode_frame
    from flowtop.monitor.wiring import make_model

    model = make_model()
    model.offload_kernels(lambda key, window: None)  # the worker process's queue, live
    col = C.Collector(model, clock=MonitorClock(raw=lambda: MONO0 + ranks.t))
    ingest, budget, builds, knows = model.ingest, col._kernel_budget, model.builds_kernels, model.knows

    def apply(frame: bytes, at: float) -> None:
        col._frame_at = at
        ingest(decode_frame(frame, builds, knows, budget), at, "sim-0")

    return apply, model


def run_kind(kind: str, n_ranks: int, rounds: int) -> dict[str, Any]:
    ranks = Ranks(n_ranks)
    apply, model = monitor(ranks)
    for start in ("hello0", "flops0"):
        for frame, at in ranks.round(start):
            apply(frame, at)
    for _ in range(WARM):
        for frame, at in ranks.round(kind):
            apply(frame, at)
    todo = [fa for _ in range(rounds) for fa in ranks.round(kind)]
    gc.collect()
    gc.freeze()  # as the monitor's ticks leave it (gcpolicy.after_tick)
    rejected = model.rejected
    c0 = time.thread_time()
    collections.deque(itertools.starmap(apply, todo), maxlen=0)  # callgrind counts inside starmap only
    cpu = time.thread_time() - c0
    if model.rejected != rejected:
        raise SystemExit(f"{kind}: {model.rejected - rejected} frames refused: {dict(model.rejected_reasons)}")
    return {"kind": kind, "frames": len(todo), "bytes": sum(len(f) for f, _ in todo) // len(todo),
            "us_per_frame": round(1e6 * cpu / len(todo), 2)}


def callgrind(kind: str, n_ranks: int, rounds: int) -> dict[str, Any]:
    """Instructions per frame of ``kind``: this file under callgrind, collecting inside starmap."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                               "--toggle-collect=starmap_next", sys.executable, os.path.abspath(__file__),
                               "--kind", kind, "--ranks", str(n_ranks), "--rounds", str(rounds), "--count"],
                              capture_output=True, text=True, check=True)
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        with open(out) as f:
            total = int(re.search(r"^totals: (\d+)", f.read(), re.M).group(1))  # type: ignore[union-attr]
    return {**got, "total_ir": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--kind", action="append", choices=KINDS, help="the kinds measured (default: all)")
    ap.add_argument("--callgrind", action="store_true", help="instructions per frame (runs valgrind)")
    ap.add_argument("--count", action="store_true", help="(under callgrind) print the frames only")
    args = ap.parse_args()
    kinds = args.kind or list(KINDS)
    if args.callgrind:
        for kind in kinds:
            # two runs that differ in their measured rounds only: the difference is the rounds'
            # own (a first round's one-off costs, the toggle's own, count in both)
            one = callgrind(kind, args.ranks, 1)
            more = callgrind(kind, args.ranks, args.rounds + 1)
            frames = more["frames"] - one["frames"]
            print(json.dumps({"kind": kind, "frames": frames, "bytes": more["bytes"],
                              "ir_per_frame": round((more["total_ir"] - one["total_ir"]) / frames)}), flush=True)
        return 0
    for kind in kinds:
        got = run_kind(kind, args.ranks, args.rounds)
        if args.count:
            got.pop("us_per_frame")
        print(json.dumps(got), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
