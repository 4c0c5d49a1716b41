"""A monitor short of time spreads a large job's ticks thinner (flowtop.monitor.thinning), and a
replay spreads them where the live monitor did."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flowtop.monitor import pacing, rotation, thinning
from flowtop.monitor.collector import Collector
from flowtop.monitor.model import Model
from flowtop.monitor.pacing import Busy
from flowtop.monitor.recording import Recorder, read_recording, replay_all
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from monitor_thread import MonitorThread
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey

TICKS_BOUND, ROOM, FRAMES_BOUND = Busy(0.2, 0.6, 2.0), Busy(0.2, 0.2, 2.0), Busy(0.6, 0.2, 2.0)


def test_ticks_that_crowd_out_frames_spread_thinner_and_back_when_there_is_room() -> None:
    """4,096 ranks, 512 a tick: a round of 8 ticks (4 s). Readings every 2 s, busy 80 %, 60 % of it
    ticks: each decision reads a whole round at the spread in force. After 2 readings the spread
    goes at once to where the ticks would take 20 % as if their cost were their ranks' (256 a tick:
    30 %; 128: 15 %): 4, a round of 32 ticks (16 s); after 8 more, to 8 (64 a tick: 30 % of 60 %
    would still be over 20 %: the most there is); busy with frames, or without room for twice the
    ticks, it holds; with room it halves back a round at a time."""
    t = thinning.Thinner()
    spreads, spread = [], 1
    for _ in range(10):
        spread = t.due(spread, TICKS_BOUND, 4096)
        spreads.append(spread)
    assert spreads == [1, 4, 4, 4, 4, 4, 4, 4, 4, 8]
    for held in (FRAMES_BOUND, Busy(0.3, 0.3, 2.0)):  # fewer ranks a tick would not help; no room
        assert [t.due(8, held, 4096) for _ in range(16)] == [8] * 16  # a round at 8: 64 ticks, 32 s
    assert t.due(8, None, 4096) == 8  # not measured: holds, and counts for nothing
    back = [t.due(s, ROOM, 4096) for s, n in ((8, 16), (4, 8), (2, 4)) for _ in range(n)]  # 0.4 + 0.2 < 0.7
    assert back == [8] * 15 + [4] + [4] * 7 + [2] + [2] * 3 + [1]


def test_ticks_past_the_cpu_budget_spread_thinner_though_the_thread_keeps_up() -> None:
    """Busy 60 % of the wall time (under BUSY_HIGH), half of it ticks, at 0.6 of a core against a
    budget of 0.5: the spread goes to 2 (256 ranks a tick: ticks 15 %, under the 20 % aimed at),
    over a whole round's readings (8 ticks at spread 1: two 2 s readings). Without a budget, or
    without a CPU figure, it holds. Back at 1 only when twice the ticks' part of the CPU stays
    under 80 % of the budget: ticks half of a 0.2 busy share, 0.25 x 1.5 = 0.375 < 0.4, not
    0.28 x 1.5 = 0.42."""
    over = Busy(0.3, 0.3, 2.0, cpu=0.6)
    assert thinning.next_spread(1, over, 4096, cpu_budget=0.5) == 2
    assert thinning.next_spread(1, over, 4096, cpu_budget=None) == 1
    assert thinning.next_spread(1, Busy(0.3, 0.3, 2.0), 4096, cpu_budget=0.5) == 1
    t = thinning.Thinner(cpu_budget=0.5)
    assert [t.due(1, over, 4096) for _ in range(2)] == [1, 2]
    unbudgeted = thinning.Thinner(cpu_budget=None)
    assert [unbudgeted.due(1, over, 4096) for _ in range(2)] == [1, 1]
    assert thinning.next_spread(2, Busy(0.1, 0.1, 2.0, cpu=0.25), 4096, cpu_budget=0.5) == 1
    assert thinning.next_spread(2, Busy(0.1, 0.1, 2.0, cpu=0.28), 4096, cpu_budget=0.5) == 2
    assert thinning.next_spread(2, Busy(0.1, 0.1, 2.0, cpu=0.28), 4096, cpu_budget=None) == 1
    # past the budget, ticks matter from 10 % of the wall time (the ranks' pace at its cap, they are
    # what is left): 16 % at spread 4 is under the 20 % aimed at already, so the next spread, 8
    assert thinning.next_spread(4, Busy(0.5, 0.16, 2.0, cpu=0.55), 4096, cpu_budget=0.5) == 8
    assert thinning.next_spread(4, Busy(0.5, 0.09, 2.0, cpu=0.55), 4096, cpu_budget=0.5) == 4
    assert thinning.next_spread(4, Busy(0.6, 0.16, 2.0, cpu=0.55), 4096, cpu_budget=0.5) == 8  # busy too
    assert thinning.next_spread(4, Busy(0.6, 0.16, 2.0, cpu=0.45), 4096, cpu_budget=0.5) == 4  # busy alone: 25 %
    # far past it, no further than the ticks' own aim (30 % -> 15 % at 2): the pacer cuts frames too
    assert thinning.next_spread(1, Busy(0.3, 0.3, 2.0, cpu=0.9), 4096, cpu_budget=0.5) == 2
    # the user is told what the ticks took, and the CPU when that set it
    assert thinning.spread_notice(8, Busy(0.5, 0.16, 2.0, cpu=0.55), 4096, cpu_budget=0.5) == (
        "a tick rebuilds the figures of 64 ranks of a large job: a 4096-rank job's every 32 s, its hints as "
        "often (its ticks took 16% of its data thread, which took 0.55 of a core (it may take 0.5: "
        "--data-cpu or FLOWTOP_DATA_CPU): frames come first)")
    assert "core" not in thinning.spread_notice(8, Busy(0.5, 0.16, 2.0, cpu=0.45), 4096, cpu_budget=0.5)


def test_a_spread_that_changes_nothing_for_the_largest_job_is_not_taken() -> None:
    # ticks 60 %: aimed at 20 %, so a tick must rebuild a third of the ranks it does now or fewer
    assert thinning.next_spread(1, TICKS_BOUND, 64) == 1  # 64 ranks: one tick a round at any spread
    assert thinning.next_spread(1, TICKS_BOUND, 4096) == 4  # 512 -> 128 ranks a tick: 15 %
    assert thinning.next_spread(1, TICKS_BOUND, 300) == 8  # 300 -> 64 a tick (128: 26 %): 5 ticks a round
    assert thinning.next_spread(4, TICKS_BOUND, 300) == 8  # 128 -> 64 (30 %, the most there is): 3 -> 5 ticks
    assert thinning.next_spread(2, TICKS_BOUND, 100) == 8  # 100 a tick at 2 and at 4, 64 at 8: 2 ticks a round
    assert thinning.next_spread(1, Busy(0.5, 0.3, 2.0), 4096) == 2  # 30 % -> 15 % at 256 a tick
    assert thinning.next_spread(1, TICKS_BOUND, 0) == 1  # no job left (its last round read after it went)
    assert thinning.Thinner().due(2, TICKS_BOUND, 0) == 2


def test_the_spread_notice_says_what_refreshes_how_often_and_why() -> None:
    # 512 / 2 = 256 ranks a tick; 4,096 / 256 = 16 ticks of 0.5 s
    assert thinning.spread_notice(2, Busy(0.2, 0.55, 2.0), 4096) == (
        "a tick rebuilds the figures of 256 ranks of a large job: a 4096-rank job's every 8 s, its hints as "
        "often (its ticks took 55% of its data thread: frames come first)")
    assert thinning.spread_notice(1, ROOM, 4096) == (
        "a tick rebuilds the figures of 512 ranks of a large job: a 4096-rank job's every 4 s, its hints as "
        "often (the monitor keeps up again)")


def test_a_spread_record_is_known_by_a_replay_and_refused_as_a_frame_by_older_ones() -> None:
    for s in rotation.SPREADS:
        assert thinning.spread_of(thinning.spread_record(s)) == s
    frame = wire.encode("hello", RankKey("j", "h", 1, 0, 0), 0, 1.0, {"local_rank": 0})
    assert thinning.spread_of(frame) is None
    assert thinning.spread_of(thinning.spread_record(2)[:-1] + b"\x03") is None  # a spread of 3: not one
    with pytest.raises(wire.WireError):  # a monitor that does not know the record counts it as bad
        wire.decode(thinning.spread_record(2))
    with pytest.raises(ValueError):
        Model().set_spread(3)


RANKS, PER_TICK = 10, 4


def _hello(model: Model, key: RankKey, now: float) -> None:
    model.ingest(wire.decode(wire.encode("hello", key, 0, now, {"local_rank": 0, "world_size": RANKS,
                                                                 "device": "cpu (test)", "probe_version": "t"})), now)


def _steps(model: Model, key: RankKey, first: int, now: float) -> None:
    recs = [{"step": s, "wall_s": 0.1, "tokens": 32, "drops": 0} for s in range(first, first + 5)]
    model.ingest(wire.decode(wire.encode_steps(key, first, now, recs, 0)), now)


def test_a_thinner_spread_rebuilds_fewer_ranks_a_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 ranks, 4 a tick: a round of 3 ticks; at spread 2, 2 a tick: a round of 5 ticks."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", PER_TICK)
    model = make_model()
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        _hello(model, key, 1.0)
    model.tick(1.5)  # the first tick builds every view
    now, step = 1.5, 1
    for spread, rounds in ((1, 3), (2, 5)):
        model.set_spread(spread)
        assert model.ticks_per_round(RANKS) == rounds
        for _ in range(rounds):
            now += 0.5
            for key in keys:
                _steps(model, key, step, now)
            step += 5
            built = model.views.built
            snap = model.tick(now)
            assert model.views.built - built == len([r for r in range(RANKS) if (r + model.ticks) % rounds == 0])
            assert [r.step for r in snap.jobs[0].ranks] == [step - 1] * RANKS  # every step still current


def test_a_rank_between_its_turns_is_not_hung_and_a_hang_is_seen_within_a_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """10 ranks at spread 8, 4 a tick at spread 1: one full view a tick, a round of 10 ticks (5 s),
    a hang after max(10 x 0.1 s, 2 s). Each rank steps every tick: between its turns its history
    is up to 5 s old, and it was read as hung (the 4,096-rank case: a round of 32 s against the
    30 s floor). Once every rank stops stepping (still saying hello), the job's hang shows within
    the limit and a round (its rules' share is measured once a round): 5 s here."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", PER_TICK)
    model = make_model(hint_overrides={"hang": {"floor_s": 2.0}})
    model.set_spread(8)
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        _hello(model, key, 1.0)
    assert model.ticks_per_round(RANKS) == 10
    now, step = 1.0, 1
    for _ in range(40):  # 4 rounds of healthy steps
        now += 0.5
        for key in keys:
            _steps(model, key, step, now)
        step += 5
        snap = model.tick(now)
        assert not [h for h in snap.jobs[0].hints if h.id.startswith("hang")], snap.jobs[0].hints
    hung_at = now
    for _ in range(60):  # 30 s stopped, heard every tick
        now += 0.5
        for key in keys:
            _hello(model, key, now)
        snap = model.tick(now)
        if [h for h in snap.jobs[0].hints if h.id == "hang_all"]:
            break
    assert [h for h in snap.jobs[0].hints if h.id == "hang_all"], now - hung_at
    # the limit, then at most a round to the tick that measures the rule's share (its hints read
    # every rank's history as it is then)
    assert now - hung_at <= 2.0 + 5.0, now - hung_at


def test_a_straggler_among_ranks_viewed_in_turns_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 ranks at spread 8 (a round of 10 ticks), 15 steps a tick each: between two turns a rank's
    view holds a history up to 150 steps old, more than the 120 a history keeps, so the views of a
    round had no step in common and the straggler rule, which aligns ranks by step, saw nothing.
    Its hints read every rank's history as it is at their tick: rank 3, whose steps take twice as
    long, is found, and no other rank is."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", PER_TICK)
    model = make_model()
    model.set_spread(8)
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for key in keys:
        _hello(model, key, 1.0)
    now, step, seen = 1.0, 1, set()
    for _ in range(60):
        now += 0.5
        for key in keys:
            recs = [{"step": s, "wall_s": 0.2 if key.rank == 3 else 0.1, "tokens": 32, "drops": 0}
                    for s in range(step, step + 15)]
            model.ingest(wire.decode(wire.encode_steps(key, step, now, recs, 0)), now)
        step += 15
        snap = model.tick(now)
        seen |= {h.target for h in snap.jobs[0].hints if h.id == "straggler"}
    assert seen == {"rank 3"}


def test_hints_read_a_rank_between_its_turns_as_it_is_now() -> None:
    """Model._as_now: a view whose rank stepped since its turn gets the rank's history and
    telemetry as they are; one whose rank did not step (a slow step) but sampled its device again
    gets the new telemetry and keeps its history; one with nothing new is the same object."""
    model = make_model()
    key = RankKey("big", "h0", 500, 0, 0)
    _hello(model, key, 1.0)
    _steps(model, key, 1, 1.0)  # steps 1-5
    model.ingest(wire.decode(wire.encode("telemetry", key, 2, 1.0, {"gpu": {"gpu_util": 100.0}, "proc": {}})), 1.0)
    job = model.snapshot(1.0).jobs[0]
    state = model.ranks[key]
    assert Model._as_now(job, [state]) is job  # nothing new
    model.ingest(wire.decode(wire.encode("telemetry", key, 3, 9.0, {"gpu": {"gpu_util": 99.0}, "proc": {}})), 9.0)
    sampled = Model._as_now(job, [state]).ranks[0]
    assert sampled.telemetry.received_at == 9.0 and sampled.telemetry.device["gpu_util"] == 99.0
    assert sampled.history is job.ranks[0].history
    _steps(model, key, 6, 10.0)  # steps 6-10
    stepped = Model._as_now(job, [state]).ranks[0]
    assert list(stepped.history.steps) == list(range(1, 11)) and stepped.step == job.ranks[0].step == 5


def test_a_replay_spreads_its_ticks_where_the_recording_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", PER_TICK)
    path = tmp_path / "run.rec"
    rec = Recorder(path)
    rec.start(0.0)
    keys = [RankKey("big", f"h{r // 2}", 500 + r, r, 0) for r in range(RANKS)]
    for i, key in enumerate(keys):
        rec.write(0.1, wire.encode("hello", key, 0, 0.1, {"local_rank": 0, "world_size": RANKS,
                                                           "device": "cpu (test)", "probe_version": "t"}))
    rec.write(1.2, thinning.spread_record(2))  # the live monitor thinned at 1.2 s
    rec.write(2.7, thinning.spread_record(1))  # and went back at 2.7 s
    rec.write(3.1, wire.encode("hello", keys[0], 1, 3.1, {"local_rank": 0, "world_size": RANKS,
                                                           "device": "cpu (test)", "probe_version": "t"}))
    rec.close()
    assert [t for t, _ in read_recording(path)][-3:] == [1.2, 2.7, 3.1]
    model = make_model()
    seen: list[tuple[float, int]] = []
    replay_all(path, model, on_tick=lambda snap: seen.append((snap.taken_at, model.spread)))
    assert seen == [(0.5, 1), (1.0, 1), (1.5, 2), (2.0, 2), (2.5, 2), (3.0, 1), (3.5, 1)]
    assert model.rejected == 0  # the records are not bad frames


class _SlowHints:
    """A hint engine whose every evaluation takes ``seconds`` of the data thread (thousands of
    ranks' rules on a slow box): ticks crowd out frames."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def evaluate(self, job, now, phase=None):  # noqa: ANN001, ANN201 - the HintEvaluator protocol
        time.sleep(self.seconds)
        return ()


def test_a_live_monitor_whose_ticks_crowd_out_frames_thins_them_and_records_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four real publishers, 2 ranks a tick: a round of 2 ticks, the rules in two shares, one an
    evaluation a tick. At 0.4 s an evaluation the data thread spends 80 % on ticks: the collector
    spreads them twice as thin (a round of 4 ticks, 40 %) and tells the user; with quick rules it
    goes back to 1. Both changes are in the recording, where the replay finds them."""
    monkeypatch.setattr(rotation, "RANKS_PER_TICK", 2)
    monkeypatch.setattr(pacing, "RENEW_S", 0.5)
    monkeypatch.setattr("flowtop.monitor.governor.RENEW_S", 0.5)
    hints = _SlowHints()
    model = Model(hint_engine=hints)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = MonitorThread(listen, collector=Collector(model, listen, recorder=Recorder(tmp_path / "live.rec")))
    pubs = [Publisher(RankKey("big", "h", 4000 + r, r, 0), listen) for r in range(4)]
    for r, pub in enumerate(pubs):
        pub.hello_fields = {"local_rank": r, "world_size": 4, "device": "cpu (test)", "probe_version": "test"}
        pub.start()

    def wait(cond, timeout: float) -> bool:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.1)
        return cond()

    try:
        assert wait(lambda: len(monitor.call(lambda: model.ranks)) == 4, 10)
        hints.seconds = 0.4
        assert wait(lambda: monitor.call(lambda: model.spread) == 2, 15)
        texts = [n.text for n in monitor.call(lambda: tuple(model.notices.history))]
        assert any(t.startswith("a tick rebuilds the figures of 1 ranks") and "of its data thread" in t for t in texts), texts
        hints.seconds = 0.0
        assert wait(lambda: monitor.call(lambda: model.spread) == 1, 15)
    finally:
        for pub in pubs:
            pub.close()
        monitor.close()
    spreads = [thinning.spread_of(frame) for _, frame in read_recording(tmp_path / "live.rec")]
    assert [s for s in spreads if s is not None][:2] == [2, 1]


def test_a_forged_spread_record_is_refused_live_and_in_the_replay(tmp_path: Path) -> None:
    """A peer that sends the exact bytes of a spread record is refused by the live monitor (not a
    wire frame) and must be refused again in the replay, not change how it spreads its ticks."""
    from flowtop.monitor.recording import read_frames

    path = tmp_path / "forged.rec"
    rec = Recorder(path)
    collector = Collector(make_model(), "tcp://127.0.0.1:1", recorder=rec)  # not started: frames handed in
    rec.start(0.0)
    collector.handle_frame(thinning.spread_record(8), 1.0)
    collector.handle_frame(wire.encode("hello", RankKey("j", "h", 1, 0, 0), 0, 1.2, {
        "local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "t"}), 1.2)
    rec.write(1.4, thinning.spread_record(2), received=False)  # the monitor's own record
    rec.close()
    live = collector.model
    assert live.spread == 1 and live.rejected == 1 and rec.frames == 2  # two received, one of them refused
    replayed = make_model()
    replay_all(path, replayed)
    assert replayed.spread == 2  # its own record applies; the forged one does not
    assert replayed.rejected == 1 and dict(replayed.rejected_reasons) == dict(live.rejected_reasons)
    assert len(list(read_frames(path))) == 2  # the frames received, not the monitor's record
