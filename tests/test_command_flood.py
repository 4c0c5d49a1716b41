"""A command flood from the monitor's side is bounded, counted and said (probe.transport.gate).

A real probe Publisher connects to a real XSUB bound where the monitor would be (a port squatter),
which subscribes and then sends thousands of command frames at once. The probe reads at most a
burst of command_bound.BURST plus command_bound.RATE_PER_S a second of them, drops the rest unread and counts them,
says so once, keeps its subscription, and takes a monitor's command again once the flood is over.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest
import zmq

from flowtop.monitor.model import Model
from flowtop.tools.demo.launch import free_port
from probe import _log, wire
from probe.transport import gate
from probe.transport.publisher import Publisher
from probe.wire import command_bound

from conftest import wait_until

HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu", "probe_version": "test"}


def _settled(pub: Publisher, quiet_s: float) -> Callable[[], bool]:
    """True once the probe's counts held still for ``quiet_s`` (what the flood queued is read)."""
    last: list[Any] = [None, time.monotonic()]

    def check() -> bool:
        counts = (pub.control_rejected, getattr(pub, "commands_dropped", 0))
        if counts != last[0]:
            last[:] = [counts, time.monotonic()]
        return time.monotonic() - last[1] >= quiet_s
    return check


def test_a_flood_is_bounded_counted_said_and_a_command_after_it_works(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(command_bound, "PAUSE_S", 0.2)  # read when a pause starts: shorter, the test stays light
    monkeypatch.setattr(_log, "_seen", set())  # the warning is said once per process
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.XSUB)
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.bind(addr)
    squatter.send(b"\x01")  # subscribes, as a monitor does
    pub = Publisher(wire.RankKey("flood", "h", 1, 0, 0), addr)
    pub.hello_fields = dict(HELLO)
    pub.start()
    try:
        # The squatter's socket takes the probe's connection (and repeats its subscription to it)
        # when its own thread looks at it.
        assert wait_until(lambda: squatter.poll(0) is not None and pub.subscribers == 1, 3.0)
        start = time.monotonic()
        for _ in range(5000):  # malformed: each one the probe reads is refused (control_rejected)
            squatter.send(b"\x02flood")  # an XSUB drops past its high-water mark: not all arrive
        assert wait_until(_settled(pub, 0.3), 3.0)
        elapsed = time.monotonic() - start
        # Read past the gate: a burst, then RATE_PER_S a second (at 5,000 refused before).
        most = command_bound.BURST + command_bound.RATE_PER_S * elapsed + 1
        assert 0 < pub.control_rejected <= most, (pub.control_rejected, elapsed)
        assert pub.commands_dropped >= 100  # at least what one poll read and drained
        assert pub.subscribers == 1  # the subscription held through the pauses
        said = [line for line in capsys.readouterr().err.splitlines() if "commands/s or more" in line]
        assert len(said) == 1 and "over the limit of 4/s (bursts of 32)" in said[0] and "port squatter" in said[0]
        # The flood is over: a monitor's command is read again (the bucket refills at 4/s).
        squatter.send(wire.encode_control("pace", None, None, 0.5))
        assert wait_until(lambda: pub._pace.flush_s == 0.5, 2.0)
    finally:
        pub.close(timeout_s=0.2)
        squatter.close(0)
        ctx.term()


def test_the_bucket_passes_a_burst_then_its_rate() -> None:
    """By hand: BURST at once, then one more per 1/RATE_PER_S s; drops counted, the window's rate said."""
    g = gate.CommandGate()
    t = g._at
    assert all(g.admit(t) for _ in range(command_bound.BURST))
    assert not g.admit(t) and g.dropped == 1
    assert not g.admit(t + 0.2) and g.dropped == 2  # 0.8 of a token
    assert g.admit(t + 0.26)  # 1.04 tokens: one passes
    g.pause(t + 0.26)
    assert g.paused(t + 0.26 + command_bound.PAUSE_S - 0.01) and not g.paused(t + 0.26 + command_bound.PAUSE_S)
    assert not hasattr(gate, "PAUSE_S")  # one binding, the wire's: a test patches one place
    assert g.warning is not None and g.warning.startswith("35 commands/s or more")  # 35 in 0.26 s: at least 35/s


def test_a_flooding_monitor_still_gets_the_ranks_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood that never stops: the round that ends each pause sends what waits (a changed hello
    here), though its read starts the next pause."""
    monkeypatch.setattr(command_bound, "PAUSE_S", 0.2)
    monkeypatch.setattr(_log, "_seen", set())
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.XSUB)
    squatter.setsockopt(zmq.LINGER, 0)
    squatter.bind(addr)
    squatter.send(b"\x01")
    pub = Publisher(wire.RankKey("flood", "h", 1, 0, 0), addr)
    pub.hello_fields = dict(HELLO)
    pub.start()
    devices: list[str] = []
    try:
        assert wait_until(lambda: squatter.poll(0) is not None and pub.subscribers == 1, 3.0)
        end = time.monotonic() + 2.0
        while time.monotonic() < end and "later" not in devices:
            for _ in range(200):  # one thread owns the socket: flood and read by turns
                squatter.send(b"\x02flood")
            while squatter.poll(0):
                msg = wire.decode(squatter.recv())
                if msg.kind == "hello":
                    devices.append(msg.fields["device"])
            if pub.commands_dropped and pub.hello_fields["device"] == "cpu":
                pub.hello_fields = dict(HELLO, device="later")  # flooded and paused by now: goes at a pause's end
            time.sleep(0.01)
        assert pub.commands_dropped > 0 and "later" in devices, (pub.commands_dropped, devices)
    finally:
        pub.close(timeout_s=0.2)
        squatter.close(0)
        ctx.term()


def test_the_monitor_says_the_first_flooded_rank_of_a_job_once() -> None:
    """The count arrives in the step frames (as commands_refused does); the monitor keeps the
    largest and says the first rank of a job whose probe dropped commands, once per job."""
    model = Model()

    def frame(rank: int, step: int, dropped: int) -> wire.Message:
        rec = {"step": step, "wall_s": 0.1, "tokens": 8, "drops": 0, "commands_dropped": dropped}
        return wire.decode(wire.encode_steps(wire.RankKey("j", "h", 100 + rank, rank, 0), step, 1.0, [rec], 0))

    model.ingest(frame(0, 1, 0), 1.0)
    assert model.notices.take() == ()
    model.ingest(frame(0, 2, 250), 2.0)
    model.ingest(frame(0, 3, 900), 3.0)
    model.ingest(frame(1, 1, 40), 3.0)  # another rank of the job: not said again
    (notice,) = model.notices.take()
    assert notice.severity == "warning" and notice.text.startswith("rank 0 of j dropped 250 commands unread")
    assert [st.commands_dropped for st in model.ranks.values()] == [900, 40]
    from flowtop.export.exporter import snapshot_families

    (exported,) = [f for f in snapshot_families(model.tick(3.0)) if f.name == "flowtop_job_commands_dropped"]
    assert [(s.labels["train_job"], s.value) for s in exported.samples] == [("j", 900 + 40)]


def test_one_bounded_read_for_a_probe_and_a_relay() -> None:
    """probe.wire.command_bound.read_commands by hand: subscriptions move the count (never under
    0), commands within the bound are taken, the first one over it takes the read to DRAIN_MAX
    frames in all (the rest dropped unread) and pauses."""
    class Empty(Exception):
        pass

    frames = [b"\x00", b"\x01", b"\x01"] + [b"cmd"] * (command_bound.BURST + 5000)
    it = iter(frames)

    def recv(flags: int) -> bytes:
        assert flags == 7
        try:
            return next(it)
        except StopIteration:
            raise Empty from None

    bound, taken = command_bound.CommandBound("a test's socket"), []
    now = bound._at  # the bucket's clock: full now
    subs = command_bound.read_commands(bound, recv, 7, Empty, 64, now, 0, taken.append)
    assert subs == 2 and len(taken) == command_bound.BURST  # the "\x00" before any subscription: 0
    assert bound.dropped == command_bound.DRAIN_MAX - 3 - command_bound.BURST  # DRAIN_MAX read in all
    assert bound.paused(now) and bound.warning is not None
