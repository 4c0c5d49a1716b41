"""The monitor paces its ranks when too many talk (flowtop.monitor.pacing): a "pace" command on the data
connection makes a real probe publisher hold its step records longer, for a while."""

from __future__ import annotations

import time
from typing import Callable

import pytest

from flowtop.monitor import pacing
from flowtop.tools.demo.launch import free_port_pair
from monitor_thread import MonitorThread
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey


def test_the_pace_asked_follows_the_number_of_live_ranks() -> None:
    # ranks / 10,000 step frames a second, in steps of 50 ms up, at most 2 s; none up to 1,000
    assert pacing.pace_for(256) is None and pacing.pace_for(1000) is None
    assert pacing.pace_for(1001) == 0.15  # 0.1001 s, up to the next 50 ms
    assert pacing.pace_for(4096) == 0.45  # 0.4096 s: 4,096 / 0.45 = 9,102 step frames/s
    assert pacing.pace_for(50_000) == wire.MAX_PACE_S


def test_pace_commands_are_validated() -> None:
    assert wire.decode_control(wire.encode_control("pace", None, None, 0.45)) == ("pace", None, None, 0.45)
    for bad in (("pace", None, None, None), ("pace", "j", None, 2.5), ("pace", "j", None, -1.0),
                ("kernels_now", None, 0, None), ("kernels_now", "j", 0, 0.3)):
        with pytest.raises(wire.WireError):
            wire.decode_control(wire.encode_control(*bad))


def test_a_paced_probe_sends_fewer_frames_loses_no_step_and_the_pace_lapses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 2)  # one live rank is "too many": pace 0.5 s
    monkeypatch.setattr(pacing, "RENEW_S", 0.5)
    monkeypatch.setattr("flowtop.monitor.collector.RENEW_S", 0.5)
    monkeypatch.setattr(wire, "PACE_TTL_S", 1.5)
    monitor = MonitorThread()
    pub = Publisher(RankKey("paced", "h", 4321, 0, 0), monitor.listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    samples: dict[bool, list[float]] = {True: [], False: []}  # a paced job (telemetry) and one that is not
    for paced in (True, False):
        pub.add_tick(0.2, lambda paced=paced: samples[paced].append(time.monotonic()), paced=paced)
    pub.start()
    try:
        deadline = time.monotonic() + 10
        while pub.current_flush_s() < 0.5 and time.monotonic() < deadline:  # the first hello makes it live
            time.sleep(0.05)
        assert pub.current_flush_s() == 0.5
        before = monitor.snapshot().received
        start = time.monotonic()
        for step in range(1, 301):  # 3 s of 10 ms steps
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.01)
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 300, 10)
        frames = snap.received - before
        # ~3 s / 0.5 s = 6 step frames and a hello or two, not the ~30 of a 0.1 s flush
        assert snap.jobs[0].ranks[0].step == 300 and snap.jobs[0].ranks[0].lost_messages == 0
        assert frames <= 12, frames
        # The paced job runs every 0.2 s x (0.5 s pace / 0.1 s flush) = 1 s meanwhile, the other every 0.2 s
        seen = {paced: [t for t in ts if t >= start] for paced, ts in samples.items()}
        assert 2 <= len(seen[True]) <= 5 and len(seen[False]) >= 10, seen
        texts = [n.text for n in monitor.call(lambda: monitor.collector.notices.take())]
        assert any("asked to send its steps every 0.50 s" in t for t in texts), texts
        # the monitor stops pacing; the probe's own pace is back once the last command lapsed
        monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 10_000)
        deadline = time.monotonic() + 10
        while pub.current_flush_s() != 0.1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pub.current_flush_s() == 0.1
    finally:
        pub.close()
        monitor.close()


def test_a_paced_job_is_stretched_by_the_pace_to_at_most_five_seconds() -> None:
    """Telemetry under a pace: its interval times pace ÷ flush_s (4,096 ranks: 1 s -> 4.5 s), never
    beyond 5 s (the monitor reads a sample older than 10 s as stale), never shorter than asked."""
    from probe.transport.publisher import MAX_PACED_TICK_S

    pub = Publisher(RankKey("paced", "h", 4321, 0, 0), "tcp://127.0.0.1:1")  # not started: nothing sent
    assert pub.paced_interval(1.0) == 1.0  # not paced
    pub._handle_control([wire.encode_control("pace", None, None, 0.45)])  # as the link hands it over
    assert pub.current_flush_s() == 0.45
    assert pub.paced_interval(1.0) == pytest.approx(4.5)
    assert pub.paced_interval(2.0) == MAX_PACED_TICK_S == 5.0
    assert pub.paced_interval(30.0) == 30.0
    pub._handle_control([wire.encode_control("pace", None, None, 0.05)])  # below the probe's own 0.1 s
    assert pub.paced_interval(1.0) == 1.0


def test_a_busy_monitor_lowers_its_budget_and_raises_it_back_when_idle() -> None:
    """4,096 live ranks, a data thread busy 90 % at each renewal: the budget goes 10,000 -> 6,000
    -> 3,600 -> 2,160 -> 1,296 step frames a second (x 0.6), the pace 4,096 / budget up to the
    next 50 ms, at most 2 s; idle (20 %) it grows back by x 1.5 a renewal to 10,000 and no further;
    busy between 40 and 70 % (or not measured) it holds."""
    p = pacing.Pacer()
    paces = [p.due(2.0 * i, 4096, 0.9) for i in range(5)]
    # 4096/6000 = 0.683 -> 0.70; 4096/3600 = 1.138 -> 1.15; 4096/2160 = 1.896 -> 1.90; 4096/1296 = 3.2 -> 2
    assert paces == [0.70, 1.15, 1.90, wire.MAX_PACE_S, wire.MAX_PACE_S]
    assert p.budget == pytest.approx(10_000 * 0.6 ** 5)  # 777.6
    assert p.due(9.0, 4096, 0.2) is None  # not due: one renewal every RENEW_S
    assert p.due(12.0, 4096, 0.55) == wire.MAX_PACE_S and p.budget == pytest.approx(777.6)  # holds
    assert p.due(14.0, 4096, None) == wire.MAX_PACE_S and p.budget == pytest.approx(777.6)  # holds
    # 777.6 x 1.5 = 1,166.4 -> 3.5 s: 2; x 2.25 = 1,749.6 -> 2.34 s: 2; x 3.375 = 2,624.4 -> 1.56 -> 1.60;
    # x 5.0625 = 3,936.6 -> 1.04 -> 1.05; x 7.59 = 5,904.9 -> 0.694 -> 0.70; x 11.39 = 8,857 -> 0.4625 -> 0.50;
    # then 10,000 (capped): 0.4096 -> 0.45, as without load
    back = [p.due(16.0 + 2 * i, 4096, 0.2) for i in range(8)]
    assert back == [wire.MAX_PACE_S, wire.MAX_PACE_S, 1.60, 1.05, 0.70, 0.50, 0.45, 0.45]
    assert p.budget == 10_000


def test_a_busy_monitor_does_not_bank_a_pace_for_ranks_it_does_not_pace() -> None:
    p = pacing.Pacer()
    for i in range(10):  # 8 ranks: no budget down to 250 frames a second would pace them (8 / 250 < 0.1 s)
        assert p.due(2.0 * i, 8, 1.0) is None
    assert p.scale == 1.0  # so 4,096 ranks joining now get the pace of a monitor that keeps up
    assert p.due(20.0, 4096, 0.5) == 0.45


def test_the_busy_share_is_the_wall_time_not_spent_waiting() -> None:
    t = [100.0]
    meter = pacing.BusyMeter(clock=lambda: t[0])
    t[0] += 0.05
    assert meter.share() is None  # under 0.1 s: no reading, the interval goes on
    meter.idle(0.5)
    t[0] += 1.95  # 2 s since the start, 0.5 s of it idle
    assert meter.share() == pytest.approx(0.75)
    t[0] += 1.0
    assert meter.share() == 1.0  # no idle wait reported: busy all along
    meter.idle(3.0)  # more idle than wall time (a clock step): clamped
    t[0] += 2.0
    assert meter.share() == 0.0


def test_the_pace_notice_says_why() -> None:
    assert pacing.pace_notice(4096, 0.45, 10_000, 0.2) == (
        "4096 ranks talk: each is asked to send its steps every 0.45 s (the monitor takes ~10,000 step frames a second)")
    assert pacing.pace_notice(4096, 1.15, 3600, 0.91) == (
        "4096 ranks talk: each is asked to send its steps every 1.15 s (as many as this monitor keeps up with: "
        "~3,600 step frames a second; its data thread was busy 91% of the last 2 s)")
    assert pacing.pace_notice(12, None, 10_000, None) == "12 ranks talk: they send their steps at their own pace again"


class _SlowHints:
    """A hint engine whose evaluation takes ``seconds`` of the data thread (a monitor on a slow or
    shared machine, or with thousands of ranks): the thread is busy, not waiting for frames."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def evaluate(self, job, now, phase=None):  # noqa: ANN001, ANN201 - the HintEvaluator protocol
        time.sleep(self.seconds)
        return ()


def test_a_monitor_that_cannot_keep_up_slows_its_ranks_and_lets_them_go_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real collector whose ticks keep its data thread ~90 % busy asks a real probe publisher for
    longer and longer paces (its own budget, 8 step frames a second, asks 0.15 s of one rank); once
    the ticks are quick again the pace comes back to 0.15 s. No step is lost either way."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.model import Model

    monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 8)  # one rank: 1 / 8 = 0.125 -> 0.15 s
    monkeypatch.setattr(pacing, "RENEW_S", 0.5)
    monkeypatch.setattr("flowtop.monitor.collector.RENEW_S", 0.5)
    monkeypatch.setattr(wire, "PACE_TTL_S", 1.5)
    hints = _SlowHints()
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = MonitorThread(listen, collector=Collector(Model(hint_engine=hints), listen))
    pub = Publisher(RankKey("busy", "h", 4321, 0, 0), monitor.listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    step = [0]

    def steps_until(cond: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            step[0] += 1
            pub.publish("step", {"step": step[0], "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.01)
        return cond()

    try:
        assert steps_until(lambda: pub.current_flush_s() == 0.15, 10)  # the rank count's pace
        hints.seconds = 0.45  # of every 0.5 s tick
        # 8 x 0.6 = 4.8 frames/s: 0.25 s; x 0.36 = 2.88: 0.35 s; ...
        assert steps_until(lambda: pub.current_flush_s() >= 0.35, 15), pub.current_flush_s()
        texts = [n.text for n in monitor.call(lambda: tuple(monitor.collector.notices.history))]
        assert any("as many as this monitor keeps up with" in t and "its data thread was busy" in t for t in texts), texts
        hints.seconds = 0.0
        assert steps_until(lambda: pub.current_flush_s() == 0.15, 20), pub.current_flush_s()
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == step[0], 10)
        assert snap.jobs[0].ranks[0].step == step[0] and snap.jobs[0].ranks[0].lost_messages == 0
    finally:
        pub.close()
        monitor.close()


def test_ranks_whose_frames_queue_behind_a_backlog_are_still_paced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Relayed frames count when their relay got them: behind an 8 s backlog (the monitor or its
    link falling behind) every rank looks silent for 8 s while it still sends. The pace must not
    lapse then — it is when the monitor needs it most."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.relays import encode_stamp
    from flowtop.monitor.wiring import make_model

    monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 20)  # 3 ranks / 20 = 0.15 s
    collector = Collector(make_model(), "tcp://127.0.0.1:1")  # not started: frames handed in
    relay = "node-a:7:00000001"

    def batch(now: float, relay_clock: float, seq: int) -> None:
        frames = [wire.encode("hello", RankKey("j", "node-a", 100 + r, r, 0), seq, relay_clock,
                              {"local_rank": r, "world_size": 3, "device": "cpu (test)", "probe_version": "t"})
                  for r in range(3)]
        collector.handle_batch([encode_stamp(relay, relay_clock, [0, 0, 0]), *frames], now)

    batch(100.0, 1000.0, 1)  # no queueing: the relay's clock is 900 s behind the monitor's
    collector._pace(100.0)
    assert collector.pacer.current == 0.15
    batch(110.0, 1002.0, 2)  # sent at relay time 1002 = monitor 102, arrived at 110: 8 s in queues
    assert collector.model.relays.lag(RankKey("j", "node-a", 100, 0, 0)) == pytest.approx(8.0, abs=0.01)  # less the drift allowance
    assert all(110.0 - st.last_recv > 5.0 for st in collector.model.ranks.values())  # older than STALE_AFTER_S
    collector._pace(110.0)
    assert collector.pacer.current == 0.15  # all three still paced
