"""Elastic restarts through the real model: does the rank view's order change only where a row is
history (flowtop.monitor.rankview.HISTORY_TIER), and nothing else a snapshot says?

Random jobs of 2-4 nodes (2-4 ranks each) under torchrun's rules, real wire frames, the monitor's
clock driven by hand: each run, a rank crashes (or a node is scancel'd, or the run ends done) and
the agents stop the rest with SIGTERM; the restart counts per node agent (the node whose worker
crashed restarts at incarnation + 1, the others at theirs), the rendezvous may hand the rank
numbers to other nodes or shrink the world by a node, and between runs the whole job or one node
may fall silent (stale) for a while. A tick every 0.5 s. Printed, each as a SHA-256 over every
tick:

* ``json``: the snapshot JSON (flowtop.monitor.snapshot_json.to_json);
* ``order``: every job's rank view (flowtop.monitor.rankview.build_view), worst first, flat and
  grouped, row keys in order, as the base orders them: on a checkout with JobSnapshot.claimed_at
  the job is viewed with it emptied (no row is history), i.e. the base's rule;

both must equal the base's. A checkout with the history rule also checks, at every tick, that its
own order is the base rule's with the history rows moved to the end in their ending order, and
prints how many job-ticks had history rows shown (each such tick is a change of order, by design).

Usage (from each checkout's root)::

    PYTHONHASHSEED=0 PYTHONPATH=. python bench/restart_order_equiv.py [--jobs 300] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import json
import random

from flowtop.monitor import rankview
from flowtop.monitor.rankview import ViewSpec, build_view
from flowtop.monitor.snapshot import JobSnapshot, ending_order
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey

CRASH = "error: ValueError: bad batch"


class Run:
    """One job's processes as the model hears them (frames stamped with the monitor's clock
    plus a per-node skew, received ``transit`` later)."""

    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.model = make_model()
        self.now = 1000.0
        self.seq: collections.Counter[RankKey] = collections.Counter()
        self.steps: dict[RankKey, int] = {}
        self.skew = {f"n{i}": rng.choice((0.0, 0.3, -0.2)) for i in range(4)}
        self.json = hashlib.sha256()
        self.order = hashlib.sha256()
        self.history_ticks = 0
        self.checked = 0

    def send(self, key: RankKey, kind: str, fields: dict[str, object], early: float = 0.0) -> None:
        sent = self.now - self.skew[key.host] - early - 0.01
        self.model.ingest(wire.decode(wire.encode(kind, key, self.seq[key], sent, fields)), self.now)
        self.seq[key] += 1

    def start(self, layout: dict[str, tuple[int, list[int]]], pid: int) -> list[RankKey]:
        keys = []
        for host, (inc, ranks) in layout.items():
            for r in ranks:
                key = RankKey(self.name, host, pid + len(keys), r, inc)
                self.send(key, "hello", {"local_rank": len(keys) % 4, "world_size": 16, "device": "cpu (test)",
                                         "probe_version": "test"})
                self.steps[key] = 0
                keys.append(key)
        return keys

    def tick(self, keys: list[RankKey], seconds: float) -> None:
        end = self.now + seconds
        while self.now < end:
            self.now += 0.5
            for key in keys:
                self.steps[key] += 1
                self.send(key, "step", {"step": self.steps[key], "wall_s": 0.5, "tokens": 64, "drops": 0})
            self.observe(self.model.tick(self.now))

    def bye(self, key: RankKey, reason: str, early: float = 0.0) -> None:
        self.send(key, "bye", {"reason": reason, "steps": self.steps[key], "drops": 0}, early)

    def observe(self, snap) -> None:  # type: ignore[no-untyped-def]
        self.json.update(json.dumps(to_json(snap), sort_keys=True, default=str).encode())
        for job in snap.jobs:
            base = dataclasses.replace(job, claimed_at={}) if hasattr(job, "claimed_at") else job
            for grouped in (False, True):
                keys = _keys(build_view(base, ViewSpec(grouped=grouped)))
                self.order.update(repr(keys).encode())
            if hasattr(job, "claimed_at"):
                self.check(job, base)

    def check(self, job: JobSnapshot, base: JobSnapshot) -> None:
        """The history rule's order: the base rule's, history rows moved to the end."""
        ctx = rankview.job_context_of(job)
        history = [r for r in job.ranks if ctx.history(r)]
        if history:
            self.history_ticks += 1
        old = [row.rank for row in build_view(base, ViewSpec(grouped=False)).rows]
        new = [row.rank for row in build_view(job, ViewSpec(grouped=False)).rows]
        ids = {id(r) for r in history}
        want = [r for r in old if id(r) not in ids] + sorted(history, key=lambda r: (ending_order(r), r.incarnation))
        kept = [r for r in new if id(r) not in ids]
        # a current rank's stop no longer follows a history crash: the current rows' order may differ
        # only when a history row failed (JobContext.first_failure_at)
        if [id(r) for r in new] != [id(r) for r in want] and not (
                any(r.status == "failed" for r in history) and len(kept) == len(old) - len(history)
                and [id(r) for r in new[len(kept):]] == [id(r) for r in want[len(kept):]]):
            said = [[(r.rank, r.status) for r in rows] for rows in (new, want)]
            raise SystemExit(f"{job.job}: order {said[0]} != {said[1]}")
        self.checked += 1


def _keys(view) -> list[object]:  # type: ignore[no-untyped-def]
    return [row.key for row in view.rows]


def one_job(name: str, rng: random.Random) -> Run:
    run = Run(name, rng)
    nodes = rng.randint(2, 4)
    per = rng.randint(2, 4)
    hosts = [f"n{i}" for i in range(nodes)]
    inc = dict.fromkeys(hosts, 0)
    pid = 100
    for _ in range(rng.randint(2, 4)):
        order = hosts[:]
        if rng.random() < 0.5:
            rng.shuffle(order)  # the rendezvous hands the rank numbers to other nodes
        layout = {h: (inc[h], list(range(i * per, (i + 1) * per))) for i, h in enumerate(order)}
        keys = run.start(layout, pid)
        pid += 100
        run.tick(keys, rng.choice((2.0, 5.0)))
        event = rng.random()
        if event < 0.6:  # a crash; its agent restarts at +1, the others stop
            crashed = rng.choice(keys)
            run.now += 0.1
            run.bye(crashed, CRASH)
            run.now += 0.1
            for k in keys:
                if k != crashed:
                    run.bye(k, "SIGTERM")
            inc[crashed.host] += 1
        elif event < 0.8:  # a node scancel'd: its byes first, its peers' errors after
            gone = rng.choice(hosts)
            run.now += 0.1
            for k in keys:
                if k.host == gone:
                    run.bye(k, "SIGTERM")
            run.now += 0.2
            for k in keys:
                if k.host != gone:
                    run.bye(k, CRASH)
            inc[gone] += 1
        else:  # all silent (a partition): stale, then the agents restart anyway
            pass
        run.tick([], rng.choice((1.0, 8.0)))
        if rng.random() < 0.3 and len(hosts) > 2:
            hosts.pop()  # elastic shrink
    run.tick(keys if rng.random() < 0.5 else [], 10.0)  # the last run steps on, or everything falls silent
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    js, order = hashlib.sha256(), hashlib.sha256()
    history = checked = 0
    for i in range(args.jobs):
        run = one_job(f"job{i}", rng)
        js.update(run.json.digest())
        order.update(run.order.digest())
        history += run.history_ticks
        checked += run.checked
    print(f"json {js.hexdigest()}")
    print(f"order {order.hexdigest()}")
    print(f"job-ticks checked {checked}, with history rows shown {history}")


if __name__ == "__main__":
    main()
