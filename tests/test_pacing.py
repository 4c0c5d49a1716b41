"""The monitor paces its ranks when too many talk (flowtop.monitor.pacing): a "pace" command on the data
connection makes a real probe publisher hold its step records longer, for a while."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from typing import Any, Callable

import pytest

from flowtop.monitor import pacing
from flowtop.monitor.model import Model
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
    assert wire.decode_control(wire.encode_control("pace", None, None, 0.45)) == ("pace", None, None, 0.45, None)
    assert wire.decode_control(wire.encode_control("pace", None, None, 0.45, 10.0)).telemetry_max_s == 10.0
    # telemetry_max_s is advisory: one out of range (a later monitor's), or on another command,
    # is left out; the pace itself still holds
    for odd in (0.5, 61.0, float("nan"), float("inf"), True, "10"):
        assert wire.decode_control(wire.encode_control("pace", None, None, 0.45, odd)) == (  # type: ignore[arg-type]
            "pace", None, None, 0.45, None)
    assert wire.decode_control(wire.encode_control("kernels_now", "j", 0, None, 10.0)).telemetry_max_s is None
    for bad in (("pace", None, None, None), ("pace", "j", None, 2.5), ("pace", "j", None, -1.0),
                ("kernels_now", None, 0, None), ("kernels_now", "j", 0, 0.3)):
        with pytest.raises(wire.WireError):
            wire.decode_control(wire.encode_control(*bad))


def test_a_paced_probe_sends_fewer_frames_loses_no_step_and_the_pace_lapses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 2)  # one live rank is "too many": pace 0.5 s
    monkeypatch.setattr(pacing, "RENEW_S", 0.5)
    monkeypatch.setattr("flowtop.monitor.governor.RENEW_S", 0.5)
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
        # the monitor's pace lets telemetry stretch to its PACED_TELEMETRY_S (10 s), not the 5 s a
        # probe keeps to when a pace does not say: 3 s x (0.5 s / 0.1 s) = 15 s, down to 10 s
        assert pub.paced_interval(3.0) == pacing.PACED_TELEMETRY_S == 10.0
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


def test_a_paced_job_is_stretched_by_the_pace_to_at_most_what_the_pace_allows() -> None:
    """Telemetry under a pace: its interval times pace ÷ flush_s (4,096 ranks: 1 s -> 4.5 s), never
    shorter than asked, never beyond the pace's telemetry_max_s (10 s from this monitor, whose hints
    read a sample older than 25 s as stale), or 5 s when the pace does not say (an older monitor
    reads a sample older than 10 s as stale)."""
    from probe.transport.publisher import MAX_PACED_TICK_S

    pub = Publisher(RankKey("paced", "h", 4321, 0, 0), "tcp://127.0.0.1:1")  # not started: nothing sent
    assert pub.paced_interval(1.0) == 1.0  # not paced
    pub._handle_control([wire.encode_control("pace", None, None, 0.45)])  # as the link hands it over
    assert pub.current_flush_s() == 0.45
    assert pub.paced_interval(1.0) == pytest.approx(4.5)
    assert pub.paced_interval(2.0) == MAX_PACED_TICK_S == 5.0  # an older monitor's pace: no telemetry_max_s
    pub._handle_control([wire.encode_control("pace", None, None, 2.0, 10.0)])  # this monitor's, the longest pace
    assert pub.paced_interval(1.0) == 10.0
    assert pub.paced_interval(0.25) == 5.0
    pub._handle_control([wire.encode_control("pace", None, None, 2.0)])  # an older monitor's again
    assert pub.paced_interval(1.0) == 5.0
    assert pub.paced_interval(30.0) == 30.0
    pub._handle_control([wire.encode_control("pace", None, None, 0.05)])  # below the probe's own 0.1 s
    assert pub.paced_interval(1.0) == 1.0


def test_a_paces_telemetry_limit_lapses_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe of 4,096 ranks holds its records 0.45 s on its own (probe.wire.pace) and stretches
    its telemetry by as much, to 5 s; a monitor's pace that allowed 10 s stops allowing it when
    the pace lapses (the next monitor may be an older one, which reads 10 s as stale)."""
    monkeypatch.setattr(wire, "PACE_TTL_S", 0.2)
    pub = Publisher(RankKey("paced", "h", 4321, 0, 0), "tcp://127.0.0.1:1", world_size=4096)  # not started
    assert pub.current_flush_s() == 0.45 and pub.paced_interval(3.0) == 5.0
    pub._handle_control([wire.encode_control("pace", None, None, 0.45, 10.0)])
    assert pub.paced_interval(3.0) == 10.0
    time.sleep(0.3)
    assert pub.current_flush_s() == 0.45 and pub.paced_interval(3.0) == 5.0


def test_a_paced_probe_stretches_its_steady_hello(monkeypatch: pytest.MonkeyPatch) -> None:
    """While its step frames leave, a probe's hello goes every HELLO_MAX_S (10 s), as the heartbeat
    for a monitor that restarted unseen; a paced one stretches that by the pace as it stretches its
    telemetry, up to HELLO_PACED_MAX_S (30 s): at 4,096 ranks those hellos were a tenth of the
    frames the monitor read. Real sockets, the intervals scaled down (0.6 s, up to 3 s)."""
    from probe.transport import outbox as outbox_mod
    from probe.transport import publisher as publisher_mod
    from probe.transport import sender as sender_mod

    monkeypatch.setattr(outbox_mod, "HELLO_S", 0.3)
    monkeypatch.setattr(outbox_mod, "HELLO_MAX_S", 0.6)
    monkeypatch.setattr(outbox_mod, "HELLO_PACED_MAX_S", 3.0)
    hellos: list[float] = []
    encode = publisher_mod.wire.encode

    def counted(kind: str, *args: Any, **kwargs: Any) -> bytes:
        if kind == "hello":
            hellos.append(time.monotonic())
        return encode(kind, *args, **kwargs)

    monkeypatch.setattr(publisher_mod.wire, "encode", counted)
    monitor = MonitorThread()
    pub = Publisher(RankKey("hb", "h", 4321, 0, 0), monitor.listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    assert pub.hello_max_s() == 0.6
    pub.start()
    step = 0

    def steps_for(seconds: float) -> tuple[float, float]:
        nonlocal step
        start = time.monotonic()
        while time.monotonic() < start + seconds:
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.01)
        return start, time.monotonic()

    try:
        deadline = time.monotonic() + 10
        while not hellos and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hellos, "no hello"
        a, b = steps_for(3.0)
        unpaced = [t for t in hellos if a <= t <= b]
        pub._handle_control([wire.encode_control("pace", None, None, 0.5)])  # x5: 0.6 s -> 3 s
        assert pub.hello_max_s() == pytest.approx(3.0)
        a, b = steps_for(3.0)
        paced = [t for t in hellos if a <= t <= b]
    finally:
        pub.close()
        monitor.close()
    assert len(unpaced) >= 3 and len(paced) <= 2, (unpaced, paced)  # ~5 against at most 2
    # the numbers as shipped: 10 s, and 30 s at the longest pace (a 0.15 s pace: 15 s)
    monkeypatch.undo()
    pub = Publisher(RankKey("hb", "h", 4321, 0, 0), "tcp://127.0.0.1:1")  # not started: nothing sent
    assert pub.hello_max_s() == outbox_mod.HELLO_MAX_S == 10.0
    assert not hasattr(sender_mod, "HELLO_MAX_S")  # one binding: the sender's longest sleep reads the outbox's
    # ... nor a copy in the publisher, which a reader would read stale under a patch of the outbox's
    assert not [n for n in ("HELLO_S", "HELLO_MAX_S", "STEPS_ALIVE_S", "LOOK_S") if hasattr(publisher_mod, n)]
    own = Publisher(RankKey("hb", "h", 4322, 0, 0), "tcp://127.0.0.1:1", world_size=4096)
    assert own.current_flush_s() == 0.45 and own.hello_max_s() == 10.0  # its own start pace: not stretched
    pub._handle_control([wire.encode_control("pace", None, None, 0.15)])
    assert pub.hello_max_s() == pytest.approx(15.0)
    pub._handle_control([wire.encode_control("pace", None, None, 2.0)])
    assert pub.hello_max_s() == outbox_mod.HELLO_PACED_MAX_S == 30.0


def test_a_probe_of_a_large_job_starts_at_the_pace_its_monitor_would_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """4,096 ranks at their own 0.1 s send ~41,000 step frames a second until a monitor's first
    pace reaches them all (at the job's start, and again when their monitor restarted and the pace
    lapsed). A probe that knows its job's size holds its records as such a monitor asks: 4,096 /
    10,000 = 0.41 s, up to 0.45 s (~9,100 frames a second); its telemetry is stretched as a paced
    rank's (x 4.5). A monitor's own pace holds over it while in force, shorter or longer."""
    key = RankKey("big", "h", 4321, 5, 0)
    pub = Publisher(key, "tcp://127.0.0.1:1", world_size=4096)  # not started: nothing sent
    assert pub.current_flush_s() == 0.45 and pub.paced_interval(1.0) == pytest.approx(4.5)
    assert pacing.pace_for(4096) == 0.45  # the monitor's budget starts where the probes do
    pub._handle_control([wire.encode_control("pace", None, None, 2.0)])
    assert pub.current_flush_s() == 2.0
    monkeypatch.setattr(wire, "PACE_TTL_S", 1.0)
    pub._handle_control([wire.encode_control("pace", None, None, 0.2)])  # a monitor hearing fewer
    assert pub.current_flush_s() == 0.2
    time.sleep(1.1)  # the pace lapsed: back to the job's own start pace, not to 0.1 s
    assert pub.current_flush_s() == 0.45
    assert Publisher(key, "tcp://127.0.0.1:1", world_size=1000).current_flush_s() == 0.1  # 0.1 s will do
    assert Publisher(key, "tcp://127.0.0.1:1", flush_s=1.0, world_size=4096).current_flush_s() == 1.0


def test_an_attached_probe_takes_its_start_pace_from_the_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import probe

    for name, value in (("FLOWTOP_KERNELS", "0"), ("FLOWTOP_TELEMETRY", "0"), ("FLOWTOP_ADDR", "tcp://127.0.0.1:1"),
                        ("RANK", "17"), ("WORLD_SIZE", "2048"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    assert probe.attach(job="big")
    try:
        pub = probe._current().publisher
        assert pub.key.rank == 17 and pub.current_flush_s() == 0.25  # 2,048 / 10,000 = 0.2048 s, up to 0.25
    finally:
        probe.detach()


def test_a_probe_that_learns_its_job_size_from_the_process_group_takes_its_start_pace(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No launcher variable: rank 0 of 1 at first (0.1 s); the process group then says rank 9 of
    4,096 (probe.runtime: re-identification), and the probe holds its records 0.45 s from then on."""
    from dataclasses import replace as _replace

    import probe
    from probe import identity

    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK",
                 "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert probe.attach(job="pg")
    try:
        p = probe._current()
        assert p.ident.rank_source == "none" and p.publisher.current_flush_s() == 0.1
        group = _replace(p.ident, rank=9, world_size=4096, rank_source="process group")
        monkeypatch.setattr(identity, "from_env", lambda **_: group)
        p._reidentify()
        assert p.publisher.current_flush_s() == 0.45
    finally:
        probe.detach()


def test_a_busy_monitor_lowers_its_budget_and_raises_it_back_when_there_is_room() -> None:
    """4,096 live ranks, a data thread 75 % busy, 65 % on frames: the budget goes 10,000 ->
    6,000 -> 3,600 -> 2,160 -> 1,296 step frames a second (x 0.6: frames cut to (0.5 - 0.1) / 0.65
    = 0.62 of their share would leave it at 50 %, a milder cut than SLOWER), the pace 4,096 / budget up to the
    next 50 ms, at most 2 s; each cut is followed by a renewal that only watches (frames queued
    before the ranks heard it), and a cut that no longer changes the pace (at 2 s) is not banked.
    Busy with its ticks, not its frames, it holds; with room, it grows back by x 1.5 to 10,000."""
    busy, ticks_bound = pacing.Busy(frames=0.65, ticks=0.1, span_s=2.0), pacing.Busy(0.05, 0.9, 2.0)
    p = pacing.Pacer()
    paces = [p.due(2.0 * i, 4096, busy) for i in range(10)]
    # 4096/6000 = 0.683 -> 0.70; 4096/3600 = 1.138 -> 1.15; 4096/2160 = 1.896 -> 1.90; 4096/1296 = 3.2 -> 2
    assert paces == [0.70, 0.70, 1.15, 1.15, 1.90, 1.90, 2.0, 2.0, 2.0, 2.0]
    assert p.budget == pytest.approx(1296) and p.load_bound
    assert p.due(19.0, 4096, busy) is None  # not due: one renewal every RENEW_S
    assert p.due(20.0, 4096, ticks_bound) == 2.0 and p.budget == pytest.approx(1296)  # fewer frames would not help
    assert p.due(22.0, 4096, pacing.Busy(0.3, 0.3, 2.0)) == 2.0 and p.budget == pytest.approx(1296)  # 0.6 + 0.15: no room
    assert p.due(24.0, 4096, None) == 2.0 and p.budget == pytest.approx(1296)  # not measured: holds
    # room (0.3 busy, + 0.1 x 0.5 grown): 1,944 -> 2.1 s: 2; 2,916 -> 1.40 -> 1.45; 4,374 -> 0.936 -> 0.95;
    # 6,561 -> 0.624 -> 0.65; 9,841.5 -> 0.416 -> 0.45; then 10,000 (capped): 0.4096 -> 0.45, as without load
    back = [p.due(26.0 + 2 * i, 4096, pacing.Busy(0.1, 0.2, 2.0)) for i in range(6)]
    assert back == [2.0, 1.45, 0.95, 0.65, 0.45, 0.45]
    assert p.budget == 10_000 and not p.load_bound


def test_a_monitor_far_past_its_limits_cuts_its_budget_by_as_much_as_its_frames_share_says() -> None:
    """A cut leaves the thread's frames, its ticks as they were, halfway between where it would be
    cut again (ticks + frames past BUSY_HIGH, 0.7) and where the budget grows back (ticks + 1.5 x
    frames under 0.7). 100 % busy, 60 % on frames (a 4,096-rank job starting on a saturated box):
    frames (0.3 + 0.3 / 1.5) / 2 = 0.25, x 0.42: 4,167 step frames a second, 4,096 / 4,167 = 0.98
    -> 1.0 s; the renewal after only watches; its frames at 0.25 then (0.65 busy) neither cut nor
    grow it. 80 % busy, 45 % on frames: frames 0.29, x 0.65, milder than SLOWER: x 0.6, 2,500,
    1.64 -> 1.65 s. 100 % busy, 70 % on frames: frames 0.33, x 0.48, 4,762, 0.86 -> 0.9 s. Busier
    with its ticks than its frames: no size, x 0.6 (0.70 s). Past a CPU budget of 0.5 core (0.7 of
    a core, 50 % busy, 30 % on frames: 0.42 of the core), halfway between the budget and
    CPU_ROOM x 0.5 = 0.45: (0.475 - 0.28) / 0.42 = x 0.46, 4,643 -> 0.9 s."""
    p = pacing.Pacer()
    assert p.due(0.0, 4096, pacing.Busy(frames=0.6, ticks=0.4, span_s=2.0)) == 1.0
    assert p.budget == pytest.approx(10_000 * 0.25 / 0.6)
    assert p.due(2.0, 4096, pacing.Busy(0.6, 0.4, 2.0)) == 1.0  # only watches
    assert [p.due(t, 4096, pacing.Busy(0.25, 0.4, 2.0)) for t in (4.0, 6.0, 8.0)] == [1.0] * 3  # holds
    assert p.budget == pytest.approx(10_000 * 0.25 / 0.6)
    assert p.due(10.0, 4096, pacing.Busy(0.45, 0.35, 2.0)) == 1.65 and p.budget == pytest.approx(2500)
    assert pacing.cut_for(pacing.Busy(0.7, 0.3, 2.0), None) == pytest.approx((0.4 + 0.4 / 1.5) / 2 / 0.7)
    assert pacing.Pacer().due(0.0, 4096, pacing.Busy(0.7, 0.3, 2.0)) == 0.9
    assert pacing.cut_for(pacing.Busy(0.3, 0.6, 2.0), None) == pacing.SLOWER
    assert pacing.Pacer().due(0.0, 4096, pacing.Busy(0.3, 0.6, 2.0)) == 0.7
    cpu_bound = pacing.Busy(frames=0.3, ticks=0.2, span_s=2.0, cpu=0.7)
    assert pacing.cut_for(cpu_bound, 0.5) == pytest.approx(0.195 / 0.42)
    assert pacing.Pacer(cpu_budget=0.5).due(0.0, 4096, cpu_bound) == 0.9
    assert pacing.Pacer(cpu_budget=None).due(0.0, 4096, cpu_bound) == 0.45  # no budget: 50 % busy keeps up


def test_a_busy_monitor_does_not_bank_a_pace_for_ranks_it_does_not_pace() -> None:
    p = pacing.Pacer()
    for i in range(10):  # 8 ranks: no budget down to 250 frames a second would pace them (8 / 250 < 0.1 s)
        assert p.due(2.0 * i, 8, pacing.Busy(0.5, 0.5, 2.0)) is None
    assert p.scale == 1.0  # so 4,096 ranks joining now get the pace of a monitor that keeps up
    assert p.due(20.0, 4096, pacing.Busy(0.3, 0.3, 2.0)) == 0.45


def test_a_monitor_behind_its_ranks_asks_for_half_of_what_it_got_through() -> None:
    """4,096 live ranks at the budget of a monitor that keeps up (10,000: 0.45 s). Its frames wait
    3 s in queues and it took 8,000 step frames a second: the budget is 4,000 at once (a thread
    that is behind reads 100 % busy at any input rate; cuts of x 0.6 would take four renewals),
    4,096 / 4,000 = 1.024 -> 1.05 s. Still behind, having taken 7,000: 3,500 at the next renewal
    (no renewal waits: the figure is what got through), 1.17 -> 1.20 s. Still behind, having taken
    9,000: it holds (never grows while behind). Caught up with room: x 1.5, 5,250, 0.78 -> 0.80 s."""
    saturated = pacing.Busy(frames=0.7, ticks=0.3, span_s=2.0, step_frames_per_s=8000)
    idle = pacing.Pacer()  # frames queued while its data thread has room: a congested link, not it
    assert idle.due(0.0, 4096) == 0.45 and idle.due(2.0, 4096, pacing.Busy(0.1, 0.05, 2.0, 8000), behind_s=3.0) == 0.45
    p = pacing.Pacer()
    assert p.due(0.0, 4096) == 0.45
    assert p.due(2.0, 4096, saturated, behind_s=3.0) == 1.05 and p.budget == pytest.approx(4000)
    assert p.due(4.0, 4096, replace(saturated, step_frames_per_s=7000), behind_s=2.0) == 1.2
    assert p.budget == pytest.approx(3500) and p.behind_s == 2.0
    assert p.due(6.0, 4096, replace(saturated, step_frames_per_s=9000), behind_s=1.5) == 1.2
    assert p.due(8.0, 4096, pacing.Busy(0.2, 0.2, 2.0, 3000), behind_s=0.2) == 0.8
    assert p.budget == pytest.approx(5250)
    # behind with no step frame through, or by less than BEHIND_S: the busy share decides
    # (frames 0.7 -> (0.4 + 0.4 / 1.5) / 2 = 0.33, x 0.48: 2,500, 1.64 -> 1.65 s), the renewal
    # after a change only watching
    assert p.due(10.0, 4096, replace(saturated, step_frames_per_s=0), behind_s=5.0) == 0.8
    assert p.due(12.0, 4096, saturated, behind_s=0.9) == 1.65 and p.budget == pytest.approx(2500)


def test_the_busy_shares_are_of_the_wall_time_measured() -> None:
    t, cpu = [100.0], [7.0]
    meter = pacing.BusyMeter(clock=lambda: t[0], cpu=lambda: cpu[0])
    meter.add(0.01, 0.01)
    t[0] += 0.05
    assert meter.read() is None  # under 0.1 s: no reading, the interval goes on
    meter.add(0.49, 0.49)
    t[0] += 1.95  # 2 s since the start: 0.5 s on frames, 0.5 s on ticks
    meter.steps += 300
    # the first reading starts the CPU clock (the meter may have been made on another thread)
    assert meter.read() == pacing.Busy(frames=0.25, ticks=0.25, span_s=pytest.approx(2.0), step_frames_per_s=150)
    t[0] += 1.0
    cpu[0] += 0.3  # 0.3 s of the thread's CPU in 1 s: 0.3 of a core, waiting for frames meanwhile
    assert meter.read() == pacing.Busy(0.0, 0.0, 1.0, cpu=pytest.approx(0.3))
    meter.add(3.0, 0.5)  # more than the wall time (a clock step): clamped
    t[0] += 2.0
    assert meter.read().total == 1.0


def test_time_given_to_the_ui_is_left_out_of_the_busy_shares_not_the_cpu_share() -> None:
    """The data thread waits while the UI renders (flowtop.monitor.datathread.UiTurn): its busy
    shares are of the time it had, its CPU share still per wall second (what it takes of the box)."""
    t, cpu = [100.0], [7.0]
    meter = pacing.BusyMeter(clock=lambda: t[0], cpu=lambda: cpu[0])
    t[0] += 1.0
    meter.read()  # starts the CPU clock
    meter.add(0.4, 0.1)
    meter.away(0.5)  # half the second given to the UI
    t[0] += 1.0
    cpu[0] += 0.5
    assert meter.read() == pacing.Busy(frames=pytest.approx(0.8), ticks=pytest.approx(0.2), span_s=1.0,
                                       cpu=pytest.approx(0.5))
    meter.away(3.0)  # more than the interval (a clock step): half of it at most
    meter.add(0.25, 0.0)
    t[0] += 1.0
    assert meter.read().frames == pytest.approx(0.5)
    meter.add(0.25, 0.0)
    t[0] += 1.0
    assert meter.read().frames == pytest.approx(0.25)  # nothing given carried over


def test_a_monitor_past_its_cpu_budget_paces_its_ranks_though_it_keeps_up() -> None:
    """The data thread 60 % busy of the wall time (under BUSY_HIGH, 0.7) but at 0.55 of a core
    against a budget of 0.5 (a crowded box stretches the wall share, an idle one the CPU share):
    the budget goes x 0.6, 4,096 / 6,000 = 0.683 -> 0.70 s. Under the CPU budget, with room in
    the wall time (0.4 busy, + 0.2 x 0.5), it holds where growing the frames x 1.5 would cross the
    CPU budget: frames are 0.2 of the 0.4 busy, half of the CPU, 0.45 x (1 + 0.5 x 0.5) = 0.56 >
    0.5; it grows where that stays under: 0.3 x 1.25 = 0.375, x 1.5 = 9,000, 0.455 -> 0.5 s."""
    over = pacing.Busy(frames=0.4, ticks=0.2, span_s=2.0, cpu=0.55)
    assert over.total < pacing.BUSY_HIGH and over.over(0.5) and not over.over(None) and not over.over(0.6)
    p = pacing.Pacer(cpu_budget=0.5)
    assert p.due(0.0, 4096, over) == 0.7 and p.budget == pytest.approx(6000) and p.load_bound
    assert p.due(2.0, 4096, pacing.Busy(0.2, 0.2, 2.0, cpu=0.45)) == 0.7 and p.budget == pytest.approx(6000)
    assert p.due(4.0, 4096, pacing.Busy(0.2, 0.2, 2.0, cpu=0.30)) == 0.5 and p.budget == pytest.approx(9000)
    # no budget, or no CPU figure: the wall share alone decides (0.6 + 0.2: no room to grow)
    for pacer, busy in ((pacing.Pacer(cpu_budget=None), over), (pacing.Pacer(), pacing.Busy(0.4, 0.2, 2.0))):
        assert pacer.due(0.0, 4096, busy) == 0.45 and pacer.budget == 10_000
    text = pacing.pace_notice(4096, 0.7, True, over, cpu_budget=0.5)
    assert text.endswith("busy 60% of the last 2 s, 40% on frames, and took 0.55 of a core "
                         "(it may take 0.5: --data-cpu or FLOWTOP_DATA_CPU))"), text


def test_the_pace_notice_says_why() -> None:
    assert pacing.pace_notice(4096, 0.45, False, None) == (
        "4096 ranks talk: each is asked to send its steps every 0.45 s (~9,102 step frames a second; "
        "the monitor takes ~10,000)")
    assert pacing.pace_notice(4096, 2.0, True, pacing.Busy(0.41, 0.5, 2.01)) == (
        "4096 ranks talk: each is asked to send its steps every 2.00 s (~2,048 step frames a second, as many as "
        "this monitor keeps up with; its data thread was busy 91% of the last 2 s, 41% on frames)")
    assert pacing.pace_notice(4096, 2.0, True, pacing.Busy(0.7, 0.3, 2.0, 2500.0), behind_s=6.2) == (
        "4096 ranks talk: each is asked to send its steps every 2.00 s (~2,048 step frames a second, as many as "
        "this monitor keeps up with; it is 6.2 s behind and took 2,500 step frames a second: asked for 50% of "
        "that while the queue drains)")
    # queued while the thread had room (a link's backlog): the budget did not follow it, nor does the text
    assert "behind" not in pacing.pace_notice(4096, 2.0, True, pacing.Busy(0.3, 0.1, 2.0, 2500.0), behind_s=6.2)
    assert pacing.pace_notice(12, None, False, None) == "12 ranks talk: they send their steps at their own pace again"


class _OneRank:
    """One real probe publisher into a real collector (``model``, its CPU ``budget``) whose pace
    renews every 0.5 s: one rank is 1 / 8 of the budget of 8 step frames a second, 0.15 s."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, model: Model, job: str, budget: float | None = None) -> None:
        from flowtop.monitor.collector import Collector

        monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 8)
        monkeypatch.setattr(pacing, "RENEW_S", 0.5)
        monkeypatch.setattr(pacing, "PACE_NOTICE_S", 0.0)  # every change told: the notices are what is read
        monkeypatch.setattr("flowtop.monitor.governor.RENEW_S", 0.5)
        monkeypatch.setattr(wire, "PACE_TTL_S", 1.5)
        listen = f"tcp://127.0.0.1:{free_port_pair()}"
        self.monitor = MonitorThread(listen, collector=Collector(model, listen, cpu_budget=budget))
        self.pub = Publisher(RankKey(job, "h", 4321, 0, 0), self.monitor.listen)
        self.pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
        self.pub.start()
        self.step = 0

    def steps_until(self, cond: Callable[[], bool], timeout: float) -> bool:
        """Step every 10 ms until ``cond`` holds (or ``timeout`` seconds); whether it does."""
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            self.step += 1
            self.pub.publish("step", {"step": self.step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.01)
        return cond()

    def notices(self) -> list[str]:
        return [n.text for n in self.monitor.call(lambda: tuple(self.monitor.collector.notices.history))]

    def close(self) -> None:
        self.pub.close()
        self.monitor.close()


class _SlowFrames(Model):
    """A model whose frames take ``seconds`` each of the data thread (a monitor on a slow or
    shared machine): the thread is busy with frames, not waiting for them."""

    seconds = 0.0

    def ingest(self, msg, now, via=None):  # noqa: ANN001, ANN201 - Model.ingest's own signature
        time.sleep(self.seconds)
        return super().ingest(msg, now, via)


def test_a_monitor_that_cannot_keep_up_slows_its_ranks_and_lets_them_go_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real collector whose frames keep its data thread busy (0.12 s each: ~7 frames a second at a
    0.15 s pace, 86 %) asks a real probe publisher for a longer pace (its own budget, 8 step frames
    a second, asks 0.15 s of one rank; x 0.6: 0.25 s); once frames are quick again the pace comes
    back to 0.15 s. No step is lost either way."""
    model = _SlowFrames()
    one = _OneRank(monkeypatch, model, "busy", budget=None)
    pub, monitor = one.pub, one.monitor
    try:
        assert one.steps_until(lambda: pub.current_flush_s() == 0.15, 10)  # the rank count's pace
        model.seconds = 0.12
        assert one.steps_until(lambda: pub.current_flush_s() >= 0.25, 15), pub.current_flush_s()
        texts = one.notices()
        assert any("as many as this monitor keeps up with" in t and "on frames" in t for t in texts), texts
        model.seconds = 0.0
        assert one.steps_until(lambda: pub.current_flush_s() == 0.15, 20), pub.current_flush_s()
        # the budget back at 8 a renewal or two later: the load no longer sets the pace
        assert one.steps_until(lambda: not monitor.call(lambda: monitor.collector.pacer.load_bound), 10)
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == one.step, 10)
        assert snap.jobs[0].ranks[0].step == one.step and snap.jobs[0].ranks[0].lost_messages == 0
    finally:
        one.close()


class _CostlyFrames(Model):
    """A model whose frames take ``seconds`` of the data thread's own CPU each (spun, not slept)."""

    seconds = 0.0

    def ingest(self, msg, now, via=None):  # noqa: ANN001, ANN201 - Model.ingest's own signature
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        return super().ingest(msg, now, via)


def test_a_monitor_past_its_cpu_budget_slows_its_ranks_though_it_keeps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real collector given 0.05 of a core whose frames take 20 ms of its CPU each (~7 frames a
    second at a 0.15 s pace: ~0.14 of a core, and about as much of the wall time, far under
    BUSY_HIGH): it asks its real probe publisher for a longer pace, and says why."""
    cuts: list[pacing.Busy] = []  # the readings at which the budget was cut
    next_scale = pacing.next_scale

    def recorded(scale: float, busy: pacing.Busy | None, *rest: Any) -> float:
        after = next_scale(scale, busy, *rest)
        if after < scale and busy is not None:
            cuts.append(busy)
        return after

    monkeypatch.setattr(pacing, "next_scale", recorded)
    model = _CostlyFrames()
    one = _OneRank(monkeypatch, model, "costly", budget=0.05)
    pub = one.pub
    try:
        assert one.steps_until(lambda: pub.current_flush_s() == 0.15, 10)  # the rank count's pace
        model.seconds = 0.02
        assert one.steps_until(lambda: pub.current_flush_s() >= 0.25, 15), pub.current_flush_s()
        texts = one.notices()
        assert any("of a core (it may take 0.05: --data-cpu or FLOWTOP_DATA_CPU)" in t for t in texts), texts
        # the first cut read the CPU past the budget while the wall time had room
        assert cuts and cuts[0].total < pacing.BUSY_HIGH and cuts[0].cpu is not None and cuts[0].cpu > 0.05, cuts
    finally:
        one.close()


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
    collector._pace(100.0, None)  # load not measured: only the rank count sets the pace
    assert collector.pacer.current == 0.15
    batch(110.0, 1002.0, 2)  # sent at relay time 1002 = monitor 102, arrived at 110: 8 s in queues
    assert collector.model.relays.lag_of(collector.model.ranks[RankKey("j", "node-a", 100, 0, 0)].via) == pytest.approx(8.0, abs=0.01)  # less the drift allowance
    assert all(110.0 - st.last_recv > 5.0 for st in collector.model.ranks.values())  # older than STALE_AFTER_S
    collector._pace(110.0, None)
    assert collector.pacer.current == 0.15  # all three still paced
    assert collector.pacer.behind_s == pytest.approx(8.0, abs=0.01)  # the one relay is the median


def test_a_batch_taken_late_in_a_drain_does_not_shorten_its_relays_path() -> None:
    """A drain's frames are applied at its start; one taken off the socket 1.5 s into it (after a
    long tick) was measured at the drain's start too: a path 1.5 s shorter than the real one,
    kept as the least-delayed for hours, and every later batch of the relay read 1.5 s behind.
    Measured when it was taken, the path holds; its frame is still applied at the drain's start."""
    from flowtop.monitor.relays import Relays, encode_stamp

    relays = Relays()
    relays.unstamp([encode_stamp("a:1:1", 100.0, [0]), b"frame"], 100.0)  # a path of 0 s
    _, times = relays.unstamp([encode_stamp("a:1:1", 102.0, [0]), b"frame"], 100.5, taken=102.0)
    assert times == [100.5] and relays.lag_of("a:1:1") == pytest.approx(0.0, abs=0.01)
    relays.unstamp([encode_stamp("a:1:1", 103.0, [0]), b"frame"], 103.0)
    assert relays.lag_of("a:1:1") == pytest.approx(0.0, abs=0.01)  # 1.5 s when measured at 100.5


def test_how_far_behind_is_the_median_live_relays_lag() -> None:
    """One congested link is not the monitor falling behind: the median of the live relays' latest
    lags is; a silent relay's old lag counts for nothing."""
    from flowtop.monitor.relays import SILENT_AFTER_S, Relays, encode_stamp

    relays = Relays()
    assert relays.behind(0.0) == 0.0  # no relay: ranks heard directly

    def batch(relay: str, sent: float, now: float) -> None:
        relays.unstamp([encode_stamp(relay, sent, [0]), b"frame"], now)

    for i, relay in enumerate(("a:1:1", "b:1:1", "c:1:1", "d:1:1")):
        batch(relay, 0.0, 10.0 + i)  # offsets 10..13 s: the least-queued path of each
    batch("a:1:1", 20.0, 30.0)  # 0 s queued
    batch("b:1:1", 18.0, 30.0)  # 1 s
    batch("c:1:1", 15.5, 30.0)  # 2.5 s
    batch("d:1:1", 7.0, 30.0)  # 10 s: one congested link
    assert relays.behind(30.0) == pytest.approx(2.5, abs=0.01)  # sorted 0, 1, 2.5, 10: the upper median
    batch("d:1:1", 10.0, 33.0)  # d still 10 s behind; a, b, c not heard since 30
    assert relays.behind(30.0 + SILENT_AFTER_S + 0.5) == pytest.approx(10.0, abs=0.01)


#: Three ranks behind one relay (node-a:7:00000001), for the tests of relayed liveness.
RELAYED = [RankKey("j", "node-a", 100 + r, r, 0) for r in range(3)]


def _relayed_steps(collector: Any, step: int, lag: float, ranks: list[RankKey]) -> float:
    """Hand ``collector`` one relay batch carrying step ``step`` of ``ranks`` (their hellos too at
    step 1), sent by the relay at its clock 1000 + 0.5·step (900 s behind the monitor's) and
    received ``lag`` seconds later; returns the monitor time it arrived at."""
    from flowtop.monitor.relays import encode_stamp

    sent = 1000.0 + 0.5 * step
    frames = [wire.encode_steps(k, step, sent, [{"step": step, "wall_s": 0.5, "tokens": 64, "drops": 0}], 0)
              for k in ranks]
    if step == 1:
        frames += [wire.encode("hello", k, 0, sent, {"local_rank": k.rank, "world_size": 3,
                                                     "device": "cpu (test)", "probe_version": "t"}) for k in ranks]
    now = sent - 900.0 + lag
    collector.handle_batch([encode_stamp("node-a:7:00000001", sent, [0] * len(frames)), *frames], now)
    return now


def test_ranks_whose_frames_queue_behind_a_backlog_stay_live_and_raise_no_hang() -> None:
    """Three ranks step every 0.5 s behind one relay. Once the monitor is 40 s behind (each batch
    arrives 40 s after its relay sent it) their newest steps are 40 s old on its clock: as of
    their relay's latest report they are live, no hang is raised (its floor is 30 s) and they
    were heard from a moment ago. When the relay itself falls silent they go stale."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.relays import SILENT_AFTER_S
    from flowtop.monitor.wiring import make_model

    collector = Collector(make_model(), "tcp://127.0.0.1:1")  # not started: frames handed in
    model, keys = collector.model, RELAYED

    def batch(step: int, lag: float) -> float:
        return _relayed_steps(collector, step, lag, keys)

    for step in range(1, 41):  # 20 s without queueing
        model.tick(batch(step, 0.0))
    for step in range(41, 81):  # 20 s more, each batch 40 s late: the monitor fell behind
        now = batch(step, 40.0)
        job = model.tick(now).jobs[0]
        assert [r.status for r in job.ranks] == ["live"] * 3, (step, [r.status for r in job.ranks])
        assert not [h for h in job.hints if h.id.startswith("hang")], [h.summary for h in job.hints]
    ranks = job.ranks
    assert all(r.behind_s == pytest.approx(40.0, abs=0.01) and r.age_s(now) < 0.01 for r in ranks)
    assert [r.step for r in ranks] == [80] * 3 and job.flops is None or job.flops.stalled_since is None
    silent_at = now + SILENT_AFTER_S + 0.5
    silent = model.tick(silent_at).jobs[0]  # nothing from the relay since
    assert not any(r.cut_off for r in ranks)  # live behind a backlog: not cut off
    assert [(r.status, r.status_reason_at(silent_at), r.cut_off) for r in silent.ranks] == [
        ("stale", "relay node-a silent for 4 s", True)] * 3
    # Past the hang floor: ranks unheard behind a silent relay are not said to have stopped (a
    # trial: a SIGSTOP'd relay raised a critical hang_all while its ranks trained on), at any tick.
    for t in range(1, 61):
        later = model.tick(now + SILENT_AFTER_S + 0.5 + t).jobs[0]
        assert not [h for h in later.hints if h.id.startswith("hang")], (t, [h.summary for h in later.hints])
    assert [r.status for r in later.ranks] == ["stale"] * 3


def test_a_monitor_behind_its_ranks_hands_the_ui_a_snapshot_a_second() -> None:
    """Ticks every 0.5 s on a clock the test drives, a relay's batches every 0.25 s. Keeping up,
    every tick's snapshot goes to the UI; once its batches arrive 8 s late (and a pace renewal
    has seen it) one a second, the frames getting the interpreter; caught up, every tick again."""
    from flowtop.monitor.collector import BEHIND_HAND_OVER_S, Collector
    from flowtop.monitor.relays import encode_stamp
    from flowtop.monitor.ticker import Ticker
    from flowtop.monitor.wiring import make_model

    t = [100.0]

    class Clock:  # the monitor clock, driven by the test
        pauses: list[object] = []

        def now(self) -> float:
            return t[0]

    collector = Collector(make_model(), "tcp://127.0.0.1:1", clock=Clock())  # type: ignore[arg-type]
    collector.ticker = Ticker(lambda at: collector.model.tick(at), 100.0, 0.5)
    handed: list[object] = []
    collector.on_tick = handed.append
    key, seq = RankKey("j", "node-a", 100, 0, 0), [0]
    hello = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "t"}

    def run(seconds: float, lag: float) -> int:
        """Batches ``lag`` s late for ``seconds``; the snapshots handed to the UI meanwhile."""
        n, until = len(handed), t[0] + seconds
        while t[0] < until - 1e-9:
            t[0] += 0.25
            seq[0] += 1
            sent = t[0] + 900.0 - lag  # the relay's clock: 900 s ahead of the monitor's
            frame = wire.encode("hello", key, seq[0], sent, hello)
            collector.handle_batch([encode_stamp("node-a:7:1", sent, [0]), frame], t[0])
            collector.catch_up()
        return len(handed) - n

    assert run(4.0, 0.0) == 8  # 8 ticks, 8 snapshots
    run(4.0, 8.0)  # a renewal (every 2 s) finds it behind
    assert collector.pacer.behind_s == pytest.approx(8.0, abs=0.01)
    assert run(6.0, 8.0) == 6.0 / BEHIND_HAND_OVER_S  # 12 ticks, one snapshot a second
    run(2.0, 0.0)  # a renewal finds it caught up
    assert run(4.0, 0.0) == 8


def test_a_view_kept_while_its_relays_lag_grows_carries_the_new_lag() -> None:
    """Three ranks behind one relay, every batch on time; then one batch 8 s late carries rank 0's
    step alone. Ranks 1 and 2 sent nothing new, so their views are kept — but with the relay's new
    lag: a kept view's age took the old lag off and read the 8 s backlog as 8 s of silence (the
    hints' stall, "heard N s ago" and the exporter's seen metric read it)."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.wiring import make_model

    collector = Collector(make_model(), "tcp://127.0.0.1:1")  # not started: frames handed in
    model, keys = collector.model, RELAYED

    def batch(step: int, lag: float, ranks: list[RankKey]) -> float:
        return _relayed_steps(collector, step, lag, ranks)

    for step in range(1, 21):
        before = model.tick(batch(step, 0.0, keys)).jobs[0].ranks
    now = batch(21, 8.0, keys[:1])
    ranks = model.tick(now).jobs[0].ranks
    assert [r.step for r in ranks] == [21, 20, 20]
    assert [r.behind_s for r in before] == [0.0] * 3
    assert [r.behind_s for r in ranks] == [pytest.approx(8.0, abs=0.01)] * 3
    assert [round(r.age_s(now), 2) for r in ranks] == [0.0, 0.5, 0.5]  # as of the relay's report
    from flowtop.monitor.snapshot_json import rank_json

    assert {k: round(v, 2) for k, v in rank_json(ranks[1], now).items() if k in ("age_s", "behind_s")} == {
        "age_s": 0.5, "behind_s": 8.0}  # the JSON says both


def test_a_relays_lag_jittering_under_a_second_keeps_its_ranks_views() -> None:
    """Live at 4,096 ranks through 512 relays, the relays' lags jittered by 0-0.5 s from one tick
    to the next and half the views were copied at every tick for it (2,700 copies a tick where
    ~1,000 ranks had sent a frame). A view is copied for its lag only once the lag moved by more
    than LAG_STEP_S (1 s): its age is then off by less than a second, against limits of 5 s
    (stale) and 30 s (hang)."""
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.wiring import make_model

    collector = Collector(make_model(), "tcp://127.0.0.1:1")  # not started: frames handed in
    model, keys = collector.model, RELAYED
    for step in range(1, 21):
        before = model.tick(_relayed_steps(collector, step, 0.0, keys)).jobs[0].ranks
    now = _relayed_steps(collector, 21, 0.6, keys[:1])  # rank 0 alone, its batch 0.6 s late
    ranks = model.tick(now).jobs[0].ranks
    assert ranks[1] is before[1] and ranks[2] is before[2]  # not copied: the lag moved 0.6 s
    assert ranks[0].behind_s == pytest.approx(0.6, abs=0.01) and ranks[1].behind_s == 0.0
    now = _relayed_steps(collector, 22, 1.7, keys[:1])  # 1.7 s late: a move past a second
    ranks = model.tick(now).jobs[0].ranks
    assert [r.behind_s for r in ranks] == [pytest.approx(1.7, abs=0.01)] * 3
    assert [r.step for r in ranks] == [22, 20, 20]


def test_ranks_that_join_between_renewals_are_paced_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large job's ranks join over a second or two. Renewals 60 s apart here (the first saw no
    rank), a budget of 8 step frames a second: as real probe publishers join one by one, the
    monitor broadcasts the pace their number needs at once (one rank 0.15 s, four 0.5 s), and
    the first rank, which joined alone, holds the four ranks' pace too."""
    from flowtop.monitor.collector import Collector

    monkeypatch.setattr(pacing, "STEP_FRAMES_PER_S", 8)
    monkeypatch.setattr("flowtop.monitor.governor.RENEW_S", 60.0)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = MonitorThread(listen, collector=Collector(Model(), listen))
    pubs: list[Publisher] = []

    def join(rank: int) -> Publisher:
        pub = Publisher(RankKey("ramp", "h", 5000 + rank, rank, 0), monitor.listen)
        pub.hello_fields = {"local_rank": rank, "world_size": 4, "device": "cpu (test)", "probe_version": "test"}
        pub.start()
        pubs.append(pub)
        return pub

    def until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.02)
        return cond()

    try:
        first = join(0)
        assert until(lambda: first.current_flush_s() == 0.15), first.current_flush_s()
        for r in (1, 2, 3):
            join(r)
        assert until(lambda: all(p.current_flush_s() == 0.5 for p in pubs)), [p.current_flush_s() for p in pubs]
        assert monitor.call(lambda: monitor.collector.pacer.current) == 0.5
    finally:
        for pub in pubs:
            pub.close()
        monitor.close()


def test_ranks_behind_a_silent_relay_are_marked_once_and_keep_their_unheard_flop_view(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three ranks with a FLOP count behind one relay that falls silent. Each tick the reason says
    one more second of silence; the FLOP view of each rank is marked once (accounting.unheard: its
    rates n/a, not 0, for it may train on unheard) and kept as the silence grows, its reason
    "unheard behind relay node-a (silent)", never "no step for N s" (it is not known to have
    stopped); the job's figures leave the three out (none is heard: no figures)."""
    from flowtop.monitor import accounting
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.relays import SILENT_AFTER_S, encode_stamp
    from flowtop.monitor.wiring import make_model

    collector = Collector(make_model(), "tcp://127.0.0.1:1")  # not started: frames handed in
    model, keys = collector.model, RELAYED
    count = {"step": 2, "model_flops": 1e9, "executed_flops": 1.2e9, "attention": "full", "dtype": "bf16",
             "peak_flops": 1e12, "peak_source": "test", "uncounted": {}, "tokens": 64}
    for step in range(1, 11):
        now = _relayed_steps(collector, step, 0.0, keys)
    sent = 1000.0 + 0.5 * 10
    flops = [wire.encode("flops", k, 100, sent, count) for k in keys]
    collector.handle_batch([encode_stamp("node-a:7:00000001", sent, [0] * 3), *flops], now)
    assert model.tick(now).jobs[0].flops.flops_per_s == pytest.approx(3 * 1e9 / 64 * 128)  # 64 tokens / 0.5 s
    built: list[str] = []
    real = accounting.unheard
    monkeypatch.setattr(accounting, "unheard",
                        lambda *a, **k: built.append(sys._getframe(1).f_code.co_name) or real(*a, **k))
    views: dict[int, set[int]] = {}
    for i in range(10):  # 5 s of silence past SILENT_AFTER_S, a tick every 0.5 s
        at = now + SILENT_AFTER_S + 0.25 + 0.5 * i
        job = model.tick(at).jobs[0]
        assert [(r.status, r.status_reason_at(at)) for r in job.ranks] == [
            ("stale", f"relay node-a silent for {at - now:.0f} s")] * 3
        assert len(job.unheard) == 3 and job.flops is None and job.tokens_per_s is None
        for r in job.ranks:
            assert r.flops.stalled_since is None and r.flops.mfu is None and r.flops.flops_per_s is None
            assert r.tokens_per_s is None and r.flops.model_flops_per_step == 1e9
            assert r.flops.reason_at(at) == "unheard behind relay node-a (silent)"
            views.setdefault(r.rank, set()).add(id(r.flops))
    assert built.count("_stale") == 3, built  # once per rank, not once per rank and second ...
    assert [len(ids) for ids in views.values()] == [1, 1, 1]  # ... the same FLOP view as the silence grows


def test_a_batch_leaves_a_flush_after_the_last_one_or_its_first_item_whichever_is_sooner() -> None:
    """probe.wire.pace.batch_due, the probe's step batches' and a relay's rule alike."""
    from probe.wire.pace import batch_due

    assert batch_due(10.0, 10.03, 0.1) == pytest.approx(10.1)  # items flow: a flush after the last batch
    assert batch_due(10.0, 10.5, 0.1) == pytest.approx(10.1)  # none sent for a flush: at once (10.1 < 10.5)
    assert batch_due(9.0, 8.95, 2.0) == pytest.approx(10.95)  # an item older than the last batch: 2 s after it
    assert batch_due(float("-inf"), 3.0, 0.1) == float("-inf")  # the first batch ever: at once


def test_a_pace_finding_its_level_is_told_at_most_once_a_minute() -> None:
    """A load-driven pace moved by half or more every few seconds at 1,024 ranks (0.25 → 0.45 →
    0.7 → 1.3 → 0.6 → 1.6 s in a minute) and each move posted a notice several lines tall that
    covered half an 80×24 screen for the whole run (a new user's trial). Pacing starting or
    stopping is told at once; a move, or the load starting or ceasing to set it, PACE_NOTICE_S
    after the last notice."""
    from flowtop.monitor.pacing import PACE_NOTICE_S, pace_news

    told, load, at, now = None, False, -math.inf, 0.0
    said = []
    for pace, bound in [(0.25, False), (0.45, True), (0.7, True), (1.3, True), (0.6, True), (1.6, True),
                        (1.0, True), (1.0, True), (None, False), (0.3, False)]:
        if pace_news(told, load, at, pace, bound, now):
            told, load, at = pace, bound, now
            said.append((now, pace))
        now += PACE_NOTICE_S / 6  # a renewal every 10 s
    assert said == [(0.0, 0.25), (PACE_NOTICE_S, 1.0), (8 * PACE_NOTICE_S / 6, None), (9 * PACE_NOTICE_S / 6, 0.3)]
