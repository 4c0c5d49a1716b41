"""A job whose ranks fall silent without a bye (a crash, a kill, a lost node) stays for
EVICT_AFTER_S: only the rules about its silence (the hang group) measure it once every rank is
stale, the others' hints held as they were (HintEngine.evaluate); a stale rank's view holds since
when it stalled (FlopsView.stalled_since) and stays the same object; the hang rules take each rank's stall
once per evaluation (measures_time._stalls). Real wire frames, the model's own clock; the twin
(``Cluster``, tests/test_ended_reuse.py) checks that both models show the same at every tick."""

from __future__ import annotations

import re
from typing import Any

import pytest

from flowtop.monitor.hints import measures_time
from flowtop.monitor.rankviews import RankViews
from flowtop.export.textreport import render
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, stalled_reason
from flowtop.monitor.snapshot_json import to_json
from probe.wire.steps import encode_fields
from tests.test_ended_reuse import Cluster, _keys


def _job(snap: MonitorSnapshot, job: str = "j") -> JobSnapshot:
    (j,) = [j for j in snap.jobs if j.job == job]
    return j


def _count_measures(monkeypatch: pytest.MonkeyPatch, cluster: Cluster) -> dict[str, int]:
    engine: Any = cluster.reused._hint_engine
    calls: dict[str, int] = {}
    for rule_id, fn in list(engine._measures.items()):
        def counted(rule: Any, job: Any, now: float, _fn: Any = fn, _id: str = rule_id) -> Any:
            calls[_id] = calls.get(_id, 0) + 1
            return _fn(rule, job, now)
        engine._measures[rule_id] = counted
    return calls


def test_a_silent_job_is_measured_by_its_hang_rules_only_and_its_other_hints_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 40, wait=0.02)  # 40 % of each step waiting for input: every rank's hint
    live = _job(c.tick()[0])
    waits = [h for h in live.hints if h.id == "input_wait"]
    assert len(waits) == 4 and live.status == "running"
    calls = _count_measures(monkeypatch, c)
    last = c.now
    while c.now < last + 6.0:  # silent past the stale limit (5 s)
        job = _job(c.tick()[0])
    assert job.status == "stale" and calls["input_wait"] > 0  # measured while it was not yet stale
    calls.clear()
    hang: list[str] = []
    while c.now < last + 40.0:  # the hang hint fires past its 30 s floor
        job = _job(c.tick()[0])
        hang += [h.summary_at(c.now) for h in job.hints if h.id == "hang_all"]
    # the silence rules: the hangs, and relay_silent (every rank unheard behind a dead relay)
    assert set(calls) == {"hang_all", "hang_rank", "relay_silent"} and calls["hang_all"] == 68  # one a tick, 34 s
    assert [h for h in job.hints if h.id == "input_wait"] == waits  # held as when it fell silent
    # The hang's text says its seconds at each snapshot's time, growing (not frozen).
    seconds = [int(re.search(r"no step for (\d+) s", text).group(1)) for text in hang]  # type: ignore[union-attr]
    assert len(hang) >= 18 and seconds == sorted(seconds) and seconds[0] <= 31 and seconds[-1] >= 39
    # A frame from one of its ranks: every rule measures it again at the next tick.
    c.send(keys[1], "stepcols", encode_fields([{"step": 41, "wall_s": 0.05, "tokens": 64, "drops": 0}], 0))
    job = _job(c.tick()[0])
    assert job.status != "stale" and calls["input_wait"] == 1


def test_a_stale_ranks_view_holds_since_when_it_stalled_and_stays_the_same_object(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 30)
    for key in keys:
        c.send(key, "flops", {"step": 2, "model_flops": 1e12, "executed_flops": 1e12, "attention": "full",
                              "dtype": "bf16", "peak_flops": 1e15, "peak_source": "test", "uncounted": {},
                              "tokens": 64})
    last = c.now
    while c.now < last + 6.0:
        job = _job(c.tick()[0])
    assert {r.status for r in job.ranks} == {"stale"}
    model = c.reused
    built, first, reasons = model.views.built, job.ranks, set()
    while c.now < last + 20.0:
        job = _job(c.tick()[0])  # equal to the twin's (Cluster.tick)
        assert all(view is kept for view, kept in zip(job.ranks, first))  # no copy, no rebuild
        for view, key in zip(job.ranks, keys):
            st = model.ranks[key]
            stalled = c.now - st.steps.last_recv()
            assert view.flops is not None and view.flops.stalled_since == st.steps.last_recv()
            assert view.flops.reason_at(c.now) == stalled_reason(stalled) and view.flops.mfu_reason == ""
            reasons.add(view.flops.reason_at(c.now))
            assert view == RankViews(model.views.peak_override_flops).view(st, c.now)  # as a build now shows
    assert model.views.built == built and len(reasons) >= 13  # its seconds grow, at display


def test_the_hang_rules_take_each_ranks_stall_once(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 6)
    c.run(keys, 30)
    taken: list[int] = []
    stall = measures_time._stall
    monkeypatch.setattr(measures_time, "_stall", lambda rule, r, now: taken.append(r.rank) or stall(rule, r, now))
    c.now += 35.0  # silent past the hang's floor
    snap, _ = c.tick()
    assert any(h.id == "hang_all" for h in _job(snap).hints)
    assert len(taken) == 2 * 6  # the two models, each rank once (hang_all and hang_rank share it)


def test_a_large_silent_jobs_shares_take_its_stale_ranks_histories_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its hang rules read every rank's whole history as of now (Model._as_now) at each share:
    a stale rank's, unchanged since, is the one taken at the share before."""
    from flowtop.monitor import model_tick, rankviews, rotation

    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 4)  # 12 ranks: 3 ticks a round
    c = Cluster(monkeypatch)
    keys = _keys("big", 12)
    c.run(keys, 30)
    last = c.now
    while c.now < last + 8.0:  # stale, and a round and more of shares since
        c.tick()
    taken: list[int] = []
    monkeypatch.setattr(model_tick, "as_now", lambda view, st, stepped: taken.append(st.key.rank)
                        or rankviews.as_now(view, st, stepped))
    judged = c.reused._as_now
    checked: list[int] = []

    def exact(snap: JobSnapshot, states: list[Any]) -> JobSnapshot:
        out = judged(snap, states)  # as a fresh take of every rank would show
        assert out.ranks == tuple(rankviews.as_now(v, st, True) for v, st in zip(snap.ranks, states))
        checked.append(len(states))
        return out

    monkeypatch.setattr(c.reused, "_as_now", exact)
    while c.now < last + 20.0:
        assert _job(c.tick()[0], "big").status == "stale"
    assert len(checked) >= 6  # a share every other tick or so
    assert taken == []  # neither model took a history again: the ranks' states did not move


def _same_render(a: MonitorSnapshot, b: MonitorSnapshot) -> None:
    """What the JSON and the text report say of two snapshots is the same (a hang's seconds
    included: said at each snapshot's taken_at)."""
    assert to_json(a) == to_json(b) and render(a) == render(b)


def test_a_silent_jobs_snapshot_is_the_same_object_from_tick_to_tick_and_renders_as_a_rebuild(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Twin models (Cluster): ``full`` rebuilds every snapshot, ``reused`` keeps the silent job's
    while nothing of it changes; at every tick both show the same, the hang's seconds growing."""
    c = Cluster(monkeypatch)
    silent, live = _keys("j", 4), _keys("live", 2, pid0=200)
    c.run(silent + live, 30)
    last = c.now
    kept: list[JobSnapshot] = []
    texts: list[str] = []
    while c.now < last + 45.0:  # stale after 5 s, the hang past its 30 s floor, 15 s more
        c.run(live, 10, first=31 + 10 * len(texts))  # the live job goes on beside it
        snap, full = c.tick()
        _same_render(snap, full)
        job = _job(snap)
        if job.status == "stale":
            kept.append(job)
        hang = [h for h in job.hints if h.id == "hang_all"]
        if hang:
            texts.append(hang[0].summary_at(snap.taken_at))
    assert len(set(texts)) >= 10 and texts[-1] != texts[0]  # its seconds grow at display
    distinct = {id(j) for j in kept}
    assert len(kept) >= 20 and len(distinct) <= 3, len(distinct)  # kept, rebuilt only when its hints changed
    assert kept[-1] is kept[-2] and all(r is r0 for r, r0 in zip(kept[-1].ranks, kept[0].ranks))
    # A snapshot between two ticks serves it too, as a rebuild shows it.
    between = c.reused.snapshot(c.now + 0.2)
    assert _job(between) is kept[-1]
    _same_render(between, c.full.snapshot(c.now + 0.2))
    # A frame from one of its ranks: rebuilt at the next tick, as the twin shows it.
    c.send(silent[1], "stepcols", encode_fields([{"step": 31, "wall_s": 0.05, "tokens": 64, "drops": 0}], 0))
    snap, full = c.tick()
    assert _job(snap) is not kept[-1] and _job(snap).status != "stale"
    _same_render(snap, full)


def test_a_large_silent_job_is_kept_and_renders_as_a_rebuild_at_every_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """In turns (3 ticks a round) and with its rules measured in shares: the same, share by share."""
    from flowtop.monitor import rotation

    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 4)  # 12 ranks: 3 ticks a round
    c = Cluster(monkeypatch)
    keys = _keys("big", 12)
    c.run(keys, 30)
    last = c.now
    kept: list[JobSnapshot] = []
    while c.now < last + 45.0:
        snap, full = c.tick()
        _same_render(snap, full)
        job = _job(snap, "big")
        if job.status == "stale":
            kept.append(job)
    assert any(h.id == "hang_all" for h in kept[-1].hints)
    assert len(kept) >= 70 and len({id(j) for j in kept}) <= 10 and kept[-1] is kept[-2]
