"""The monitor's garbage-collection policy (flowtop.monitor.gcpolicy): what is alive at a tick is
frozen out of the collections that follow, and cycles among it are collected whole at the next
full collection."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from typing import Iterator

import pytest

from flowtop.monitor import gcpolicy


class _Node:
    """A cycle's member that a weak reference can watch."""

    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture()
def unfrozen() -> Iterator[None]:
    """Leave the test process as it was: nothing frozen."""
    gc.unfreeze()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()


def _in_a_generation(obj: object) -> bool:
    return any(o is obj for g in range(3) for o in gc.get_objects(g))


def test_what_is_alive_at_a_tick_is_frozen_and_its_cycles_wait_for_the_full_collection(unfrozen: None) -> None:
    t = [0.0]
    freezer = gcpolicy.Freezer(full_every_s=30.0, clock=lambda: t[0])
    kept = [1.0, 2.0]
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    assert _in_a_generation(kept)
    t[0] = 0.5
    freezer.after_tick()
    assert gc.get_freeze_count() > 0 and not _in_a_generation(kept)  # no collection walks it now
    del a, b
    gc.collect()
    assert gone() is not None  # a frozen cycle: no collection looks at it ...
    made_later = [3.0]
    t[0] = 29.9
    freezer.after_tick()
    assert gone() is not None and freezer.fulls == 0 and not _in_a_generation(made_later)
    t[0] = 30.0  # ... until the full collection, every full_every_s
    freezer.after_tick()
    assert gone() is None and freezer.fulls == 1
    assert gc.get_freeze_count() > 0  # and the survivors frozen again
    t[0] = 59.9
    freezer.after_tick()
    assert freezer.fulls == 1


def test_a_long_full_collection_puts_off_the_next_one(unfrozen: None) -> None:
    """The next full collection waits until the last one's pause is 0.5 % of the time since it:
    a 1 s pause (a large monitor on a busy node) is followed 200 s after its end, a 50 ms one 30 s, and
    none waits longer than 300 s."""
    t = [0.0]
    pauses = iter([1.0, 0.05, 2.0, 0.05])
    fulls: list[float] = []

    def collect() -> None:  # a full collection taking the next pause on the test's clock
        fulls.append(t[0])
        t[0] += next(pauses)

    freezer = gcpolicy.Freezer(clock=lambda: t[0], collect=collect)
    for tick in range(2 * 590):
        t[0] = max(t[0], tick * 0.5)
        freezer.after_tick()
    # at 30 s; then 1 s + 200 s; 0.05 s + 30 s (the next tick after 261.05); 2 s + 300 s, not 400
    assert fulls == pytest.approx([30.0, 231.0, 261.5, 563.5])
    assert freezer.fulls == 4


def test_only_a_process_whose_command_set_the_monitors_policy_freezes() -> None:
    """A library or a test importing the data side freezes nothing; a monitor's command freezes at
    each tick (its own interpreter: the policy is process-wide)."""
    code = ("import gc; from flowtop.monitor import gcpolicy; gcpolicy.after_tick(); a = gc.get_freeze_count(); "
            "gcpolicy.for_monitor(); gcpolicy.after_tick(); print(a, gc.get_freeze_count() > 0, gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().split(None, 2) == ["0", "True", str(gcpolicy.THRESHOLDS)]


def test_the_collector_freezes_after_the_ticks_its_ticker_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowtop.monitor.collector import Collector
    from flowtop.monitor.ticker import Ticker
    from flowtop.monitor.wiring import make_model

    t = [100.0]

    class Clock:  # the monitor clock, driven by the test
        pauses: list[object] = []

        def now(self) -> float:
            return t[0]

    frozen: list[float] = []
    monkeypatch.setattr(gcpolicy, "after_tick", lambda: frozen.append(t[0]))
    collector = Collector(make_model(), "tcp://127.0.0.1:1", clock=Clock())  # type: ignore[arg-type]
    collector.ticker = Ticker(lambda at: collector.model.tick(at), 100.0, 0.5)
    for i in range(1, 8):
        t[0] = 100.0 + 0.3 * i
        collector.catch_up()
    # once per catch-up that ran a tick (ticks at 100.5, 101, 101.5 and 102), none at 100.3, 100.9, 101.8
    assert frozen == pytest.approx([100.6, 101.2, 101.5, 102.1])


def test_no_collection_runs_during_a_monitors_ticks(monkeypatch: pytest.MonkeyPatch, unfrozen: None) -> None:
    """A tick's objects (its views, the histories its hints read) live until the freeze after it:
    a monitor's ticker runs its ticks with the collector off; a library's ticker does not."""
    from flowtop.monitor.ticker import Ticker

    started: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    def tick(at: float) -> object:
        made = [[i] for i in range(50_000)]  # tracked objects, alive through the tick: ~70 young
        started.append(-1)  # collections at CPython's default threshold of 700
        return made

    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.callbacks.append(watch)
    try:
        for policy in (None, gcpolicy.Freezer(full_every_s=1e9)):
            monkeypatch.setattr(gcpolicy, "_FREEZER", policy)
            started.clear()
            Ticker(tick, 0.0, 0.5).catch_up(0.5)  # type: ignore[arg-type]
            during = started[:started.index(-1)]
            assert (len(during) > 10) if policy is None else started == [-1]  # none after it either:
            assert gc.isenabled()  # what the tick left was frozen before the collector came back
            assert policy is None or gc.get_count()[0] < 100
        def raises(at: float) -> object:
            raise RuntimeError("a tick's bug")

        with pytest.raises(RuntimeError):
            Ticker(raises, 0.0, 0.5).catch_up(0.5)  # type: ignore[arg-type]
        assert gc.isenabled()  # back on after a tick that raised
    finally:
        gc.callbacks.remove(watch)
        gc.set_threshold(*thresholds)
