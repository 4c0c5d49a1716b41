"""Ranks unheard behind a silent node relay (a relay host killed while its ranks train on): the
job's figures are over the heard ranks, exactly; the unheard rank has no rates (not 0), no lag and
says why; the relay_silent hint names the relay and clears when it is heard again; a job whose
heard ranks all said bye ends, and --until-done's test (all_done) takes it. Real wire frames and
relay stamps (Relays.unstamp, as the collector applies a batch) into one Model, its own clock."""

from __future__ import annotations

from typing import Any

import pytest

from flowtop.export.exporter import ExportPolicy, exported_jobs, snapshot_families
from flowtop.export.textreport import render
from flowtop.monitor.rankstats import NO_VALUE, job_percentiles, map_layout, rank_grid
from flowtop.monitor.rankview import job_context, node_group
from flowtop.monitor.relays import SILENT_AFTER_S, encode_stamp
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, all_done
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from flowtop.tui.widgets.job_header import JobHeader
from probe import wire
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot

T = 1e12
#: 1e9 model FLOPs per counted step of 256 tokens on a 1e12 FLOP/s peak.
FLOPS = {"step": 1, "model_flops": 1e9, "executed_flops": 1.2e9, "attention": "full", "dtype": "bf16",
         "peak_flops": 1 * T, "peak_source": "test", "uncounted": {}, "tokens": 256}
RELAY = "node-b:7:1"
KEYS = [RankKey("j", "node-a" if r < 3 else "node-b", 100 + r, r, 0) for r in range(4)]
#: Step wall time per rank: ranks 0, 1 and 3 at 0.05 s, rank 2 at 0.1 s (one step every other tick).
WALL = {0: 0.05, 1: 0.05, 2: 0.1, 3: 0.05}


class _Job:
    """Ranks 0-2 heard directly; rank 3 through the relay on node-b (until it is killed)."""

    def __init__(self, keys: list[RankKey] | None = None, wall: dict[int, float] | None = None,
                 direct: int = 3) -> None:
        self.model = make_model()
        self.now = 10.0
        keys = KEYS if keys is None else keys
        self.keys, self.wall, self.direct = keys, dict(WALL if wall is None else wall), direct  # below direct: no relay
        self.seq = {k: 0 for k in keys}
        self.steps = {k: 0 for k in keys}
        self.relayed = True  # rank 3's relay alive: its frames arrive
        for k in keys:
            self.send(k, "hello", {"local_rank": k.rank % 3, "world_size": len(keys), "device": "cpu (test)",
                                   "probe_version": "test"})
            self.send(k, "flops", FLOPS)

    def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
        self.seq[key] += 1
        frame = wire.encode(kind, key, self.seq[key], self.now, fields)
        if key.rank < self.direct:
            self.model.ingest(wire.decode(frame), self.now)
        elif self.relayed:  # as the collector applies a relay's batch of one frame
            via, (at,) = self.model.relays.unstamp([encode_stamp(RELAY, self.now + 900.0, [0]), frame], self.now)
            self.model.ingest(wire.decode(frame), at, via=via)

    def run(self, seconds: float) -> MonitorSnapshot:
        """Every rank trains on (rank 3 too: only its relay is gone), 0.05 s a round; a tick each 0.5 s."""
        snap = None
        end = self.now + seconds
        n = 0
        while self.now < end - 1e-9:
            self.now += 0.05
            n += 1
            for k in self.keys:
                if n % round(self.wall[k.rank] / 0.05) == 0:
                    self.steps[k] += 1
                    self.send(k, "step", {"step": self.steps[k], "wall_s": self.wall[k.rank], "tokens": 256, "drops": 0})
            if n % 10 == 0:
                snap = self.model.tick(self.now)
        assert snap is not None
        return snap


def _job(snap: MonitorSnapshot) -> JobSnapshot:
    (job,) = snap.jobs
    return job


def _metric(snap: MonitorSnapshot, name: str) -> float:
    (value,) = [s.value for m in snapshot_families(snap) for s in m.samples if s.name == name]
    return value


def _exported_states(snap: MonitorSnapshot) -> dict[int, str]:
    """Each rank's state that flowtop_rank_status sets to 1."""
    return {int(s.labels["rank"]): s.labels["flowtop_rank_status"] for m in snapshot_families(snap)
            for s in m.samples if s.name == "flowtop_rank_status" and s.value == 1}


def _job_ranks(snap: MonitorSnapshot) -> dict[str, float]:
    return {s.labels["status"]: s.value for m in snapshot_families(snap) for s in m.samples
            if s.name == "flowtop_job_ranks"}


def test_a_silent_relays_rank_is_left_out_of_the_jobs_figures_and_named() -> None:
    j = _Job()
    snap = j.run(6.0)
    job = _job(snap)
    assert job.status == "running" and not job.unheard and job.over_phrase == ""
    # By hand: 1e9 FLOPs / 256 tokens x tokens/s. Ranks 0, 1, 3: 256 / 0.05 = 5,120 tokens/s,
    # 2e10 FLOP/s; rank 2: 2,560 tokens/s, 1e10 FLOP/s. All four: 7e10 of 4e12 (1.75 %), 17,920 tokens/s.
    assert job.tokens_per_s == pytest.approx(17_920, rel=1e-6)
    assert job.flops is not None and job.flops.flops_per_s == pytest.approx(7e10, rel=1e-6)
    assert job.flops.mfu == pytest.approx(0.0175, rel=1e-6) and job.flops.mfu_reason == ""

    j.relayed = False  # node-b's relay host killed: rank 3 trains on, unheard
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    r3 = job.ranks[3]
    assert job.status == "running" and r3.status == "stale" and r3.cut is not None
    # Its own row: no rate (None, not 0 as a stop would read), its step and counts as last heard.
    assert r3.flops is not None and r3.flops.flops_per_s is None and r3.flops.mfu is None and r3.mfu is None
    assert r3.tokens_per_s is None and r3.flops.model_flops_per_step == 1e9
    assert r3.flops.reason_at(snap.taken_at) == "unheard behind relay node-b (silent)"
    # The job over its three heard ranks: 5e10 FLOP/s of 3e12 (1.667 %), 12,800 tokens/s; not
    # 5e10 of 4e12 (1.25 %) as a rank counted at 0 read.
    assert [len(job.unheard), len(job.ranks)] == [1, 4]
    assert job.over_phrase == "over 3 of 4 ranks; 1 unheard behind relay node-b"
    assert job.tokens_per_s == pytest.approx(12_800, rel=1e-6)
    assert job.flops is not None and job.flops.flops_per_s == pytest.approx(5e10, rel=1e-6)
    assert job.flops.peak_flops == pytest.approx(3 * T) and job.flops.mfu == pytest.approx(5e10 / 3e12, rel=1e-6)
    assert job.flops.mfu_reason == job.over_phrase
    # Percentiles and lag over the heard ranks; the unheard rank's lag is unknown.
    assert job_percentiles(job).ranks == 3
    ctx = job_context(job.ranks)
    assert ctx.lag(r3) is None and ctx.lead_step == max(r.step for r in job.ranks[:3])
    # The map's step-time cell of the unheard rank has no value (not "the slowest there is").
    assert rank_grid(job, "step_time", map_layout(4, 80, 10)).bins[3] == NO_VALUE
    # No hint takes the unheard rank for a straggler or a hang: it is not behind, only unheard.
    assert not [h for h in job.hints if h.target == "rank 3"]
    # The hint names the relay, since when and its rank.
    (hint,) = [h for h in job.hints if h.id == "relay_silent"]
    silent_s = snap.taken_at - r3.cut.silent_since if r3.cut.silent_since is not None else None
    assert hint.severity == "warning" and hint.evidence["unheard_ranks"] == 1 and hint.evidence["heard_ranks"] == 3
    assert hint.evidence["stepping_ranks"] == 3
    assert hint.evidence["hosts"] == ["node-b"] and hint.evidence_at(snap.taken_at)["silent_s"] == pytest.approx(silent_s)
    assert hint.summary_at(snap.taken_at).startswith(f"1 rank unheard behind relay node-b (rank 3), silent for "
                                                     f"{silent_s:.0f} s, while the other 3 step on")
    # Said everywhere the figures are: JSON, text report, TUI header, Prometheus.
    data = to_json(snap)
    assert_valid_snapshot(data)
    jj = data["jobs"][0]
    assert jj["unheard_ranks"] == 1 and jj["unheard_relays"] == ["node-b"] and jj["mfu_reason"] == job.over_phrase
    assert jj["ranks"][3]["mfu"] is None and jj["ranks"][3]["mfu_reason"] == "unheard behind relay node-b (silent)"
    assert f"({job.over_phrase})" in render(snap)
    header = JobHeader.render_text(snap, job, 0, 1).plain
    assert f"MFU 1.7 % {job.over_phrase}" in header
    assert _metric(snap, "flowtop_job_unheard_ranks") == 1
    assert _metric(snap, "flowtop_job_mfu_ratio") == pytest.approx(5e10 / 3e12, rel=1e-6)
    # Exported "unheard", not "stale": an alert on stale ranks (dead or hung) does not fire for it.
    assert _exported_states(snap) == {0: "live", 1: "live", 2: "live", 3: "unheard"}
    assert _job_ranks(snap) == {"live": 3, "stalled": 0, "stale": 0, "done": 0, "failed": 0, "stopped": 0, "unheard": 1}
    nodes = {s.labels["host"]: s.labels["flowtop_node_status"]
             for m in snapshot_families(snap, ExportPolicy(max_ranks=1)) for s in m.samples
             if s.name == "flowtop_node_status" and s.value == 1}
    assert nodes == {"node-a": "live", "node-b": "unheard"}  # above the rank cap: per-node series

    j.relayed = True  # a relay again on node-b: rank 3 heard, the hint clears (after its hold)
    snap = j.run(12.0)
    job = _job(snap)
    assert not job.unheard and job.ranks[3].status == "live" and job.flops is not None
    assert job.flops.mfu == pytest.approx(0.0175, rel=1e-6) and job.flops.mfu_reason == ""
    assert not [h for h in job.hints if h.id == "relay_silent"]
    assert _metric(snap, "flowtop_job_unheard_ranks") == 0


def _hint_gauges(snap: MonitorSnapshot) -> dict[str, float]:
    """flowtop_job_hints per hint id: the active hints Prometheus counts."""
    return {s.labels["id"]: s.value for m in snapshot_families(snap) for s in m.samples
            if s.name == "flowtop_job_hints"}


def test_a_cut_ranks_own_hints_are_not_shown_while_it_is_unheard_and_come_back_after() -> None:
    """Rank 3 (behind the relay) waits for input 0.01 s of each 0.05 s step: 20 % (a CPU rank's
    device idles, the gate holds), above input_wait's 5 %. Its relay dies: its input_wait hint,
    with evidence from before the cut, read as current beside "1 rank unheard behind relay
    node-b" (a new user's trial). While it is unheard no hint of rank 3 is active, anywhere the
    hints are (snapshot, JSON, Prometheus); heard again, its new steps wait 20 % again and the
    hint is back."""

    class _Waits(_Job):
        def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
            if kind == "step" and key.rank == 3:
                fields = dict(fields, input_wait_s=0.01)
            super().send(key, kind, fields)

    j = _Waits(wall={**WALL, 2: 0.05})  # every rank one step per 0.05 s: no straggler
    snap = j.run(6.0)
    (hint,) = [h for h in _job(snap).hints if h.target == "rank 3"]
    assert hint.id == "input_wait" and hint.evidence["input_wait_pct"] == pytest.approx(20.0)
    assert _hint_gauges(snap)["input_wait"] == 1

    j.relayed = False
    snaps = [j.run(0.5) for _ in range(round((SILENT_AFTER_S + 2.0) / 0.5))]
    cut = [s for s in snaps if _job(s).ranks[3].cut is not None]
    assert cut and cut[-1] is snaps[-1]
    for s in cut:  # from the first tick that marks it unheard
        job = _job(s)
        assert [h.id for h in job.hints if not h.ended] == ["relay_silent"]
        # its hint from before the cut kept marked ended, as last measured
        assert [(h["id"], h["ended"]) for h in to_json(s)["jobs"][0]["hints"]] == [
            ("relay_silent", False), ("input_wait", True)]
        assert _hint_gauges(s) == {"relay_silent": 1}

    j.relayed = True  # a relay again on node-b: rank 3's steps heard, 20 % input wait again
    snap = j.run(1.0)
    job = _job(snap)
    assert job.ranks[3].cut is None and job.ranks[3].status == "live"
    (hint,) = [h for h in job.hints if h.target == "rank 3"]
    assert hint.id == "input_wait" and hint.evidence["input_wait_pct"] == pytest.approx(20.0)
    assert _hint_gauges(snap)["input_wait"] == 1


def _node_states(snap: MonitorSnapshot) -> dict[str, str]:
    """Each node's state that flowtop_node_status sets to 1 (the series of a job above the rank cap)."""
    return {s.labels["host"]: s.labels["flowtop_node_status"]
            for m in snapshot_families(snap, ExportPolicy(max_ranks=1)) for s in m.samples
            if s.name == "flowtop_node_status" and s.value == 1}


def _job_state(snap: MonitorSnapshot) -> str:
    (state,) = [s.labels["flowtop_job_status"] for m in snapshot_families(snap) for s in m.samples
                if s.name == "flowtop_job_status" and s.value == 1]
    return state


def test_a_node_with_a_finished_rank_beside_a_cut_one_exports_unheard_not_stale() -> None:
    """Rank 4 on node-b says bye through the relay; then the relay goes silent with rank 3 behind it:
    the node is "unheard" (its ranks done and unheard), where its worst status reads stale."""
    keys = [*KEYS, RankKey("j", "node-b", 104, 4, 0)]
    j = _Job(keys, {**WALL, 4: 0.05})
    j.run(3.0)
    j.send(keys[4], "bye", {"reason": "exit", "steps": j.steps[keys[4]], "drops": 0})
    j.wall[4] = 1e9  # it steps no more
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    assert [r.status for r in _job(snap).ranks] == ["live", "live", "live", "stale", "done"]
    assert _exported_states(snap) == {0: "live", 1: "live", 2: "live", 3: "unheard", 4: "done"}
    assert _node_states(snap) == {"node-a": "live", "node-b": "unheard"}
    assert _job_state(snap) == "running"


def test_a_job_stale_only_behind_its_relay_exports_unheard() -> None:
    """Both ranks behind one relay, which goes silent: the job is stale in the snapshot (no rank
    heard), "unheard" in Prometheus; a rank stale of its own keeps the job's "stale"."""
    keys = [RankKey("j", "node-b", 100 + r, r, 0) for r in range(2)]
    j = _Job(keys, {0: 0.05, 1: 0.05}, direct=0)
    j.run(3.0)
    assert _job_state(j.run(0.5)) == "running"
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    assert _job(snap).status == "stale" and len(_job(snap).unheard) == 2
    assert _job_state(snap) == "unheard"
    assert _job_ranks(snap) == {"live": 0, "stalled": 0, "stale": 0, "done": 0, "failed": 0, "stopped": 0, "unheard": 2}
    assert _node_states(snap) == {"node-b": "unheard"}
    # Rank 0 heard directly but silent of its own (a crash): stale, as the job is.
    mixed = _Job([RankKey("j", "node-a", 100, 0, 0), RankKey("j", "node-b", 101, 1, 0)], {0: 0.05, 1: 0.05}, direct=1)
    mixed.run(3.0)
    mixed.relayed, mixed.wall[0] = False, 1e9
    snap = mixed.run(30.0)
    assert [r.status for r in _job(snap).ranks] == ["stale", "stale"] and len(_job(snap).unheard) == 1
    assert _job_state(snap) == "stale"
    assert _exported_states(snap) == {0: "stale", 1: "unheard"}


def test_a_job_whose_heard_ranks_said_bye_ends_with_its_unheard_ranks_said() -> None:
    j = _Job()
    j.run(3.0)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    assert _job(snap).status == "running" and not all_done(snap)
    for k in KEYS:  # rank 3's bye is lost with its relay
        j.send(k, "bye", {"reason": "exit", "steps": j.steps[k], "drops": 0})
    j.now += 0.5
    snap = j.model.tick(j.now)
    job = _job(snap)
    assert job.status == "done" and [r.status for r in job.ranks] == ["done", "done", "done", "stale"]
    assert len(job.unheard) == 1 and all_done(snap)  # flowtop snapshot --until-done returns
    assert job.over_phrase == "over 3 of 4 ranks; 1 unheard behind relay node-b"
    assert to_json(snap)["jobs"][0]["unheard_ranks"] == 1
    # The hint stays, ended: the job's final snapshot says its rank was unheard at the end.
    (hint,) = [h for h in job.hints if h.id == "relay_silent"]
    assert hint.ended
    # Finished: its series (the unheard rank's, "unheard" still, never "stale") end after the linger.
    assert _exported_states(snap) == {0: "done", 1: "done", 2: "done", 3: "unheard"}
    policy = ExportPolicy(linger_s=60.0)
    assert exported_jobs(snap, policy) == [job]
    assert exported_jobs(j.model.snapshot(j.now + 61.0), policy) == []
    # A failed heard rank makes it failed.
    j2 = _Job()
    j2.run(3.0)
    j2.relayed = False
    j2.run(SILENT_AFTER_S + 2.0)
    for k in KEYS:
        reason = "error: RuntimeError: boom" if k.rank == 1 else "exit"
        j2.send(k, "bye", {"reason": reason, "steps": j2.steps[k], "drops": 0})
    j2.now += 0.5
    assert _job(j2.model.tick(j2.now)).status == "failed"


@pytest.mark.slow
def test_snapshot_until_done_returns_when_the_heard_ranks_ended_behind_a_dead_relay() -> None:
    """Real processes: `flowtop snapshot --until-done`, a real relay (killed with SIGKILL) with
    ranks 0 and 1 behind it, ranks 2 and 3 direct; ranks 2 and 3 say bye (0 and 1's byes would
    be lost with the relay): the snapshot returns, the job done with 2 unheard ranks; exit 3, not
    0: ranks 0 and 1 are not known to have finished (stderr says so)."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile
    import threading
    import time

    from flowtop.tools.demo.launch import free_port_pair
    from probe.transport.publisher import Publisher

    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    short = tempfile.mkdtemp(prefix="ftu")
    relay_addr = f"ipc://{short}/r.sock"
    watcher = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", listen, "--until-done",
                                "--timeout", "60", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    relay = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", relay_addr, "--connect", listen],
                             stderr=subprocess.PIPE, text=True)
    pubs = {}
    for rank in range(4):
        pub = Publisher(RankKey("dead-relay", "node-a" if rank < 2 else "node-b", 5000 + rank, rank, 0),
                        relay_addr if rank < 2 else listen)
        pub.hello_fields = {"local_rank": rank % 2, "world_size": 4, "device": "cpu (test)", "probe_version": "t"}
        pub.start()
        pubs[rank] = pub
    stop = threading.Event()

    def steps() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            for pub in pubs.values():
                pub.publish("step", {"step": step, "wall_s": 0.02, "tokens": 64, "drops": 0})
            time.sleep(0.02)

    thread = threading.Thread(target=steps, daemon=True)
    thread.start()
    try:
        time.sleep(5.0)  # every rank heard (the monitor binds, the relay and the probes connect)
        relay.kill()  # kill -9 the relay host: ranks 0 and 1 train on, unheard
        relay.wait(10)
        time.sleep(5.0)  # past the relay's 3 s of silence
        stop.set()
        thread.join(2)
        for rank in (2, 3):
            pubs[rank].publish("bye", {"reason": "exit", "steps": 1, "drops": 0})
        out, err = watcher.communicate(timeout=30)
    finally:
        stop.set()
        watcher.kill()
        relay.kill()
        for pub in pubs.values():
            pub.close()
        shutil.rmtree(short, ignore_errors=True)
    assert watcher.returncode == 3, err
    assert err.startswith("flowtop: --until-done: 2 rank(s) of dead-relay (ranks 0-1) unheard behind relay(s) on ") and err.endswith(
        " when the job ended: whether they finished is not known\n")
    (job,) = json.loads(out)["jobs"]
    # These probes send no FLOP count: the heard ranks have none yet, and two ranks are unheard.
    assert job["status"] == "done" and job["unheard_ranks"] == 2 and job["mfu_reason"].startswith(
        "no FLOP count yet; over 2 of 4 ranks; 2 unheard behind relay ")
    assert [r["status"] for r in job["ranks"]] == ["stale", "stale", "done", "done"]


class _MeshJob(_Job):
    """Two data-parallel replicas of tensor-parallel 2 (dp = rank // 2); ``rep3``: rank 3 is its
    replica's tp rank 0 (the representative, whose tokens count) instead of rank 2."""

    def __init__(self, rep3: bool) -> None:
        self.rep3 = rep3
        super().__init__()

    def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
        if kind == "hello":
            tp = (1 - key.rank % 2) if self.rep3 and key.rank >= 2 else key.rank % 2
            fields = dict(fields, coords={"dp": [key.rank // 2, 2], "tp": [tp, 2]})
        super().send(key, kind, fields)


@pytest.mark.parametrize("rep3", [False, True], ids=["tp1-unheard", "representative-unheard"])
def test_a_partly_unheard_replica_is_left_out_whole(monkeypatch: pytest.MonkeyPatch, rep3: bool) -> None:
    """By hand: every rank counts 1e9 model FLOPs per step of 256 tokens, one step per 0.05 s. A
    replica (tp 2) computes 2 x 1e9 FLOPs on its 256 tokens: 7.8125e6 FLOPs per token, whoever
    is heard. Both replicas: 2 x 256 / 0.05 = 10,240 tokens/s, 4 x 2e10 = 8e10 FLOP/s. Rank 3
    unheard: replica 1 (ranks 2, 3) is left out whole, replica 0 remains: 5,120 tokens/s,
    2 x 2e10 = 4e10 FLOP/s (= 5,120 x 7.8125e6) of a 2e12 peak: MFU 2 %. (Counting rank 2 on
    with its tokens read 3e9 / 512 = 5.86e6 FLOPs per token, 10,240 tokens/s beside 6e10 FLOP/s.)"""
    monkeypatch.setitem(WALL, 2, 0.05)
    j = _MeshJob(rep3)
    job = _job(j.run(6.0))
    assert job.flops is not None and job.flops.flops_per_token == pytest.approx(7.8125e6, rel=1e-6)
    assert job.tokens_per_s == pytest.approx(10_240, rel=1e-6) and job.flops.flops_per_s == pytest.approx(8e10)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert job.flops is not None and job.flops.flops_per_token == pytest.approx(7.8125e6, rel=1e-6)
    assert job.tokens_per_s == pytest.approx(5_120, rel=1e-6)
    assert job.flops.flops_per_s == pytest.approx(4e10, rel=1e-6) and job.flops.peak_flops == pytest.approx(2 * T)
    assert job.flops.mfu == pytest.approx(0.02, rel=1e-6)
    assert job.over_phrase == ("over 2 of 4 ranks; 1 unheard behind relay node-b, "
                               "1 more left out with its data-parallel replica")
    assert job.tokens_basis.endswith("; data-parallel replicas with an unheard rank left out")
    jj = to_json(snap)["jobs"][0]
    assert jj["mfu_reason"] == job.over_phrase and jj["flops_per_token"] == pytest.approx(7.8125e6, rel=1e-6)


def test_a_job_with_every_rank_unheard_shows_its_last_step_and_no_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank (behind the relay), one step per 0.05 s for 6 s: step 120 when its relay dies.
    Its step stays the last heard, 120; its step time is not measured now: None (not 50 ms), and
    no flowtop_job_step_seconds; no FLOP figures, said: "no rank heard; ..." (not "over 0 of 1")."""
    monkeypatch.setattr(__import__(__name__), "KEYS", [KEYS[3]])
    j = _Job()
    job = _job(j.run(6.0))
    assert job.step == 120 and job.step_time_s == pytest.approx(0.05)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert job.step == 120 and job.step_time_s is None and job.flops is None
    assert not [s for m in snapshot_families(snap) for s in m.samples if s.name == "flowtop_job_step_seconds"]
    assert job.over_phrase == "no rank heard; 1 unheard behind relay node-b"
    jj = to_json(snap)["jobs"][0]
    assert jj["step_time_s"] is None and jj["mfu_reason"] == job.over_phrase
    assert "MFU n/a (no rank heard; 1 unheard behind relay node-b)" in JobHeader.render_text(snap, job, 0, 1).plain


def test_the_text_report_says_why_a_job_with_every_rank_unheard_has_no_mfu(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank, behind a relay that dies: no FLOP figures; the report says so, as the header."""
    monkeypatch.setattr(__import__(__name__), "KEYS", [KEYS[3]])
    j = _Job()
    j.run(3.0)
    j.relayed = False
    report = render(j.run(SILENT_AFTER_S + 2.0))
    assert "  MFU n/a (no rank heard; 1 unheard behind relay node-b)" in report.splitlines()


def _idle(j: _Job, seconds: float) -> MonitorSnapshot:
    """No rank steps (the heard ones hang, saying hello each 2 s as a hung probe does; rank 3
    unheard): a tick each 0.5 s."""
    snap = None
    end = j.now + seconds
    n = 0
    while j.now < end - 1e-9:
        j.now += 0.5
        n += 1
        if n % 4 == 0:
            for k in KEYS[:3]:
                j.send(k, "hello", {"local_rank": k.rank, "world_size": 4, "device": "cpu (test)",
                                    "probe_version": "test"})
        snap = j.model.tick(j.now)
    assert snap is not None
    return snap


def test_a_stalled_job_keeps_its_heard_step_and_says_what_it_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank one step per 0.05 s: rank 3 unheard at step 120 (6 s); ranks 0-2 step on 6 s
    more, to 240, then hang. The job's step is its heard ranks' lowest, 240 (not rank 3's last
    heard, 120); its mfu_reason says the stall and what the figures are over."""
    monkeypatch.setitem(WALL, 2, 0.05)
    j = _Job()
    j.run(6.0)
    j.relayed = False
    j.run(6.0)
    snap = _idle(j, 10.0)
    job = _job(snap)
    assert job.status == "stalled" and job.ranks[3].cut is not None
    assert [r.step for r in job.ranks] == [240, 240, 240, 120] and job.step == 240
    assert job.step_time_s == pytest.approx(0.05)
    assert job.flops is not None and job.flops.stalled_since is not None
    stalled_s = snap.taken_at - job.flops.stalled_since
    assert to_json(snap)["jobs"][0]["mfu_reason"] == (
        f"no step for {stalled_s:.0f} s; over 3 of 4 ranks; 1 unheard behind relay node-b")


def test_no_flop_count_yet_is_kept_beside_the_unheard_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heard ranks without a FLOP count (only rank 3 sent one, now unheard): the job has no FLOP
    figures because none is counted yet, and some ranks are unheard: both said."""

    class _NoCount(_Job):
        def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
            if kind != "flops" or key.rank == 3:
                super().send(key, kind, fields)

    j = _NoCount()
    j.run(3.0)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert job.flops is None
    reason = "no FLOP count yet; over 3 of 4 ranks; 1 unheard behind relay node-b"
    assert to_json(snap)["jobs"][0]["mfu_reason"] == reason
    assert f"MFU n/a ({reason})" in JobHeader.render_text(snap, job, 0, 1).plain


def test_a_nodes_step_time_and_lowest_step_leave_its_unheard_ranks_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks 0-2 one step per 0.05 s, rank 3 per 0.1 s: rank 3 at step 60 after 6 s when its
    relay dies; the others on 5 s more, to 120 + 100 = 220. A node of all four: slowest step 0.05 s
    and lowest step 220 (not rank 3's last heard 0.1 s and 60), 4 ranks, its status stale (the
    unheard rank's); rank 3 has no flowtop_rank_step_seconds, as its map cell has no value."""
    monkeypatch.setitem(WALL, 2, 0.05)
    monkeypatch.setitem(WALL, 3, 0.1)
    j = _Job()
    j.run(6.0)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert [r.step for r in job.ranks] == [220, 220, 220, 60] and job.ranks[3].step_time_s == pytest.approx(0.1)
    g = node_group("x", list(job.ranks), job_context(job.ranks))
    assert g.step_time_max == pytest.approx(0.05) and g.step_min == 220
    assert len(g.ranks) == 4 and g.worst_status == "stale"
    samples = [s for m in snapshot_families(snap) for s in m.samples if s.name == "flowtop_rank_step_seconds"]
    assert sorted(s.labels["rank"] for s in samples) == ["0", "1", "2"]


def test_relay_silent_counts_the_heard_ranks_that_step_and_says_its_seconds_at_display(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2 said bye (done), rank 3 unheard: of the 3 heard ranks 2 step on (0 and 1), and the
    summary says 2, not 3. Its silence grows at display: the same hint read 10 s later says 10 s more."""
    j = _Job()
    j.run(3.0)
    j.send(KEYS[2], "bye", {"reason": "exit", "steps": j.steps[KEYS[2]], "drops": 0})
    monkeypatch.setattr(__import__(__name__), "KEYS", [KEYS[0], KEYS[1], KEYS[3]])
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert job.ranks[2].status == "done"
    (hint,) = [h for h in job.hints if h.id == "relay_silent"]
    assert hint.evidence["heard_ranks"] == 3 and hint.evidence["stepping_ranks"] == 2
    cut = job.ranks[3].cut
    assert cut is not None and cut.silent_since is not None
    t = snap.taken_at
    assert hint.summary_at(t).startswith(f"1 rank unheard behind relay node-b (rank 3), silent for "
                                         f"{t - cut.silent_since:.0f} s, while the other 2 step on")
    assert f"silent for {t + 10 - cut.silent_since:.0f} s," in hint.summary_at(t + 10)
    assert hint.evidence_at(t + 10)["silent_s"] == pytest.approx(t + 10 - cut.silent_since)


def test_the_peak_per_rank_is_of_the_ranks_the_peak_sums() -> None:
    """Ranks 0-2 on 1e12 FLOP/s peaks, rank 3 on 2e12, unheard: the job's peak is 3e12 over the
    3 heard ranks, so 3 ranks of 1e12 each (rank 3's 2e12 is not in the sum, nor in the split)."""

    class _Mixed(_Job):
        def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
            if kind == "flops" and key.rank == 3:
                fields = dict(fields, peak_flops=2 * T)
            super().send(key, kind, fields)

    j = _Mixed()
    j.run(3.0)
    j.relayed = False
    jj = to_json(j.run(SILENT_AFTER_S + 2.0))["jobs"][0]
    assert jj["peak_flops"] == pytest.approx(3 * T)
    assert jj["peak_ranks"] == 3 and jj["peak_per_rank_flops"] == pytest.approx(T)


def test_every_rank_unheard_is_said_by_relay_silent_and_its_seconds_go_on() -> None:
    """All 4 ranks behind node-b's relay, which dies: no rank heard, the job stale. relay_silent
    says so (a new user's trial: it stayed as last measured while one rank still stepped, "silent
    for 12 s ... while the other 1 step on", frozen, the job being measured no more), and is
    measured on while the job is silent: 10 s later, at a later tick, 10 s more."""
    j = _Job(direct=0)
    j.run(3.0)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 2.0)
    job = _job(snap)
    assert job.status == "stale" and all(r.cut is not None for r in job.ranks)
    (hint,) = [h for h in job.hints if h.id == "relay_silent"]
    since = job.ranks[0].cut.silent_since  # type: ignore[union-attr]
    t = snap.taken_at
    assert hint.summary_at(t) == (f"every rank (4) unheard behind relay node-b (ranks 0-3), silent for "
                                  f"{t - since:.0f} s: they may still train; no rank is heard, so the job has no figures")
    later = j.run(10.0)
    (hint,) = [h for h in _job(later).hints if h.id == "relay_silent"]
    assert not hint.ended and f"silent for {later.taken_at - since:.0f} s:" in hint.summary_at(later.taken_at)


@pytest.mark.parametrize(("bye", "rc", "said"), [
    ("SIGTERM", 5, "flowtop: --until-done: 1 rank(s) stopped by a signal (SIGTERM) before they finished, "
                   "first rank 1 of j\n"),
    ("error: ValueError: bad batch", 4, "flowtop: --until-done: 1 rank(s) failed, first rank 1 of j: "
                                        "error: ValueError: bad batch\n"),
])
def test_until_done_names_the_unheard_ranks_beside_a_stop_or_a_crash_which_wins(
        capsys: pytest.CaptureFixture[str], bye: str, rc: int, said: str) -> None:
    """Rank 3's relay dies, rank 1 is stopped by a signal (or crashes), ranks 0 and 2 finish: the
    job is done with a rank stopped (5) or failed (4) and one unheard (3). The known ending wins
    (a rank known stopped or failed says more than one not known to have finished); stderr then
    names the unheard rank too on a line of its own (the 5's line alone hid it)."""
    from flowtop.export.serve import end_status
    from flowtop.monitor.snapshot import all_done

    j = _Job()
    j.run(3.0)
    j.relayed = False
    j.run(SILENT_AFTER_S + 2.0)
    for k in KEYS[:3]:
        j.send(k, "bye", {"reason": bye if k.rank == 1 else "exit", "steps": j.steps[k], "drops": 0})
    snap = j.model.tick(j.now + 0.5)
    assert all_done(snap) and _job(snap).ranks[3].cut is not None
    assert end_status(snap) == rc
    assert capsys.readouterr().err == said + (
        "flowtop: --until-done: 1 rank(s) of j (rank 3) unheard behind relay(s) on node-b when the job ended: "
        "whether they finished is not known\n")


def _ended_with_rank_3_unheard(keys: list[RankKey]) -> MonitorSnapshot:
    """``keys`` train, node-b's relay dies (rank 3 and any other process of it unheard), ranks 0-2
    say bye: the snapshot just after."""
    j = _Job(keys=keys)
    j.run(3.0)
    j.relayed = False
    j.run(SILENT_AFTER_S + 2.0)
    for k in KEYS[:3]:
        j.send(k, "bye", {"reason": "exit", "steps": j.steps[k], "drops": 0})
    return j.model.tick(j.now + 0.5)


def test_until_done_with_a_rank_unheard_at_the_end_exits_3_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 3's relay dies, ranks 0-2 say bye: the job is done (all_done: --until-done returns),
    but rank 3 is not known to have finished, so not a clean end (a new user's trial: exit 0,
    silently, with a node's ranks lost): exit 3 as a timeout's, stderr naming them; heard to the
    end, 0."""
    from flowtop.export.serve import end_status
    from flowtop.monitor.snapshot import all_done

    snap = _ended_with_rank_3_unheard(KEYS)
    assert all_done(snap) and _job(snap).ranks[3].cut is not None
    assert end_status(snap) == 3
    assert capsys.readouterr().err == ("flowtop: --until-done: 1 rank(s) of j (rank 3) unheard behind relay(s) on "
                                       "node-b when the job ended: whether they finished is not known\n")
    done = _Job()
    done.run(3.0)
    for k in KEYS:
        done.send(k, "bye", {"reason": "exit", "steps": done.steps[k], "drops": 0})
    snap = done.model.tick(done.now + 0.5)
    assert all_done(snap) and end_status(snap) == 0 and capsys.readouterr().err == ""


def test_until_done_counts_an_unheard_rank_number_once_where_two_processes_claim_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two processes claim rank 3 on node-b (a conflict: each keeps its row) and both go unheard
    with their relay: the line names one rank, rank 3, not "2 rank(s) (ranks 3)"."""
    from flowtop.export.serve import end_status

    snap = _ended_with_rank_3_unheard([*KEYS, RankKey("j", "node-b", 200, 3, 0)])
    assert [r.rank for r in _job(snap).ranks if r.cut is not None] == [3, 3]
    assert end_status(snap) == 3
    assert capsys.readouterr().err == ("flowtop: --until-done: 1 rank(s) of j (rank 3) unheard behind relay(s) on "
                                       "node-b when the job ended: whether they finished is not known\n")
