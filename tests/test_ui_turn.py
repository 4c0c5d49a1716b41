"""The UI's turn at the interpreter (flowtop.monitor.datathread.UiTurn): the data thread steps aside
while the UI renders a snapshot, for at most the turn's limit, with real sockets and a real app."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from flowtop.monitor.collector import Collector
from flowtop.monitor.datathread import DataThread, UiTurn
from flowtop.monitor.pacing import BusyMeter
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from synthetic.replay import ReplaySource, synthetic_snapshot


def test_a_turn_holds_the_data_thread_until_the_ui_ends_it() -> None:
    turn = UiTurn(limit_s=5.0)
    t = time.perf_counter()
    assert turn.give() == 0.0 and not turn.open  # no turn: nothing to wait for
    turn.begin()
    assert turn.open
    threading.Timer(0.2, turn.end).start()
    waited = turn.give()
    assert 0.15 <= waited < 2.0 and not turn.open
    assert turn.give() == 0.0  # ended: the data thread goes on at once
    assert (turn.turns, turn.ran_out) == (1, 0) and turn.given_s == pytest.approx(waited)
    assert time.perf_counter() - t < 3.0


def test_a_turn_nobody_ends_runs_out_after_its_limit() -> None:
    """A UI that never says it repainted (it died, a screen that never refreshes) costs the data
    thread one limit a snapshot, not its life."""
    turn = UiTurn(limit_s=0.2)
    turn.begin()
    t = time.perf_counter()
    assert 0.15 <= turn.give() < 1.0
    assert turn.ran_out == 1 and not turn.open
    assert turn.give() == 0.0 and time.perf_counter() - t < 1.0
    turn.begin()
    time.sleep(0.25)  # run out before anyone gives it
    assert turn.give() == 0.0 and turn.ran_out == 2


def test_the_collector_takes_no_frame_while_the_ui_has_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real sockets: frames that arrive during a UI's turn wait in the socket's queue, and are all
    taken once it ends; the wait is not counted as the data thread's busy time."""
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    model = make_model()
    collector = Collector(model, listen)
    turn = UiTurn(limit_s=20.0)
    collector.ui_turn = turn  # not through DataThread: its own snapshots would open turns nobody ends
    busy: list[float] = []  # what the drain loop counts as its frames' and ticks' time
    add = BusyMeter.add

    def counted(meter: BusyMeter, frames_s: float, ticks_s: float) -> None:
        busy.append(frames_s + ticks_s)
        add(meter, frames_s, ticks_s)

    monkeypatch.setattr(BusyMeter, "add", counted)
    data = DataThread(collector, cadence_s=0)
    data.start().result(10)
    pub = Publisher(RankKey("turn", "node-a", 4242, 0, 0), listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    try:
        step = 0
        deadline = time.monotonic() + 20
        while not model.ranks and time.monotonic() < deadline:
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.05)
        assert model.ranks, "the rank never arrived"
        turn.begin()
        time.sleep(0.3)  # the data thread is now waiting in give()
        before = model.received
        for _ in range(20):
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.05)
        time.sleep(0.3)
        assert model.received == before  # nothing taken during the turn
        turn.end()
        deadline = time.monotonic() + 10
        (st,) = model.ranks.values()
        while st.step < step and time.monotonic() < deadline:
            time.sleep(0.05)
        assert st.step == step  # all of them, once it ended
        assert turn.given_s >= 1.0 and turn.ran_out == 0
        assert max(busy) < 0.5  # the turn's ~1.3 s was given, not busy
    finally:
        pub.close()
        data.stop()


class _Fresh(ReplaySource):
    """Every snapshot a new one (taken_at counts up): each is handed over."""

    def __init__(self) -> None:
        super().__init__([synthetic_snapshot()], advance=False)
        self.served = 0

    def snapshot(self) -> MonitorSnapshot:
        self.served += 1
        return dataclasses.replace(super().snapshot(), taken_at=float(self.served))


@pytest.mark.asyncio
async def test_the_app_ends_its_turn_once_it_has_repainted() -> None:
    source = _Fresh()
    app = FlowtopApp(source, refresh_s=0)
    turn = app.data.ui_turn
    assert turn is not None
    turn.limit_s = 30.0  # only the app's end closes a turn within the test
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        begun = turn.turns
        assert begun >= 1  # the first snapshot opened one
        app.data.refresh().result(10)
        assert turn.open  # handed over: the UI's turn ...
        for _ in range(20):
            if not turn.open:
                break
            await pilot.pause(0.05)
        assert not turn.open and turn.turns == begun + 1  # ... ended by the app after its repaint
        assert turn.ran_out == 0
        await pilot.press("q")
