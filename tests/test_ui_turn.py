"""The UI's turn at the interpreter (flowtop.monitor.datathread.UiTurn): the data thread steps aside
while the UI renders a snapshot, for at most the turn's limit, with real sockets and a real app."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import pytest
import zmq

from flowtop.monitor.collector import Collector
from flowtop.monitor.datathread import DataThread, UiTurn
from flowtop.monitor.model import Model
from flowtop.monitor.pacing import BusyMeter
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp
from flowtop.tui.screens.main_screen import MainScreen
from probe import wire
from synthetic.replay import ReplaySource, synthetic_snapshot


def test_a_turn_holds_the_data_thread_until_the_ui_ends_it() -> None:
    turn = UiTurn(limit_s=5.0)
    t = time.perf_counter()
    assert turn.give() == 0.0 and not turn.open  # no turn: nothing to wait for
    n = turn.begin()
    assert turn.open and n == 1
    threading.Timer(0.3, turn.end, args=(n,)).start()
    waited = turn.give()
    assert 0.1 <= waited < 2.0 and not turn.open
    assert turn.give() == 0.0  # ended: the data thread goes on at once
    assert (turn.turns, turn.ran_out) == (1, 0) and turn.given_s == pytest.approx(waited)
    assert time.perf_counter() - t < 3.0


def test_a_turn_nobody_ends_runs_out_after_its_limit() -> None:
    """A UI that never says it repainted (it died, a screen that never refreshes) costs the data
    thread one limit a snapshot, not its life."""
    turn = UiTurn(limit_s=0.3)
    t = time.perf_counter()
    turn.begin()
    assert 0.1 <= turn.give() < 1.0
    assert turn.ran_out == 1 and not turn.open
    assert turn.give() == 0.0 and time.perf_counter() - t < 1.0
    turn.begin()
    time.sleep(0.35)  # run out before anyone gives it
    assert turn.give() == 0.0 and turn.ran_out == 2

def _take_held_steps(listen: str, model: Model, turn: UiTurn, armed: threading.Event, key: wire.RankKey) -> None:
    """A rank's hello until it is heard, then 100 step frames queued while ``turn`` holds the data
    thread (none taken), ``armed`` set and the turn ended: returns once the drain took all 100."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(listen)
    hello = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    try:
        deadline = time.monotonic() + 20
        seq = 0
        while not model.ranks and time.monotonic() < deadline:  # a PUB drops until its connection is up
            seq += 1
            pub.send(wire.encode("hello", key, seq, time.time(), hello))
            time.sleep(0.05)
        assert model.ranks, "the rank never arrived"
        first = turn.begin()  # hold the data thread while 100 frames queue up
        for step in range(1, 101):
            seq += 1
            pub.send(wire.encode("step", key, seq, time.time(), {"step": step, "wall_s": 0.01, "tokens": 8,
                                                                  "drops": 0}))
        time.sleep(0.5)
        assert model.ranks[key].step == 0  # held: nothing taken
        armed.set()
        turn.end(first)
        deadline = time.monotonic() + 10
        while model.ranks[key].step < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert model.ranks[key].step == 100
    finally:
        turn.end()
        pub.close(0)
        ctx.term()



def test_the_late_end_of_a_turn_that_ran_out_leaves_the_next_one_open() -> None:
    """A UI that took longer than the limit ends its snapshot's turn after the next snapshot's
    began: that end is the old turn's, and the new one stays the UI's."""
    turn = UiTurn(limit_s=5.0)
    old = turn.begin()
    new = turn.begin()  # the old one ran out; the data thread handed over the next snapshot
    turn.end(old)
    assert turn.open
    turn.end(new)
    assert not turn.open


def test_the_collector_steps_aside_between_frames_and_counts_the_wait_as_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sockets. A turn that opens while the drain works through a queue of 100 frames: the
    drain stops within 16 frames, takes the rest once the turn ends, and its busy time leaves the
    wait out (the pacer reads how much of the time the thread had it used)."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    model = make_model()
    collector = Collector(model, listen)
    turn = UiTurn(limit_s=20.0)
    collector.ui_turn = turn  # not through DataThread: its own snapshots would open turns nobody ends
    meter: list[tuple[str, float]] = []  # ("busy", frames + ticks s) and ("away", s), in order
    add, away = BusyMeter.add, BusyMeter.away

    def counted(m: BusyMeter, frames_s: float, ticks_s: float) -> None:
        meter.append(("busy", frames_s + ticks_s))
        add(m, frames_s, ticks_s)

    def left_out(m: BusyMeter, seconds: float) -> None:
        meter.append(("away", seconds))
        away(m, seconds)

    monkeypatch.setattr(BusyMeter, "add", counted)
    monkeypatch.setattr(BusyMeter, "away", left_out)
    handled: list[float] = []  # when each frame of the queue was handled (data thread)
    armed = threading.Event()
    begun: list[float] = []
    handle = Collector.handle_frame

    def timed(self: Collector, frame: bytes, *a: Any, **kw: Any) -> None:
        handle(self, frame, *a, **kw)
        if armed.is_set():
            handled.append(time.perf_counter())
            if len(handled) == 4:  # the UI's turn opens four frames into the drain
                n = turn.begin()
                begun.append(time.perf_counter())
                threading.Timer(0.5, turn.end, args=(n,)).start()

    monkeypatch.setattr(Collector, "handle_frame", timed)
    data = DataThread(collector, cadence_s=0)
    data.start().result(10)
    try:
        _take_held_steps(listen, model, turn, armed, wire.RankKey("turn", "node-a", 4242, 0, 0))
    finally:
        data.stop()
    assert len(handled) == 100 and len(begun) == 1
    during = [t for t in handled if begun[0] < t < begun[0] + 0.4]
    assert len(during) <= 12  # stopped at the next 16th frame
    assert handled[-1] - begun[0] >= 0.45  # the rest after the turn ended
    # The drain that gave the turn counted its frames, not the wait, and left the wait out.
    # (The first turn, held before the queue was taken, was given before any drain: "away" alone.)
    assert any(what == "away" and s >= 0.4 and i and meter[i - 1][0] == "busy" and meter[i - 1][1] < 0.3
               for i, (what, s) in enumerate(meter)), meter


def test_a_turn_that_a_tick_opens_is_given_before_the_drain_takes_a_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sockets. A tick hands the UI its snapshot (the turn opens inside catch_up, as
    DataThread._publish opens it) while 100 frames wait: the drain after the tick gives the turn
    before its first frame. It took 16 frames first (relay batches of a 4,096-rank job: tens of
    ms of the UI's refresh spent sharing the interpreter)."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    model = make_model()
    collector = Collector(model, listen)
    turn = UiTurn(limit_s=20.0)
    collector.ui_turn = turn
    armed = threading.Event()
    opened: list[float] = []  # when the tick's turn opened
    handled: list[float] = []  # when each frame was handled, once armed
    catch_up, handle = Collector.catch_up, Collector.handle_frame

    def ticking(self: Collector) -> float:
        now = catch_up(self)
        if armed.is_set() and not opened:
            n = turn.begin()
            opened.append(time.perf_counter())
            threading.Timer(0.5, turn.end, args=(n,)).start()
        return now

    def timed(self: Collector, frame: bytes, *a: Any, **kw: Any) -> None:
        handle(self, frame, *a, **kw)
        if armed.is_set():
            handled.append(time.perf_counter())

    monkeypatch.setattr(Collector, "catch_up", ticking)
    monkeypatch.setattr(Collector, "handle_frame", timed)
    data = DataThread(collector, cadence_s=0)
    data.start().result(10)
    try:
        # the loop goes on at the held turn's end: catch_up (the tick opens its turn), then the drain
        _take_held_steps(listen, model, turn, armed, wire.RankKey("tick-turn", "node-a", 4243, 0, 0))
    finally:
        data.stop()
    assert len(opened) == 1 and len(handled) == 100
    assert [t for t in handled if opened[0] < t < opened[0] + 0.4] == []  # none during the turn
    assert handled[0] - opened[0] >= 0.45


class _Fresh(ReplaySource):
    """Every snapshot a new one (taken_at counts up): each is handed over."""

    def __init__(self) -> None:
        super().__init__([synthetic_snapshot()], advance=False)
        self.served = 0

    def snapshot(self) -> MonitorSnapshot:
        self.served += 1
        return dataclasses.replace(super().snapshot(), taken_at=float(self.served))


@pytest.mark.asyncio
async def test_the_app_ends_each_turn_after_the_screen_has_shown_and_painted_its_snapshot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = _Fresh()
    app = FlowtopApp(source, refresh_s=0.1)  # snapshots come as they do live: DataReady wakes the UI
    turn = app.data.ui_turn
    assert turn is not None
    turn.limit_s = 30.0  # only the app's end closes a turn within the test
    log: list[tuple[str, float | None]] = []
    of_turn: dict[int, float] = {}  # turn number -> the snapshot it was opened for (its taken_at)
    deliver = app._deliver

    def delivered(delivery: Any) -> None:
        if delivery.snapshot is not None:
            of_turn[delivery.turn] = delivery.snapshot.taken_at
        deliver(delivery)

    monkeypatch.setattr(app, "_deliver", delivered)
    end = turn.end

    def ended(n: int | None = None) -> None:
        if n is not None and n in of_turn:  # (None: the app closing)
            log.append(("end", of_turn[n]))
        end(n)

    monkeypatch.setattr(turn, "end", ended)
    show = MainScreen.show
    monkeypatch.setattr(MainScreen, "show", lambda self, snap: (log.append(("show", snap.taken_at if snap else None)),
                                                                 show(self, snap))[1])
    display = FlowtopApp._display

    def painted(self: FlowtopApp, screen: Any, update: Any) -> None:
        log.append(("paint", None))
        display(self, screen, update)

    monkeypatch.setattr(FlowtopApp, "_display", painted)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        start = len(log)
        for _ in range(20):
            await asyncio.sleep(0.1)  # not pilot.pause(): it forces the screen's repaint timer
        await pilot.press("q")
    ends = [j for j in range(start, len(log)) if log[j][0] == "end"]
    assert len(ends) >= 5
    for j in ends:
        shown = [k for k in range(j) if log[k] == ("show", log[j][1])]
        assert shown, f"turn of snapshot {log[j][1]} ended before the screen showed it"
        assert ("paint", None) in log[shown[-1]:j], f"turn of snapshot {log[j][1]} ended before a repaint"


def _replay(name: str) -> tuple[Any, UiTurn, list[float]]:
    """A RecordingSource of ``name`` played at once (speed 1e6) with a UI turn of its own (not
    through DataThread: its own snapshots would open turns nobody ends), and the list that its
    feed appends each fed frame's recorded time to (data thread)."""
    from pathlib import Path

    from flowtop.monitor.recording import RecordingSource

    source = RecordingSource(Path(__file__).parent / "data" / name, make_model(), speed=1e6)
    source.ui_turn = UiTurn(limit_s=20.0)
    fed: list[float] = []
    feed = source._feed

    def timed(frame: bytes, t: float) -> None:
        feed(frame, t)
        fed.append(t)
        hook = getattr(source, "on_fed", None)
        if hook is not None:
            hook(len(fed))

    source._feed = timed
    return source, source.ui_turn, fed


def _wait_for(fed: list[float], n: int) -> None:
    deadline = time.monotonic() + 20
    while len(fed) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_replay_in_the_tui_steps_aside_at_each_wake_up_and_between_frames() -> None:
    """A recording played in the TUI (RecordingSource on the data thread) gives the UI's turn as
    the live collector does: a turn open as the replay starts holds every frame, and one that
    opens in the middle of a run of frames (the small H200 recording: ~90 frames between two
    ticks) stops the run within 16 frames."""
    source, turn, fed = _replay("h200-gpt-small.rec.gz")
    begun: list[float] = []  # perf_counter when the second turn opened, and each frame after it
    after: list[float] = []

    def on_fed(n: int) -> None:
        if begun:
            after.append(time.perf_counter())
        if n == 100:  # another turn opens in the middle of a run
            k = turn.begin()
            begun.append(time.perf_counter())
            threading.Timer(0.5, turn.end, args=(k,)).start()

    source.on_fed = on_fed  # type: ignore[attr-defined]
    first = turn.begin()  # held before the replay starts
    data = DataThread(source, cadence_s=0)
    try:
        data.start().result(10)
        time.sleep(0.5)
        assert not fed  # everything is due (speed 1e6), but the turn is the UI's
        turn.end(first)
        _wait_for(fed, 1266)
    finally:
        turn.end()
        data.stop()
    assert len(fed) == 1266 and len(begun) == 1  # every frame of the recording, once
    assert len([t for t in after if t < begun[0] + 0.4]) <= 16  # stopped at the next 16th frame (or tick)
    assert after[-1] - begun[0] >= 0.45  # the rest after the turn ended


def test_a_replay_steps_aside_at_its_ticks() -> None:
    """A recording with a few frames between two ticks (the large H200 one: at most 6 in 0.5 s):
    a turn that opens at its second frame stops the run at the first tick (0.5 s recorded),
    before 16 frames were fed."""
    source, turn, fed = _replay("h200-gpt-large.rec.gz")
    during: list[float] = []  # recorded times of the frames fed while that turn was open

    def on_fed(n: int) -> None:
        if n == 2:
            k = turn.begin()
            threading.Timer(0.5, turn.end, args=(k,)).start()
        elif turn.open:
            during.append(fed[-1])

    source.on_fed = on_fed  # type: ignore[attr-defined]
    data = DataThread(source, cadence_s=0)
    try:
        data.start().result(10)
        _wait_for(fed, 74)
    finally:
        turn.end()
        data.stop()
    assert len(fed) == 74
    assert all(t < 0.5 for t in during) and len(during) <= 4, during  # the frames before the first tick
