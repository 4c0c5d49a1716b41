"""An ended job's snapshot is reused from tick to tick while nothing of it changes
(flowtop.monitor.endedjobs): its views, figures and hints are not looked at again, what it shows
equals what a full rebuild shows, a late frame or a restart rebuilds it at the next tick, and it
is still evicted at its deadline.

Every frame is a real wire frame through the model's decode and ingest path; time is the model's
own (the ``now`` of each frame and tick). A twin model whose reuse is turned off (``full``) gets
the same frames and ticks: it rebuilds every snapshot, as the model did before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from flowtop.monitor import rotation
from flowtop.monitor.model import Model
from flowtop.monitor.rankstate import EVICT_AFTER_S
from flowtop.monitor.recording import feed
from flowtop.monitor.relays import encode_stamp
from flowtop.monitor.snapshot import Hint, JobSnapshot, MonitorSnapshot
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from probe.wire.steps import encode_fields

TICK = 0.5
HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}


class Cluster:
    """Models fed the same frames: ``reused`` as the monitor runs, ``full`` without the reuse."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reused, self.full = make_model(), make_model()
        if hasattr(self.full, "_ended_jobs"):  # (a model without the reuse rebuilds them anyway)
            monkeypatch.setattr(self.full._ended_jobs, "take", lambda *args: None)
        self.seq: dict[RankKey, int] = {}
        self.now = 10.0
        self.via: str | None = None  # the relay the frames come through (None: directly)
        self.lag = 0.0  # how long the relay's batches wait in queues (beyond its first's)

    def send(self, key: RankKey, kind: str, fields: dict[str, Any]) -> None:
        self.seq[key] = self.seq.get(key, 0) + 1
        frame = wire.encode(kind, key, self.seq[key], self.now, fields)
        for model in (self.reused, self.full):
            if self.via is None:
                feed(model, frame, self.now)  # as the collector decodes it
            else:  # as the collector does with a relay's batch (Collector.handle_batch): a batch
                # of one frame, the relay's clock 900 s ahead of the monitor's, sent ``lag`` ago
                via, (at,) = model.relays.unstamp([encode_stamp(self.via, self.now + 900.0 - self.lag, [0]), frame],
                                                  self.now)
                model.ingest(wire.decode(frame), at, via=via)

    def run(self, keys: list[RankKey], steps: int, wait: float = 0.0, first: int = 1) -> None:
        """Each rank says hello, then ``steps`` steps of 50 ms (``wait`` of each waiting for
        input) a tick's worth at a time, with telemetry; the models tick in between."""
        for key in keys:
            self.send(key, "hello", {**HELLO, "local_rank": key.rank, "world_size": len(keys)})
        for s in range(first, first + steps, 10):
            self.now += TICK
            for key in keys:
                recs = [{"step": i, "wall_s": 0.05, "tokens": 64, "drops": 0, "input_wait_s": wait}
                        for i in range(s, min(s + 10, first + steps))]
                self.send(key, "stepcols", encode_fields(recs, 0))
                self.send(key, "telemetry", {"gpu": {"util": 90.0}, "proc": {"cpu_pct": 100.0}})
            self.tick()

    def bye(self, keys: list[RankKey]) -> None:
        self.now += 0.1
        for key in keys:
            self.send(key, "bye", {"reason": "exit", "steps": 0, "drops": 0})

    def tick(self, at: float | None = None) -> tuple[MonitorSnapshot, MonitorSnapshot]:
        """Both models' ticks at ``at`` (default: the next tick's time); equal, whatever reuse."""
        self.now = at if at is not None else self.now + TICK
        a, b = self.reused.tick(self.now), self.full.tick(self.now)
        assert a == b and not self.reused.rejected  # every frame taken
        return a, b


def _keys(job: str, n: int, inc: int = 0, pid0: int = 100) -> list[RankKey]:
    return [RankKey(job, f"h{r // 4}", pid0 + r, r, inc) for r in range(n)]


def _job(snap: MonitorSnapshot, job: str) -> JobSnapshot:
    (j,) = [j for j in snap.jobs if j.job == job]
    return j


def test_an_ended_jobs_snapshot_is_the_same_object_from_tick_to_tick_and_equals_a_full_rebuild(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    ended, live = _keys("ended", 4), _keys("live", 2, pid0=200)
    c.run(ended + live, 30)
    c.bye(ended)
    first, _ = c.tick()
    assert _job(first, "ended").status == "done" and _job(first, "live").status == "running"
    served = c.reused._ended_jobs.served
    for _ in range(6):
        c.run(live, 10, first=31 + 10 * _)  # the live job goes on beside it (and ticks)
        snap, full = c.tick()
        job = _job(snap, "ended")
        assert job is _job(first, "ended")  # views, figures and hints: the same objects
        assert all(r is r0 for r, r0 in zip(job.ranks, _job(first, "ended").ranks))
        assert job == _job(full, "ended") and _job(full, "ended") is not job  # what a rebuild shows
        assert _job(snap, "live") is not _job(first, "live")  # a live job is never kept
    assert c.reused._ended_jobs.served == served + 12  # each tick of run() and each tick() above
    # A snapshot between two ticks (a pure read) serves it too, and changes nothing.
    assert _job(c.reused.snapshot(c.now + 0.2), "ended") is job
    assert _job(c.reused.snapshot(c.now + 0.2, light=True), "ended") is job
    assert len(c.reused._ended_jobs) == 1  # the ended job only


def test_an_ended_jobs_tick_looks_at_neither_its_views_nor_its_hints(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 6)
    c.run(keys, 30)
    c.bye(keys)
    c.tick()
    calls: list[str] = []
    model = c.reused
    views, evaluate = model.views.views, model._hint_engine.evaluate  # type: ignore[union-attr]
    monkeypatch.setattr(model.views, "views", lambda *a, **k: calls.append("views") or views(*a, **k))
    monkeypatch.setattr(model._hint_engine, "evaluate", lambda *a, **k: calls.append("hints") or evaluate(*a, **k))
    for _ in range(10):
        c.tick()
        model.snapshot(c.now + 0.25)
    assert calls == []


def test_a_late_frame_of_a_rank_that_said_bye_changes_its_view_at_the_next_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 30)
    c.bye(keys)
    before, _ = c.tick()
    assert _job(c.tick()[0], "j") is _job(before, "j")
    # Rank 2's sender flushes one more step and a telemetry sample after its bye (a late frame).
    c.now += 0.2
    c.send(keys[2], "stepcols", encode_fields([{"step": 31, "wall_s": 0.05, "tokens": 64, "drops": 0}], 0))
    after, full = c.tick()
    job, old = _job(after, "j"), _job(before, "j")
    assert job is not old and job.ranks[2] is not old.ranks[2]
    assert (job.ranks[2].step, job.ranks[2].heard_at, job.ranks[2].status) == (31, c.now - TICK, "done")
    assert all(r is r0 for i, (r, r0) in enumerate(zip(job.ranks, old.ranks)) if i != 2)  # theirs did not change
    assert job == _job(full, "j")
    assert _job(c.tick()[0], "j") is job  # kept again, as it is now


def test_a_restart_of_an_ended_job_shows_at_the_next_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 30)
    c.bye(keys)
    done = _job(c.tick()[0], "j")
    assert done.status == "done" and _job(c.tick()[0], "j") is done  # kept
    c.now += 0.2
    for key in _keys("j", 4, inc=1):  # relaunched under its id: a new incarnation of each rank
        c.send(key, "hello", {**HELLO, "local_rank": key.rank, "world_size": 4})
    job = _job(c.tick()[0], "j")
    assert job.status == "running" and [r.incarnation for r in job.ranks] == [1] * 4
    assert len(c.reused._ended_jobs) == 0  # nothing of the ended run kept


def test_an_ended_job_is_still_evicted_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 30)
    c.bye(keys)
    last = c.now  # the byes' receive time: the ranks' last
    first = _job(c.tick()[0], "j")
    kept = _job(c.tick(last + EVICT_AFTER_S)[0], "j")  # silent exactly EVICT_AFTER_S: not yet gone
    assert kept is first and kept.status == "done"
    snap, _ = c.tick(last + EVICT_AFTER_S + TICK)
    assert snap.jobs == () and c.reused.evicted_jobs == 1 and not c.reused.ranks
    assert len(c.reused._ended_jobs) == 0  # nothing of it kept


def test_an_ended_jobs_hints_equal_a_full_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 40, wait=0.02)  # 40 % of each step waiting for input: every rank's hint
    running, _ = c.tick()
    assert {(h.id, h.ended) for h in _job(running, "j").hints} == {("input_wait", False)}
    c.bye(keys)
    first, _ = c.tick()
    hints = _job(first, "j").hints
    assert len(hints) == 4 and all(h.ended for h in hints)
    for _ in range(5):
        snap, full = c.tick()  # the twin evaluates them again at every tick
        assert _job(snap, "j").hints is hints and _job(full, "j").hints == hints


def test_a_large_ended_jobs_hints_end_at_the_next_tick_and_take_no_history(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its rules measure nothing once it ended: its hints end at the tick after the byes (not at
    its next share's), and no tick takes its ranks' histories for them again."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 4)  # 10 ranks: 3 ticks a round
    c = Cluster(monkeypatch)
    keys = _keys("big", 10)
    c.run(keys, 40, wait=0.02)
    assert {h.ended for h in _job(c.tick()[0], "big").hints} == {False}
    while rotation.hint_share(c.reused.ticks + 1, 3) is not None:  # the next tick measures no share
        c.tick()
    c.bye(keys)
    taken: list[str] = []
    as_now = c.reused._as_now
    monkeypatch.setattr(c.reused, "_as_now", lambda snap, states: taken.append(snap.job) or as_now(snap, states))
    snap, _ = c.tick()
    assert rotation.hint_share(c.reused.ticks, 3) is None and c.reused.ticks_per_round(10) == 3
    hints = _job(snap, "big").hints
    assert hints and all(h.ended for h in hints)
    for _ in range(6):  # two rounds
        assert _job(c.tick()[0], "big").hints is hints
    assert taken == []


def test_a_relays_lag_moving_past_the_views_rebuilds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view records its relay's lag (its age takes it off): kept views follow a lag that moved
    by more than LAG_STEP_S, as a rebuild would."""
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    lags = {"node-a:7:1": 0.0}
    for model in (c.reused, c.full):
        monkeypatch.setattr(model.relays, "lag_of", lambda via: lags.get(via, 0.0) if via else 0.0)
    c.via = "node-a:7:1"  # the ranks' frames come through the relay
    c.run(keys, 20)
    c.bye(keys)
    first, _ = c.tick()
    assert {r.behind_s for r in _job(first, "j").ranks} == {0.0}
    lags["node-a:7:1"] = 0.8  # within LAG_STEP_S of the views'
    assert _job(c.tick()[0], "j") is _job(first, "j")
    lags["node-a:7:1"] = 1.5
    snap, full = c.tick()
    assert {r.behind_s for r in _job(snap, "j").ranks} == {1.5} and _job(snap, "j") == _job(full, "j")


def test_only_an_ended_or_silent_jobs_snapshot_is_kept_and_only_with_the_hints_it_was_kept_with() -> None:
    from flowtop.monitor.endedjobs import EndedJobs

    model: Model = make_model()
    key = RankKey("j", "h", 1, 0, 0)
    model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0, HELLO)), 1.0)
    job = model.tick(1.0).jobs[0]
    kept, rows = EndedJobs(), [(model.ranks[key], ())]
    with pytest.raises(ValueError, match="only an ended or silent job"):
        kept.keep("j", rows, 1, job)
    hint = Hint("input_wait", "warning", "rank", "rank 0", "s", {}, "a", 0.1, ended=True)
    ended = dataclasses.replace(job, status="done", hints=(hint,))
    kept.keep("j", rows, 1, ended)
    assert kept.take("j", rows, 1, (hint,), lambda via: 0.0) is ended
    assert kept.take("j", list(rows), 1, (dataclasses.replace(hint),), lambda via: 0.0) is ended  # equal
    assert kept.take("j", rows, 1, (), lambda via: 0.0) is None  # evaluated since: not the same hints


def test_a_spread_that_makes_an_ended_job_large_rebuilds_its_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large job's views hold only what the UI shows (rankstate.history): kept across a change
    of the spread that makes it large, its views would hold more than a rebuild's."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 4)  # 4 ranks: one tick a round at spread 1, two at 2
    c = Cluster(monkeypatch)
    keys = _keys("j", 4)
    c.run(keys, 30)
    c.bye(keys)
    first = _job(c.tick()[0], "j")
    assert _job(c.tick()[0], "j") is first and first.ranks[0].history.reached  # whole histories
    for model in (c.reused, c.full):
        model.set_spread(2)
    job = _job(c.tick()[0], "j")  # equal to the twin's rebuild (Cluster.tick)
    assert job is not first and not job.ranks[0].history.reached


def test_jobs_that_ended_at_different_times_are_each_evicted_at_their_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eviction looks at the ranks only once the oldest heard is that old: the later job still
    goes at its own deadline, and a job that started meanwhile is not forgotten."""
    c = Cluster(monkeypatch)
    early, late = _keys("early", 2), _keys("late", 2, pid0=200)
    c.run(early + late, 20)
    c.bye(early)
    early_end = c.now
    c.tick()
    c.run(late, 20, first=21)
    c.bye(late)
    late_end = c.now
    snap, _ = c.tick(early_end + EVICT_AFTER_S + TICK)
    assert [j.job for j in snap.jobs] == ["late"] and c.reused.evicted_jobs == 1
    c.run(_keys("new", 2, pid0=300), 10)  # heard only now
    assert [j.job for j in c.tick(late_end + EVICT_AFTER_S)[0].jobs] == ["late", "new"]
    assert [j.job for j in c.tick(late_end + EVICT_AFTER_S + TICK)[0].jobs] == ["new"]
    assert c.reused.evicted_jobs == 2
