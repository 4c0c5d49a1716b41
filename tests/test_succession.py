"""Which run of a job the monitor shows when its processes come and go (flowtop.monitor.claims.superseded).

A soak trial kept one monitor up while jobs crashed, were relaunched under the same id (torchrun's
restart count starts at 0 again), shrank (elastic) and restarted as plain processes: the previous
launch's highest incarnation hid the live run for good (the job read failed, then stale with
hang_all, while its ranks stepped), a shrink left the old world's ranks as stale rows with hang
hints and its world size, and a restart within seconds became a conflict. The real model, real
wire frames, a monitor clock driven by hand: each rank steps every 0.5 s, a tick every 0.5 s.
"""

from __future__ import annotations

import collections

from flowtop.monitor.model import Model
from flowtop.monitor.snapshot import JobSnapshot
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey


class Job:
    """A job's processes as the model hears them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model: Model = make_model()
        self.now = 1000.0
        self.seq: collections.Counter[RankKey] = collections.Counter()
        self.steps: dict[RankKey, int] = {}

    def send(self, key: RankKey, kind: str, fields: dict) -> None:
        self.model.ingest(wire.decode(wire.encode(kind, key, self.seq[key], self.now, fields)), self.now)
        self.seq[key] += 1

    def start(self, ranks: range, inc: int, pid0: int) -> list[RankKey]:
        keys = [RankKey(self.name, "h0", pid0 + r, r, inc) for r in ranks]
        for key in keys:
            self.send(key, "hello", {"local_rank": key.rank, "world_size": len(ranks), "device": "cpu (test)",
                                     "probe_version": "test"})
            self.steps[key] = 0
        return keys

    def run(self, keys: list[RankKey], seconds: float, every: float = 0.5) -> JobSnapshot:
        """Step ``keys`` and tick every ``every`` s for ``seconds`` (the clock first moves ``every``)."""
        end = self.now + seconds
        snap = None
        while self.now < end:
            self.now += every
            for key in keys:
                self.steps[key] += 1
                self.send(key, "step", {"step": self.steps[key], "wall_s": 0.5, "tokens": 64, "drops": 0})
            snap = self.model.tick(self.now)
        assert snap is not None
        return next(j for j in snap.jobs if j.job == self.name)


def shown(job: JobSnapshot) -> list[tuple[int, int, int, str]]:
    return [(r.rank, r.incarnation, r.pid, r.status) for r in job.ranks]


def test_a_job_relaunched_under_its_id_shows_its_new_run_though_its_restarts_count_from_0() -> None:
    job = Job("rq")
    old = job.start(range(4), inc=2, pid0=100)
    job.run(old, 10)
    new = job.start(range(4), inc=0, pid0=200)  # the old launcher's processes are gone (SIGKILL)
    snap = job.run(new, 10)
    assert shown(snap) == [(r, 0, 200 + r, "live") for r in range(4)]
    assert snap.status == "running" and snap.step == job.steps[new[0]]
    snap = job.run(new, 700, every=4)  # past EVICT_AFTER_S: the old run's processes are forgotten
    assert shown(snap) == [(r, 0, 200 + r, "live") for r in range(4)] and not snap.hints
    assert sorted(k.pid for k in job.model.ranks) == [200, 201, 202, 203]


def test_an_elastic_shrink_leaves_no_ghost_rows() -> None:
    job = Job("el")
    job.run(job.start(range(8), inc=0, pid0=100), 10)
    new = job.start(range(4), inc=1, pid0=200)
    snap = job.run(new, 10)
    assert shown(snap) == [(r, 1, 200 + r, "live") for r in range(4)]
    assert snap.world_size == 4 and not [h for h in snap.hints if h.id.startswith("hang")]
    job.run(new, 700, every=4)
    assert len(job.model.ranks) == 4


def test_a_restart_within_seconds_is_no_conflict_and_the_restarts_are_forgotten() -> None:
    """``flowtop run --job X -- python train.py`` again 1 s after a SIGKILL: the same incarnation,
    a new pid, while the old process would read live for a few seconds more."""
    job = Job("plain")
    pid = 100
    keys = job.start(range(1), inc=0, pid0=pid)
    for _ in range(12):
        job.run(keys, 60, every=4)
        job.now += 1.0
        pid += 1
        keys = job.start(range(1), inc=0, pid0=pid)
        snap = job.run(keys, 2)
        assert shown(snap) == [(0, 0, pid, "live")] and not snap.ranks[0].conflict, shown(snap)
        assert not [h for h in snap.hints if h.id == "rank_conflict"]
    # every process silent for EVICT_AFTER_S (600 s) is forgotten: 60 s runs, so about ten remain
    assert len(job.model.ranks) <= 11


def test_two_processes_claiming_one_rank_at_once_are_still_a_conflict() -> None:
    job = Job("twice")
    a = job.start(range(1), inc=0, pid0=100)
    b = job.start(range(1), inc=0, pid0=200)
    snap = job.run(a + b, 10)
    assert [(r.pid, len(r.conflict)) for r in snap.ranks] == [(100, 1), (200, 1)]


def test_a_closed_relay_is_forgotten_though_no_relay_reports_any_more() -> None:
    """Relays silent or closed for FORGET_AFTER_S with no ranks were forgotten only when another
    relay reported: after the last one closed, 11 stayed in the snapshot and the metrics for good."""
    from flowtop.monitor.relays import FORGET_AFTER_S

    model = make_model()
    report = wire.encode("relay", RankKey("", "node-r", 3, 0, 0), 0, 1.0, {
        "relay": "node-r:3:0000000a", "listen": "ipc:///tmp/x.sock", "upstream": "tcp://login:5759", "ranks": 0,
        "frames_in": 4, "frames_out": 4, "bytes_in": 400, "bytes_out": 400, "drops": 0, "queued": 0,
        "commands": 0, "link_ups": 1, "uptime_s": 3.0, "hosted_by": "flowtop relay", "closing": True})  # fmt: skip
    model.ingest(wire.decode(report), 1000.0)
    assert [r.relay for r in model.tick(1000.5).relays] == ["node-r:3:0000000a"]
    assert model.tick(1000.0 + FORGET_AFTER_S + 11).relays == ()
