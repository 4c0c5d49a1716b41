"""The monitor paces its ranks when too many talk (flowtop.monitor.pacing): a "pace" command on the data
connection makes a real probe publisher hold its step records longer, for a while."""

from __future__ import annotations

import time

import pytest

from flowtop.monitor import pacing
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
