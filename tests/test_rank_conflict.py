"""Two processes claiming one (job, rank): a conflict, shown as two rows, never merged.

Real probe publishers (ZeroMQ, the probe's sender thread) into a real collector, model and hint
engine. A launcher that sets no RANK (Lightning's DDP launcher, mp.spawn with
init_process_group(rank=...)) makes every process say "rank 0" unless the probe reads the
process group; the monitor must then neither halve the job's throughput nor stay silent.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

from flowtop.monitor.model import Model
from flowtop.monitor.snapshot import Claimant, JobSnapshot, MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from monitor_thread import MonitorThread
from probe.transport.publisher import Publisher
from probe.wire import RankKey, decode, encode
from snapshot_schema import assert_valid_snapshot

WALL_S, TOKENS = 0.05, 256  # per step, as the probe reports them: tokens/s = 5120 per process
MODEL_FLOPS = 1e9  # per counted step of TOKENS tokens


def _publisher(addr: str, key: RankKey, world: int = 2) -> Publisher:
    """A started probe publisher of ``key`` that a monitor at ``addr`` subscribed to."""
    pub = Publisher(key, addr)
    pub.hello_fields = {"local_rank": 0, "world_size": world, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    deadline = time.monotonic() + 10
    while pub.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pub.subscribers, "the monitor never subscribed"
    return pub


def _steps(pub: Publisher, first: int, last: int) -> None:
    for step in range(first, last + 1):
        pub.publish("step", {"step": step, "wall_s": WALL_S, "tokens": TOKENS, "drops": 0})


def _flops(pub: Publisher) -> None:
    pub.publish("flops", {"step": 2, "model_flops": MODEL_FLOPS, "executed_flops": MODEL_FLOPS,
                          "attention": "full", "dtype": "fp32", "peak_flops": 1e12, "peak_source": "test",
                          "uncounted": {}, "tokens": TOKENS})


def _job(snap: MonitorSnapshot, name: str) -> JobSnapshot | None:
    return next((j for j in snap.jobs if j.job == name), None)


@pytest.fixture
def pubs() -> Iterator[list[Publisher]]:
    made: list[Publisher] = []
    yield made
    for p in made:
        p.close()


def test_two_pids_claiming_rank_0_are_two_rows_a_critical_hint_and_summed_work(
        monitor: MonitorThread, pubs: list[Publisher]) -> None:
    a = RankKey("lightning", "node-a", 1001, 0, 0)
    b = RankKey("lightning", "node-b", 2002, 0, 0)
    pubs += [_publisher(monitor.listen, a), _publisher(monitor.listen, b)]
    for p in pubs:
        _flops(p)
        _steps(p, 1, 12)

    def both_stepped(s: MonitorSnapshot) -> bool:
        j = _job(s, "lightning")
        return j is not None and len(j.ranks) == 2 and all(r.step == 12 for r in j.ranks) and bool(j.hints)

    snap = monitor.wait_for(both_stepped, 20)
    job = _job(snap, "lightning")
    assert job is not None and len(job.ranks) == 2, job
    rows = {(r.host, r.pid): r for r in job.ranks}
    assert set(rows) == {("node-a", 1001), ("node-b", 2002)}
    assert rows["node-a", 1001].conflict == (Claimant("node-b", 2002),)
    assert rows["node-b", 2002].conflict == (Claimant("node-a", 1001),)
    assert job.rank_conflicts == 1 and job.ranks_seen == 1 and job.world_size == 2
    # Both processes' work counts: 2 × 256 tokens / 0.05 s, not one of them.
    assert all(r.tokens_per_s == pytest.approx(TOKENS / WALL_S) for r in job.ranks)
    assert job.tokens_per_s == pytest.approx(2 * TOKENS / WALL_S)
    assert job.flops is not None
    assert job.flops.flops_per_s == pytest.approx(2 * MODEL_FLOPS / TOKENS * TOKENS / WALL_S)
    (hint,) = [h for h in job.hints if h.id == "rank_conflict"]
    assert (hint.severity, hint.scope, hint.target, hint.ended) == ("critical", "rank", "rank 0", False)
    assert hint.summary == ("2 processes claim rank 0 of job lightning (node-a pid 1001, node-b pid 2002): "
                            "shown as separate rows, each counted in the job's totals")
    assert "set no RANK" in hint.action and "pass rank=" in hint.action
    assert hint.evidence["pids"] == [1001, 2002] and hint.evidence["hosts"] == ["node-a", "node-b"]
    assert_valid_snapshot(to_json(snap))

    # Both finish: the rows stay apart (the final snapshot must not merge them back) and the
    # hint stays, ended.
    for p in pubs:
        p.publish("bye", {"reason": "exit", "steps": 12, "drops": 0})
    # The hints end at the first tick that sees the job done (snapshots read the last tick's).
    snap = monitor.wait_for(lambda s: (j := _job(s, "lightning")) is not None and j.status == "done"
                            and all(h.ended for h in j.hints), 10)
    job = _job(snap, "lightning")
    assert job is not None and job.status == "done" and len(job.ranks) == 2 and job.rank_conflicts == 1
    assert job.tokens_per_s == pytest.approx(2 * TOKENS / WALL_S)
    (hint,) = [h for h in job.hints if h.id == "rank_conflict"]
    assert hint.ended and hint.last_step == 12
    data = to_json(snap)
    assert_valid_snapshot(data)
    (j,) = [j for j in data["jobs"] if j["job"] == "lightning"]
    assert j["rank_conflicts"] == 1 and sorted(r["pid"] for r in j["ranks"]) == [1001, 2002]


def test_a_provisional_rank_0_that_ends_before_its_first_step_is_no_conflict(
        monitor: MonitorThread, pubs: list[Publisher]) -> None:
    """The probe's own fix: a process first says rank 0, then reads rank 1 from the process group
    and says bye under the provisional key before its first step."""
    real0 = _publisher(monitor.listen, RankKey("spawn", "h", 10, 0, 0))
    provisional = _publisher(monitor.listen, RankKey("spawn", "h", 11, 0, 0))
    pubs += [real0, provisional]
    _steps(real0, 1, 3)
    monitor.wait_for(lambda s: (j := _job(s, "spawn")) is not None and len(j.ranks) == 2, 10)
    provisional.publish("bye", {"reason": "re-identified as rank 1", "steps": 0, "drops": 0})
    rank1 = _publisher(monitor.listen, RankKey("spawn", "h", 11, 1, 0))
    pubs.append(rank1)
    _steps(real0, 4, 12)
    _steps(rank1, 1, 12)
    snap = monitor.wait_for(lambda s: (j := _job(s, "spawn")) is not None
                            and sorted((r.rank, r.step) for r in j.ranks) == [(0, 12), (1, 12)], 20)
    job = _job(snap, "spawn")
    assert job is not None
    assert sorted((r.rank, r.pid) for r in job.ranks) == [(0, 10), (1, 11)]
    assert job.rank_conflicts == 0 and all(r.conflict == () for r in job.ranks)
    assert not [h for h in job.hints if h.id == "rank_conflict"]
    assert job.tokens_per_s == pytest.approx(2 * TOKENS / WALL_S)


def test_snapshot_until_done_ends_on_a_conflict_and_prints_both_rows(pubs: list[Publisher]) -> None:
    """`flowtop snapshot --until-done --json`: world size 2, both processes say rank 0. The job
    has two rows when both are done, so the collection ends then (not at the timeout)."""
    import json
    import subprocess
    import sys

    from flowtop.tools.demo.launch import free_port_pair

    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    t0 = time.monotonic()
    cli = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", addr, "--until-done",
                            "--timeout", "60", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for pid in (31, 32):
            pubs.append(_publisher(addr, RankKey("cli", "h", pid, 0, 0)))
        for p in pubs:
            _steps(p, 1, 12)
        time.sleep(1.0)  # both seen running together (the monitor polls at 10 Hz)
        for p in pubs:
            p.publish("bye", {"reason": "exit", "steps": 12, "drops": 0})
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)
    assert cli.returncode == 0, err
    assert time.monotonic() - t0 < 45  # ended when both were done, not at the 60 s timeout
    data = json.loads(out)
    assert_valid_snapshot(data)
    (job,) = data["jobs"]
    assert job["status"] == "done" and job["rank_conflicts"] == 1 and job["world_size"] == 2
    assert sorted((r["pid"], [c["pid"] for c in r["conflict"]]) for r in job["ranks"]) == [(31, [32]), (32, [31])]
    assert job["tokens_per_s"] == pytest.approx(2 * TOKENS / WALL_S)
    (hint,) = [h for h in job["hints"] if h["id"] == "rank_conflict"]
    assert hint["ended"] and hint["severity"] == "critical" and hint["last_step"] == 12


class _Feeder:
    """Validated wire messages into a model (encode → decode, as the collector does)."""

    def __init__(self, model: Model) -> None:
        self.model, self.seq = model, {}  # type: ignore[var-annotated]

    def send(self, key: RankKey, kind: str, now: float, **fields: Any) -> None:
        seq = self.seq[key] = self.seq.get(key, -1) + 1
        self.model.ingest(decode(encode(kind, key, seq, 1.0, fields)), now)

    def run(self, key: RankKey, t0: float, steps: int, bye: bool = True) -> float:
        self.send(key, "hello", t0, local_rank=0, world_size=1, device="cpu (test)", probe_version="t")
        t = t0
        for step in range(1, steps + 1):
            t = t0 + step * WALL_S
            self.send(key, "step", t, step=step, wall_s=WALL_S, tokens=TOKENS, drops=0)
        if bye:
            self.send(key, "bye", t, reason="exit", steps=steps, drops=0)
        return t


def test_one_after_the_other_and_restarts_are_no_conflict() -> None:
    model = make_model()
    f = _Feeder(model)
    # The same job id and rank run twice, one after the other (a rerun): one row, the newest.
    t = f.run(RankKey("rerun", "h", 1, 0, 0), 0.0, 10)
    f.run(RankKey("rerun", "h", 2, 0, 0), t + 1.0, 10, bye=False)
    # A restart (incarnation 1) while the old incarnation still talks: the newest, no conflict.
    f.run(RankKey("elastic", "h", 3, 0, 0), 0.0, 10, bye=False)
    f.run(RankKey("elastic", "h", 4, 0, 1), 0.1, 10, bye=False)
    snap = model.snapshot(t + 1.2)
    rerun, elastic = _job(snap, "rerun"), _job(snap, "elastic")
    assert rerun is not None and [r.pid for r in rerun.ranks] == [2]
    assert elastic is not None and [(r.pid, r.incarnation) for r in elastic.ranks] == [(4, 1)]
    assert rerun.rank_conflicts == elastic.rank_conflicts == 0 and not rerun.hints and not elastic.hints


def test_a_conflict_stays_while_one_claimant_goes_stale_and_goes_with_its_job() -> None:
    model = make_model()
    f = _Feeder(model)
    a, b = RankKey("j", "h", 1, 0, 0), RankKey("j", "h", 2, 0, 0)
    f.run(a, 0.0, 10, bye=False)
    t = f.run(b, 0.0, 10, bye=False)
    assert len(model.tick(t).jobs[0].ranks) == 2 and len(model._claims) == 1  # ticks remember conflicts
    # Only one of them goes on; the other falls silent (stale) after its steps: still two rows.
    for step in range(11, 200):
        f.send(a, "step", t + (step - 10) * WALL_S, step=step, wall_s=WALL_S, tokens=TOKENS, drops=0)
    snap = model.tick(t + 190 * WALL_S)
    statuses = sorted((r.pid, r.status) for r in snap.jobs[0].ranks)
    assert statuses == [(1, "live"), (2, "stale")] and snap.jobs[0].rank_conflicts == 1
    # The stale one adds 0 tokens/s (README: stale ranks report 0), the live one its own.
    assert snap.jobs[0].tokens_per_s == pytest.approx(TOKENS / WALL_S)
    model.tick(t + 10_000.0)  # both silent past the eviction limit: the job is dropped
    assert not model.ranks and len(model._claims) == 0


def test_a_claimant_arriving_after_steady_ticks_splits_the_cached_rows_and_they_join_again() -> None:
    # Ticks of ranks that each have one process reuse one set of rows (flowtop.monitor.claims.SoleRows):
    # a second process claiming rank 1 must still become a conflict at the next tick, and the
    # rows must follow when a rank comes or goes.
    model = make_model()
    f = _Feeder(model)
    r0, r1, twin = RankKey("j", "h", 1, 0, 0), RankKey("j", "h", 2, 1, 0), RankKey("j", "h", 3, 1, 0)
    f.run(r0, 0.0, 10, bye=False)
    t = f.run(r1, 0.0, 10, bye=False)
    first, second = model.tick(t), model.tick(t + 0.5)
    assert [(r.rank, r.pid) for r in second.jobs[0].ranks] == [(0, 1), (1, 2)]
    assert model._view(None, t, remember=False) is model._view(None, t, remember=False)  # cached rows
    assert first.jobs[0].rank_conflicts == 0
    t2 = f.run(twin, t, 5, bye=False)
    snap = model.tick(t2)
    assert [(r.rank, r.pid, [c.pid for c in r.conflict]) for r in snap.jobs[0].ranks] == [
        (0, 1, []), (1, 2, [3]), (1, 3, [2])]
    assert snap.jobs[0].rank_conflicts == 1 and len(model._claims) == 1
    # A third rank joins: its row appears (the cached rows are rebuilt when a key comes).
    f.run(RankKey("j", "h", 4, 2, 0), t2, 3, bye=False)
    assert [r.rank for r in model.tick(t2 + 0.2).jobs[0].ranks] == [0, 1, 1, 2]
