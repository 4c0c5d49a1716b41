"""A relay sleeps until something is due (flowtop.tools.relay: each wake-up of a sleeping thread
costs CPU on the node it shares with training): idle, it wakes about once a second for its
report; stop() wakes it at once; a lone frame leaves at once and the frames that follow it within
flush_s leave together. Real sockets: a real Relay on a thread, a bare XSUB as its monitor."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import zmq

from flowtop.monitor.relays import decode_stamp
from flowtop.tools import relay as relay_mod
from flowtop.tools.demo.launch import free_port
from flowtop.tools.relay import Relay, RelayConfig
from probe import wire
from probe.wire import RankKey


class _Node:
    """A relay on a thread, its monitor (an XSUB that subscribed) and one rank socket."""

    def __init__(self, tmp: Path, flush_s: float = 0.05, report_s: float = 1.0, max_parts: int = 512) -> None:
        self.ctx = zmq.Context()
        upstream = f"tcp://127.0.0.1:{free_port()}"
        self.monitor = self.ctx.socket(zmq.XSUB)
        self.monitor.bind(upstream)
        self.relay = Relay(RelayConfig(f"ipc://{tmp}/r.sock", upstream, flush_s=flush_s, report_s=report_s,
                                       max_parts=max_parts, hosted_by="test"))
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()
        assert self.relay.ready.wait(10) and not self.relay.error
        deadline = time.monotonic() + 10
        while not self.relay.listening:  # subscribe once its connection is up (as a collector does)
            assert time.monotonic() < deadline, "the relay never connected"
            self.monitor.send(b"\x01")
            time.sleep(0.1)
        self.rank = self.ctx.socket(zmq.XPUB)
        self.rank.connect(f"ipc://{tmp}/r.sock")
        deadline = time.monotonic() + 10
        while self.rank.poll(100) == 0:  # the relay subscribes its ranks once a monitor listens
            assert time.monotonic() < deadline, "the relay never subscribed downstream"
        self.rank.recv()
        self.seq = 0

    def send(self, n: int, pad: int = 0) -> None:
        for _ in range(n):
            self.seq += 1
            fields = {"argv": ["x" * pad]} if pad else {}
            self.rank.send(wire.encode("hello", RankKey("j", "node", 1, 0, 0), self.seq, time.time(), fields))

    def batches(self, frames: int, timeout_s: float = 10.0) -> list[int]:
        """Rank frames per batch the monitor got until ``frames`` of them came (reports left out)."""
        sizes: list[int] = []
        deadline = time.monotonic() + timeout_s
        while sum(sizes) < frames and time.monotonic() < deadline:
            if self.monitor.poll(100):
                parts = self.monitor.recv_multipart()
                decode_stamp(parts[0], len(parts) - 1)
                kinds = [wire.envelope(p).kind for p in parts[1:]]
                if kinds != ["relay"]:
                    sizes.append(len(parts) - 1)
        return sizes

    def close(self) -> None:
        self.relay.stop()
        self.thread.join(10)
        self.rank.close(0)
        self.monitor.close(0)
        self.ctx.term()


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ftw"))  # ipc paths are limited to ~100 bytes
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_an_idle_relay_wakes_about_once_a_second(tmp: Path) -> None:
    node = _Node(tmp)
    try:
        node.batches(0)
        before = node.relay.wakes
        time.sleep(3.0)
        wakes = node.relay.wakes - before
    finally:
        node.close()
    # Its report every second (and a link event or two); woken every 100 ms before: 30 or more.
    assert 2 <= wakes <= 8


def test_stop_wakes_a_sleeping_relay(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_mod, "IDLE_WAIT_S", 60.0)
    node = _Node(tmp, report_s=60.0)
    try:
        time.sleep(1.5)  # past its first report: asleep until one of its sockets or stop() wakes it
        started = time.monotonic()
        node.relay.stop()
        node.thread.join(20)
        took = time.monotonic() - started
        assert not node.thread.is_alive()
    finally:
        node.close()
    assert took < 10  # not the 60 s it would sleep


def test_a_lone_frame_leaves_at_once_and_those_after_it_together(tmp: Path) -> None:
    node = _Node(tmp, flush_s=1.0)
    try:
        node.send(1)
        assert node.batches(1, timeout_s=0.9) == [1]  # no batch for a second: it did not wait
        node.send(3)  # within flush_s of that batch: they wait for the next, together
        assert node.batches(3) == [3]
    finally:
        node.close()


@pytest.mark.slow
def test_a_relay_whose_monitor_stops_reading_does_not_spin(tmp: Path) -> None:
    """Upstream full (a monitor that stopped reading): batches and the report are tried again
    every RETRY_S, not at every turn of the loop (a failed report kept it due: 131,704 wake-ups
    in 2 s in the review's run)."""
    node = _Node(tmp, max_parts=1)
    try:
        deadline = time.monotonic() + 30
        while node.relay.drops == 0:  # a frame a batch, until the link (and the monitor's queue) is full
            assert time.monotonic() < deadline, "upstream never filled"
            sent = node.seq
            node.send(500, pad=20_000)
            while node.relay.frames_in < sent + 400 and time.monotonic() < deadline:
                time.sleep(0.01)  # the rank's own queue drops what the relay has not taken
            time.sleep(0.2)
        time.sleep(2.5)  # past max_age_s: what could not leave has been dropped
        before = node.relay.wakes
        time.sleep(1.0)
        wakes = node.relay.wakes - before
    finally:
        node.close()
    assert wakes <= 300  # ~100 a second at RETRY_S


def test_stop_from_a_signal_handler_while_the_loop_holds_the_wake_lock() -> None:
    """`flowtop relay` runs the loop on its main thread, whose SIGTERM handler calls stop(): a
    signal landing while that thread holds the wake lock (setting the pipe up, closing it) must
    not wait on the lock forever."""
    relay = Relay(RelayConfig("ipc:///tmp/ftw-unused.sock", "tcp://127.0.0.1:1", hosted_by="test"))
    done = threading.Event()

    def handler_inside_the_lock() -> None:
        with relay._wake_lock:  # as run() holds it
            relay.stop()  # as the signal handler, on the same thread
            done.set()

    threading.Thread(target=handler_inside_the_lock, daemon=True).start()
    assert done.wait(10)


@pytest.mark.slow
def test_a_paced_relay_reports_less_often_while_batches_leave(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay carrying a monitor's pace down stretches its report by the pace as its ranks
    stretch their telemetry (512 relays reporting every second were an eighth of the frames a
    monitor of 4,096 ranks read), while its batches say it lives; with no batch its report is the
    heartbeat again, every report_s. Scaled down: report_s 0.5 s, stretched up to 2.5 s (a stall
    of the sending loop under 0.5 s adds no heartbeat)."""
    monkeypatch.setattr(relay_mod, "REPORT_PACED_MAX_S", 2.5)
    node = _Node(tmp, report_s=0.5, flush_s=0.02)

    def reports_while(seconds: float, sending: bool) -> int:
        """Reports the monitor got in ``seconds`` while the rank sends a frame every 20 ms (or not)."""
        n, end, next_send = 0, time.monotonic() + seconds, 0.0
        while time.monotonic() < end:
            if sending and time.monotonic() >= next_send:
                node.send(1)
                next_send = time.monotonic() + 0.02
            if node.monitor.poll(10):
                parts = node.monitor.recv_multipart()
                n += wire.envelope(parts[-1]).kind == "relay"
        return n

    try:
        unpaced = reports_while(3.0, sending=True)
        node.monitor.send(wire.encode_control("pace", None, None, 2.0))  # down through the relay
        reports_while(1.0, sending=True)  # the pace reaches it
        paced = reports_while(5.0, sending=True)
        quiet = reports_while(2.0, sending=False)
    finally:
        node.close()
    assert unpaced >= 4, unpaced  # every 0.5 s: ~6
    assert paced <= 3, paced  # every 2.5 s: ~2 (was ~10)
    assert quiet >= 3, quiet  # no batch: every 0.5 s again, ~4
