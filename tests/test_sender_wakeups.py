"""A paced probe's sender thread sleeps as long as its pace allows (probe.transport.publisher:
each wake-up costs CPU, taken from training on a busy host), yet what goes at once still goes
at once: a message other than a step record, and close(). A real Publisher and a bare XSUB as
its monitor."""

from __future__ import annotations

import time
from typing import Iterator

import pytest
import zmq

from flowtop.tools.demo.launch import free_port
from probe import wire
from probe.transport import publisher as publisher_mod
from probe.transport.publisher import Publisher


class _Monitor:
    """A bare XSUB that subscribes, paces its rank and reads what arrives."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.addr = f"tcp://127.0.0.1:{free_port()}"
        self.sock = self.ctx.socket(zmq.XSUB)
        self.sock.bind(self.addr)

    def attach(self, pub: Publisher, pace_s: float) -> None:
        deadline = time.monotonic() + 10
        while pub.current_flush_s() != pace_s:
            assert time.monotonic() < deadline, "the rank never took the pace"
            self.sock.send(b"\x01")
            self.sock.send(wire.encode_control("pace", None, None, pace_s))
            self.kinds(0.1)

    def kinds(self, within_s: float) -> list[str]:
        out: list[str] = []
        deadline = time.monotonic() + within_s
        while (left := deadline - time.monotonic()) > 0:
            if self.sock.poll(int(1000 * left) + 1):
                out.append(wire.envelope(self.sock.recv()).kind)
        return out

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def monitor() -> Iterator[_Monitor]:
    m = _Monitor()
    try:
        yield m
    finally:
        m.close()


def _publisher(addr: str) -> Publisher:
    pub = Publisher(wire.RankKey("j", "node", 1, 0, 0), addr)
    pub.hello_fields = {"local_rank": 0, "world_size": 1}
    pub.start()
    return pub


def test_a_sender_paced_at_two_seconds_wakes_about_twice_a_second(monitor: _Monitor) -> None:
    pub = _publisher(monitor.addr)
    try:
        monitor.attach(pub, 2.0)
        before = pub.rounds
        monitor.kinds(3.0)
        rounds = pub.rounds - before
    finally:
        pub.close()
    assert 3 <= rounds <= 12  # every 0.5 s (and a round per message); 30 at the unpaced 10 Hz


def test_a_paced_sender_still_sends_at_once_what_goes_at_once(monitor: _Monitor,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_mod, "MAX_PACED_IDLE_S", 60.0)  # asleep unless woken
    monkeypatch.setattr(publisher_mod, "PACED_IDLE_SHARE", 30.0)
    pub = _publisher(monitor.addr)
    try:
        monitor.attach(pub, 2.0)
        monitor.kinds(1.0)
        pub.publish("step", {"step": 1, "wall_s": 0.01, "tokens": 10})  # held for the pace
        pub.publish("bye", {"reason": "test", "steps": 1, "drops": 0})  # goes at once: wakes it
        assert "bye" in monitor.kinds(1.5)
        pub.publish("step", {"step": 2, "wall_s": 0.01, "tokens": 10})
        started = time.monotonic()
        pub.close(timeout_s=2.0)  # flushes the held step and stops the thread
        took = time.monotonic() - started
        assert not pub._thread or not pub._thread.is_alive()
    finally:
        pub.close()
    assert took < 1.5  # not the 2 s until the held step would be due
    assert "stepcols" in monitor.kinds(1.0)
