"""Ticks, pure snapshots and the monitor clock (issue 15 part 1, issue 10 leftovers).

* a replay of a live recording reproduces, tick by tick, the hints the live monitor showed,
  without taking a single snapshot on the way (eviction and hysteresis advance in ticks only);
* a pause of the monitor itself (SIGSTOP, GC) raises no false hang hint: driven with an injected
  clock (with the control run that shows the false hint without the pause detection), and with a
  real SIGSTOP of a subprocess monitor;
* a rank whose data did not change keeps its RankSnapshot object.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flowtop.monitor.clock import TICK_S, MonitorClock
from flowtop.monitor.collector import Collector
from flowtop.tools.demo.launch import free_port_pair
from flowtop.monitor.hints.engine import HOLD_S
from flowtop.monitor.recording import Recorder, replay_all
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.ticker import Ticker
from flowtop.monitor.wiring import make_model
from monitor_thread import MonitorThread
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey

ROOT = Path(__file__).resolve().parent.parent
HANG = {"hang": {"floor_s": 1.5}}


def _hints(snap: MonitorSnapshot) -> tuple[Any, ...]:
    """What a tick showed, comparable between live and replay (times there differ by t0)."""
    def ev(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) else v

    return tuple(sorted(
        (j.job, h.id, h.target, h.severity, h.ended, h.first_step, h.last_step, ev(h.impact),
         tuple(sorted((k, ev(v)) for k, v in h.evidence.items() if not isinstance(v, list))))
        for j in snap.jobs for h in j.hints))


def _publisher(addr: str, rank: int) -> Publisher:
    pub = Publisher(RankKey("replayed", "node-a", 7000 + rank, rank, 0), addr)
    pub.hello_fields = {"local_rank": rank, "world_size": 2, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    deadline = time.monotonic() + 10
    while pub.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pub.subscribers
    return pub


@pytest.mark.slow
def test_a_replay_reproduces_the_live_hints_tick_by_tick_without_snapshots(tmp_path: Path) -> None:
    path = tmp_path / "live.rec"
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    collector = Collector(make_model(hint_overrides=HANG), listen, recorder=Recorder(path))
    live: list[MonitorSnapshot] = []
    collector.on_tick = live.append  # on the collector's loop, at each tick
    monitor = MonitorThread(listen=listen, collector=collector)
    monitor.call(lambda: setattr(collector.ticker, "max_behind", None))  # a loaded CI box skips none
    pubs = [_publisher(listen, 0), _publisher(listen, 1)]
    try:
        # Rank 0 waits for input 40 % of each step; rank 1 is 60 % slower, then stops (a hang).
        for step in range(1, 121):
            pubs[0].publish("step", {"step": step, "wall_s": 0.05, "tokens": 64, "drops": 0, "input_wait_s": 0.02})
            if step <= 60:
                pubs[1].publish("step", {"step": step, "wall_s": 0.08, "tokens": 64, "drops": 0})
            time.sleep(0.05)
    finally:
        for p in pubs:
            p.close()
        # A replay runs the tick after the recording's last frame, so the live monitor must have
        # run it too before it stops (a fixed sleep raced with the cadence): wait until every step
        # is in and nothing new has arrived for 4 ticks. (Publishers send no bye: the waiting for
        # a "done" job this replaced ran its whole 15 s every time.)
        last: list[tuple[int, float]] = []

        def settled(s: MonitorSnapshot) -> bool:
            steps = {r.rank: r.step for j in s.jobs if j.job == "replayed" for r in j.ranks}
            if not last or last[-1][0] != s.received:
                last.append((s.received, s.taken_at))
            return steps == {0: 120, 1: 60} and s.taken_at >= last[-1][1] + 4 * TICK_S

        monitor.wait_for(settled, 30)
        monitor.close()
    t0 = collector.ticker.t0
    shown = {round((s.taken_at - t0) / TICK_S): _hints(s) for s in live}
    ids = {h[1] for hints in shown.values() for h in hints}
    assert {"input_wait", "straggler", "hang_rank"} <= ids, ids  # the run held time-driven hints

    model = make_model(hint_overrides=HANG)
    snapshots: list[int] = []
    read = model.snapshot
    model.snapshot = lambda now, listen="": (snapshots.append(len(replayed)), read(now, listen))[1]  # type: ignore[method-assign]
    replayed: list[MonitorSnapshot] = []
    replay_all(path, model, on_tick=replayed.append)
    again = {round(s.taken_at / TICK_S): _hints(s) for s in replayed}
    assert snapshots == [len(replayed)]  # one snapshot, at the very end: none on the way
    common = sorted(set(shown) & set(again))
    assert len(common) >= 10 and common == sorted(again)  # every replayed tick happened live
    assert [again[k] for k in common] == [shown[k] for k in common]


# --- a pause of the monitor itself ----------------------------------------------------------------

class _Driven:
    """A model ticked on a monitor clock over an injected raw clock, fed two ranks' steps."""

    def __init__(self, pause_s: float) -> None:
        self.raw = 1000.0
        self.clock = MonitorClock(lambda: self.raw, pause_s=pause_s)
        self.model = make_model(hint_overrides={"hang": {"floor_s": 3.0}})
        self.ticker = Ticker(lambda at: self.model.tick(at), self.clock.now())
        self.keys = [RankKey("paused", "h", 10 + r, r, 0) for r in (0, 1)]
        self.seq = {k: 0 for k in self.keys}
        self.step = {k: 0 for k in self.keys}
        self.ticks: list[tuple[float, set[str], tuple[str, ...]]] = []  # (monitor time, hint ids, statuses)
        for k in self.keys:
            self._send(k, "hello", local_rank=k.rank, world_size=2, device="cpu (test)", probe_version="t")

    def _send(self, key: RankKey, kind: str, **fields: Any) -> None:
        self.seq[key] += 1
        self.model.ingest(wire.decode(wire.encode(kind, key, self.seq[key], 1.0, fields)), self.clock.now())

    def run(self, seconds: float, ranks: int = 2) -> None:
        """Every 50 ms: the ticks due first (as the collector's drain loop does), then a step of
        each of the first ``ranks`` ranks."""
        for _ in range(int(seconds / 0.05)):
            self.raw += 0.05
            snap = self.ticker.catch_up(self.clock.now())
            if snap is not None:
                self.ticks.append((snap.taken_at, {h.id for j in snap.jobs for h in j.hints},
                                   tuple(r.status for j in snap.jobs for r in j.ranks)))
            for k in self.keys[:ranks]:
                self.step[k] += 1
                self._send(k, "step", step=self.step[k], wall_s=0.05, tokens=64, drops=0)

    def after(self, t: float) -> list[tuple[float, set[str], tuple[str, ...]]]:
        return [x for x in self.ticks if x[0] > t]


def _paused(pause_s: float, ranks_after: int = 2) -> tuple[_Driven, float]:
    d = _Driven(pause_s)
    d.run(6.0)
    resumed = d.clock.now()
    d.raw += 40.0  # SIGSTOP: nothing runs, nothing reads the clock, for 40 s
    d.run(14.0, ranks=ranks_after)
    return d, resumed


def test_a_monitor_pause_raises_no_false_hang() -> None:
    d, resumed = _paused(pause_s=5.0)
    assert [p.length_s for p in d.clock.pauses] == [pytest.approx(40.05)]
    after = d.after(resumed)
    assert after and all(not (ids & {"hang_all", "hang_rank"}) for _, ids, _ in after)
    assert all(statuses == ("live", "live") for _, _, statuses in after)  # not even a stale moment


def test_without_the_pause_detection_the_false_hang_appears_and_lingers() -> None:
    """The control: what the monitor showed before (the test above can fail)."""
    d, resumed = _paused(pause_s=float("inf"))
    hung = [t for t, ids, _ in d.after(resumed + 40.0) if "hang_all" in ids]  # once frames flow again
    assert hung and hung[-1] - hung[0] >= HOLD_S - 1.0  # shown ~10 s after the ranks were heard again


def test_a_rank_that_died_during_the_pause_still_hangs_after_it() -> None:
    d, resumed = _paused(pause_s=5.0, ranks_after=1)
    hung = [t for t, ids, _ in d.after(resumed) if "hang_all" in ids or "hang_rank" in ids]
    stale = [t for t, _, statuses in d.after(resumed) if statuses[1] == "stale"]
    # Its silence counts from its last frame, the pause left out: the 3 s hang floor, 5 s stale.
    assert hung and 2.5 <= hung[0] - resumed <= 4.0
    assert stale and 4.5 <= stale[0] - resumed <= 6.0


@pytest.mark.slow
def test_a_sigstopped_monitor_shows_no_hang_when_continued() -> None:
    """A real `flowtop snapshot` SIGSTOPped for 7 s while a rank keeps stepping (hang floor 2 s,
    so a false hang would show): its final snapshot, 4 s after SIGCONT (hints hold 10 s), has none."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    env = {**os.environ, "FLOWTOP_HANG_S": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--json", "--timeout", "14",
                             "--listen", listen], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pub = Publisher(RankKey("sigstop", "h", 1, 0, 0), listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    try:
        deadline = time.monotonic() + 20
        while pub.subscribers == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub.subscribers, "the monitor never came up"
        step, stopped_at, resumed_at = 0, time.monotonic() + 2.0, None
        while proc.poll() is None and time.monotonic() < deadline + 20:
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 64, "drops": 0})
            if resumed_at is None and time.monotonic() >= stopped_at:
                proc.send_signal(signal.SIGSTOP)
                time.sleep(7.0)
                proc.send_signal(signal.SIGCONT)
                resumed_at = time.monotonic()
            time.sleep(0.05)
        out, err = proc.communicate(timeout=20)
    finally:
        pub.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    (job,) = json.loads(out)["jobs"]
    assert [h["id"] for h in job["hints"] if h["id"].startswith("hang")] == []
    assert job["ranks"][0]["status"] == "live" and job["ranks"][0]["step"] > 100
    assert "the monitor did not run for 7 s" in err


# --- incremental snapshots ------------------------------------------------------------------------

def test_an_unchanged_rank_keeps_its_snapshot_object() -> None:
    model = make_model()
    keys = [RankKey("inc", "h", 20 + r, r, 0) for r in range(3)]
    seq = {k: 0 for k in keys}

    def send(k: RankKey, kind: str, now: float, **fields: Any) -> None:
        seq[k] += 1
        model.ingest(wire.decode(wire.encode(kind, k, seq[k], 1.0, fields)), now)

    for k in keys:
        send(k, "hello", 0.0, local_rank=k.rank, world_size=3, device="cpu (test)", probe_version="t")
        for step in range(1, 11):
            send(k, "step", step * 0.1, step=step, wall_s=0.1, tokens=64, drops=0)
    a = model.snapshot(1.2).jobs[0].ranks
    send(keys[0], "step", 1.25, step=11, wall_s=0.1, tokens=64, drops=0)
    b = model.snapshot(1.3).jobs[0].ranks
    assert b[0] is not a[0] and b[0].step == 11  # new data: a new view
    assert b[1] is a[1] and b[2] is a[2]  # nothing new: the same objects
    assert b[1].age_s(1.3) == pytest.approx(0.3)  # ages come from the snapshot's time
    c = model.snapshot(7.0).jobs[0].ranks  # ranks 1 and 2 fell silent past 5 s: stale
    assert [r.status for r in c] == ["stale", "stale", "stale"] and c[1] is not b[1]
    assert model.snapshot(7.2).jobs[0].ranks[1] is c[1]  # and stay the same object while stale


def test_ticks_run_in_order_before_the_frames_received_at_them_and_skip_when_far_behind() -> None:
    ran: list[float] = []

    def tick(at: float) -> MonitorSnapshot:
        ran.append(at)
        return MonitorSnapshot(taken_at=at, listen="", jobs=(), received=0, rejected=0)

    t = Ticker(tick, 100.0, 0.5)
    assert t.catch_up(100.49) is None and ran == []
    assert t.catch_up(100.5).taken_at == 100.5  # a tick at exactly a frame's time comes first
    assert t.catch_up(101.7).taken_at == 101.5 and ran == [100.5, 101.0, 101.5]
    lagging = Ticker(tick, 0.0, 0.5, max_behind=4)
    ran.clear()
    lagging.catch_up(10.2)  # 20 ticks due at once: only the latest runs
    assert ran == [10.0] and lagging.skipped == 19 and lagging.next_at == 10.5
