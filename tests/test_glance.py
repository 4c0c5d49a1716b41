"""Between two ticks a collector watched by a TUI publishes a glance (flowtop.monitor.collector): each
rank's step at that instant with the figures, statuses and hints of the last tick, so a step shows
within a quarter second of arriving, for jobs up to GLANCE_RANKS ranks."""

from __future__ import annotations

import statistics
import time

import pytest

from flowtop.monitor.clock import TICK_S
from monitor_thread import MonitorThread
from probe.transport.publisher import Publisher
from probe.wire import RankKey


def _run(monitor: MonitorThread, seconds: float) -> list[tuple[float, int, tuple]]:
    seen: list[tuple[float, int, tuple]] = []

    def on_tick(snap) -> None:
        ranks = snap.jobs[0].ranks if snap.jobs else ()
        seen.append((snap.taken_at, ranks[0].step if ranks else -1, tuple(h.id for h in snap.jobs[0].hints) if snap.jobs else ()))

    monitor.call(lambda: setattr(monitor.collector, "on_tick", on_tick))
    monitor.call(lambda: setattr(monitor.collector, "glances", True))  # as the TUI sets it (flowtop.tui.app)
    pub = Publisher(RankKey("glance", "h", 77, 0, 0), monitor.listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    try:
        step, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 8, "drops": 0})
            time.sleep(0.05)
    finally:
        pub.close()
    return seen


def test_a_small_job_is_published_every_half_tick() -> None:
    monitor = MonitorThread()
    try:
        seen = _run(monitor, 3.0)
    finally:
        monitor.close()
    times = [t for t, _, _ in seen]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # ticks at t0 + k/2, glances at t0 + k/2 + 1/4: publications a quarter second apart (ticks
    # alone would give 6 in 3 s); a glance is stamped when the loop got to it, a little late at most
    assert len(seen) >= 10 and abs(statistics.median(gaps) - TICK_S / 2) < 0.05, gaps
    steps = [s for _, s, _ in seen if s > 0]
    assert steps == sorted(steps) and len(set(steps)) >= 8  # every publication shows a newer step


def test_a_large_job_is_published_at_ticks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("flowtop.monitor.collector.GLANCE_RANKS", 0)  # one rank is "large"
    monitor = MonitorThread()
    try:
        seen = _run(monitor, 2.0)
    finally:
        monitor.close()
    times = [t for t, _, _ in seen]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(seen) >= 3 and min(gaps) > TICK_S - 0.06, gaps


def test_a_glance_moves_steps_but_statuses_and_hints_only_move_at_ticks() -> None:
    from flowtop.monitor.wiring import make_model
    from probe import wire

    model = make_model()
    key = RankKey("glance", "h", 78, 0, 0)
    recs = [{"step": s, "wall_s": 0.05, "tokens": 8, "drops": 0} for s in range(1, 6)]
    model.ingest(wire.decode(wire.encode_steps(key, 0, 1.0, recs, 0)), 1.0)
    assert model.tick(1.0).jobs[0].ranks[0].status == "live"
    recs = [{"step": s, "wall_s": 0.05, "tokens": 8, "drops": 0} for s in range(6, 9)]
    model.ingest(wire.decode(wire.encode_steps(key, 1, 1.2, recs, 0)), 1.2)
    glance = model.snapshot(1.25, light=True)
    assert glance.jobs[0].ranks[0].step == 8 and glance.jobs[0].ranks[0].heard_at == 1.2  # the step moves
    model.ingest(wire.decode(wire.encode("bye", key, 2, 1.3, {"reason": "exit", "steps": 8, "drops": 0})), 1.3)
    glance = model.snapshot(1.35, light=True)
    assert glance.jobs[0].ranks[0].status == "live" and glance.jobs[0].status == "running"  # not before the tick
    snap = model.tick(1.5)
    assert snap.jobs[0].ranks[0].status == "done" and snap.jobs[0].status == "done"


def test_without_a_tui_only_ticks_are_published() -> None:
    """A JSON stream or a scrape (flowtop serve, snapshot --follow) gets each tick's view only."""
    monitor = MonitorThread()
    try:
        seen: list[float] = []
        monitor.call(lambda: setattr(monitor.collector, "on_tick", lambda snap: seen.append(snap.taken_at)))
        pub = Publisher(RankKey("glance", "h", 79, 0, 0), monitor.listen)
        pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
        pub.start()
        for step in range(1, 40):
            pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 8, "drops": 0})
            time.sleep(0.05)
        pub.close()
    finally:
        monitor.close()
    gaps = [b - a for a, b in zip(seen, seen[1:])]
    assert len(seen) >= 3 and min(gaps) > TICK_S - 0.06, gaps
