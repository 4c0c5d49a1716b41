"""A probe whose process was stopped (SIGSTOP) keeps what it had queued before the stop.

The sender drops what waited longer than ``max_age_s`` (a monitor that is not there must not
make it hold more and more). It counted the age on the monotonic clock, which runs on while the
process is stopped: a rank stopped for longer than ``max_age_s`` dropped the step records it had
queued just before, and the monitor lost steps that happened. Now a sleep of the sender that ends
late is a pause of the process (probe.transport.rounds.SenderClock.slept), and what was published
before it does not age by it; what is published during one (a thread that ran) still does, and
so does everything while the process runs. The sender's clocks are injected (no real sleeping);
one test stops a real process.
"""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from flowtop.tools.demo.launch import free_port
from probe import wire
from probe.transport import publisher as publisher_module
from probe.transport import rounds as rounds_module
from probe.transport.outbox import weights
from probe.transport.publisher import Publisher
from probe.transport.rounds import Round, SenderClock
from probe.transport.steprows import StepRow

ROOT = Path(__file__).resolve().parent.parent
STEP = {"step": 1, "wall_s": 0.01, "tokens": 1}


class Clocks:
    """The sender's monotonic, wall and perf_counter clocks, moved by the test (perf_counter at
    an origin of its own, as the real one is)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def mono(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + 1.7e9

    def perf(self) -> float:
        return self.t - 500.0


class Rig:
    """A publisher whose sender rounds the test runs by hand, nobody listening (what it holds
    waits: only its age decides), on injected clocks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, flush_s: float = 0.1) -> None:
        self.clocks = Clocks()
        monkeypatch.setattr(publisher_module, "_clock", self.clocks.wall)  # publish()'s stamp
        # Never started: nothing connects, the test plays the sender thread.
        self.pub = Publisher(wire.RankKey("pause", "h", 1, 0, 0), "tcp://127.0.0.1:9", max_age_s=2.0,
                             flush_s=flush_s)
        self.r = Round(None, SenderClock(self.clocks.mono, self.clocks.wall, self.clocks.perf))

    def round(self) -> None:
        now = self.r.begin()
        self.pub._take(self.r, False, now)
        self.pub._expire(self.r.pending, now)

    def sleep(self, asked_s: float, took_s: float | None = None) -> None:
        """The sender sleeps ``asked_s``; the process runs again ``took_s`` later (default: on time)."""
        start = self.r.clock.read()
        self.clocks.t += asked_s if took_s is None else took_s
        self.r.clock.slept(asked_s, start)

    def row(self, step: int) -> None:
        """The step tracker's quiet step (probe.steps.tracker.StepTracker.boundary): a row stamped
        on perf_counter, appended to the publisher's queue directly, then counted."""
        q = self.pub.queue
        row: StepRow = (step, self.clocks.perf(), 0.01, 1, None, None, 0.0, None, None, 1, 0.0)
        q.append(row)
        q.appended += 1

    def steps_at(self) -> dict[int, float]:
        """The pending step records' numbers, each with its frame's monotonic time."""
        return {rec["step"]: at for _, at, _, f in self.r.pending for rec in f["records"]}

    def held(self) -> int:
        """Messages the sender holds (pending or in its open batch)."""
        return weights(self.r.pending) + len(self.r.batch)


@pytest.mark.parametrize("taken", [False, True], ids=["in-the-queue", "taken"])
def test_a_record_queued_before_a_minute_long_stop_survives_it(monkeypatch: pytest.MonkeyPatch,
                                                               taken: bool) -> None:
    """Published, then the process stops for a minute (the sender asleep for 0.1 s): the round
    after the stop still holds the record, whether the sender had taken it before the stop or
    it was still in the training thread's queue."""
    rig = Rig(monkeypatch)
    rig.round()
    rig.pub.publish("step", dict(STEP))
    if taken:
        rig.round()
    rig.sleep(0.1, took_s=60.1)
    rig.round()
    assert (rig.pub.drops, rig.held()) == (0, 1)


def test_without_the_pause_credit_the_record_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: no lateness counts as a pause, and the record is dropped as a minute old
    (what the monitor lost before; the test above can fail)."""
    monkeypatch.setattr(rounds_module, "PAUSE_MIN_S", math.inf)
    rig = Rig(monkeypatch)
    rig.round()
    rig.pub.publish("step", dict(STEP))
    rig.sleep(0.1, took_s=60.1)
    rig.round()
    assert (rig.pub.drops, rig.held()) == (1, 0)


def test_what_waits_after_a_pause_still_expires_with_the_time_the_process_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound max_age_s keeps with no monitor: a record taken before a minute's stop is held
    after it until it has waited max_age_s (2 s) of the process's running time, then dropped."""
    rig = Rig(monkeypatch)
    rig.round()
    rig.pub.publish("step", dict(STEP))
    rig.round()  # 0.0 s of running time
    rig.sleep(0.5, took_s=60.5)  # 0.5 s ran, the rest was the stop
    rig.round()
    for _ in range(2):  # 1.5 s
        rig.sleep(0.5)
        rig.round()
    assert (rig.pub.drops, rig.held()) == (0, 1)
    rig.sleep(0.6)  # 2.1 s
    rig.round()
    assert (rig.pub.drops, rig.held()) == (1, 0)


def test_a_record_published_during_a_pause_is_not_credited_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record published after the sender's sleep was due (a thread that ran while the sender
    could not: it was not the process's pause) ages by the real time: dropped, while the one from
    before the sleep survives."""
    rig = Rig(monkeypatch)
    rig.round()
    rig.pub.publish("step", dict(STEP))
    rig.round()  # its own batch (a record taken with it would share its age: a batch's is its first's)
    start = rig.r.clock.read()
    rig.clocks.t += 1.1  # 1 s past the sleep's due end
    rig.pub.publish("step", dict(STEP, step=2))
    rig.clocks.t += 59.0
    rig.r.clock.slept(0.1, start)
    rig.round()
    assert (rig.pub.drops, rig.held()) == (1, 1)
    assert [rec["step"] for _, _, _, f in rig.r.pending for rec in f["records"]] == [1]


def test_an_open_batch_held_across_a_stop_leaves_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch the sender held open (a 1 s flush) when the process stopped: moved with the pause,
    it leaves after it with its record, not dropped as a minute old."""
    rig = Rig(monkeypatch, flush_s=1.0)
    rig.round()
    rig.pub.publish("step", dict(STEP))
    rig.round()  # the first record finds no batch sent for a flush: it leaves at once
    rig.pub.publish("step", dict(STEP, step=2))
    rig.sleep(0.1)
    rig.round()
    assert rig.r.batch, "the second record waits in the open batch"
    rig.sleep(0.8, took_s=60.8)
    rig.round()  # due now (closed by the round's take)
    rig.sleep(0.2)
    rig.round()
    assert (rig.pub.drops, rig.held()) == (0, 2)


CHILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from probe import wire
from probe.transport.publisher import Publisher
pub = Publisher(wire.RankKey("stopped", "h", 1, 0, 0), sys.argv[2], max_age_s=0.5, flush_s=0.4)
pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
pub.start()
while pub.subscribers == 0:
    time.sleep(0.01)
pub.publish("step", {"step": 1, "wall_s": 0.01, "tokens": 1})
time.sleep(0.05)  # it leaves at once (no batch before it); the next waits for the 0.4 s flush
pub.publish("step", {"step": 2, "wall_s": 0.01, "tokens": 1})
print("queued", flush=True)
time.sleep(30)
"""


def _take(sock: zmq.Socket[bytes], steps: list[int], wait_s: float) -> None:
    """What reached the monitor's socket within ``wait_s``: its step records' numbers into ``steps``."""
    if sock.poll(int(wait_s * 1000)):
        msg = wire.decode(sock.recv())
        if msg.steps is not None:
            steps.extend(int(s) for s in msg.steps.step)


def test_a_sigstopped_probe_sends_the_record_it_had_queued() -> None:
    """A real process (max_age_s 0.5 s, flush 0.4 s) stopped for 1 s right after it queued a
    step record: once continued, the record reaches the monitor's socket."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.bind(addr)
    sock.send(b"\x01")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), addr], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        steps: list[int] = []
        # The XSUB hands its subscription to a new peer only while it is used: poll it meanwhile.
        deadline = time.monotonic() + 5.0
        while not select.select([child.stdout], [], [], 0)[0] and time.monotonic() < deadline:
            _take(sock, steps, 0.01)
        assert child.stdout.readline().strip() == "queued"
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.0)
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 1.5
        while 2 not in steps and time.monotonic() < deadline:
            _take(sock, steps, 0.05)
        assert steps == [1, 2], steps
    finally:
        child.kill()
        child.wait(5)
        sock.close(0)
        ctx.term()


@pytest.mark.parametrize("taken", [False, True], ids=["in-the-queue", "taken"])
@pytest.mark.parametrize("credit", [True, False], ids=["credited", "control"])
def test_a_tracker_row_queued_before_a_stop_survives_it(monkeypatch: pytest.MonkeyPatch, taken: bool,
                                                        credit: bool) -> None:
    """The tracker's common step queues a perf_counter-stamped row, not a publish() dict: queued
    before a minute's stop, it is held after it; with no lateness counted as a pause (the
    control), it is dropped as a minute old (the row's stamp follows the injected clocks)."""
    if not credit:
        monkeypatch.setattr(rounds_module, "PAUSE_MIN_S", math.inf)
    rig = Rig(monkeypatch)
    rig.round()
    rig.row(1)
    if taken:
        rig.round()
    rig.sleep(0.1, took_s=60.1)
    rig.round()
    assert (rig.pub.drops, rig.held()) == ((0, 1) if credit else (1, 0))


def test_a_row_published_between_two_pauses_is_credited_with_the_second_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pauses without a round between them (the sender's empty looks sleep again): a row
    taken before both is moved by both, one published between them by the second only (moved by
    both, it aged too slowly: it outlived max_age_s of the process's running time)."""
    rig = Rig(monkeypatch)
    rig.round()
    rig.row(1)
    rig.round()  # taken before the pauses; its own frame (no batch before it)
    rig.sleep(0.1, took_s=60.1)  # first pause: due at 1000.1, 60 s late
    rig.sleep(0.5)  # an empty look, on time
    rig.row(2)  # at 1060.6
    rig.sleep(0.1, took_s=60.1)  # second pause: due at 1060.7, 60 s late
    rig.round()  # at 1120.7
    at = rig.steps_at()
    assert at[1] == pytest.approx(1000.0 + 120.0)
    assert at[2] == pytest.approx(1060.6 + 60.0)
    rig.sleep(1.95)  # row 2 has run 2.05 s since published (row 1: 2.65 s)
    rig.round()
    assert (rig.pub.drops, rig.held()) == (2, 0)
