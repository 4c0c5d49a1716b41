"""A relay's timing decisions and its sends, pinned by hand (flowtop.tools.relay): when its next
report goes (report_s, stretched by a monitor's pace, never later than report_s after the last
batch, not before a refused one's retry), how long its loop sleeps, when its queued frames leave,
how a batch goes out part by part, and that a drain takes what came and stops when nothing is left.
No loop runs: a Relay is made (nothing bound) and its helpers called with chosen times."""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from typing import Any, Iterator

import pytest
import zmq

from flowtop.tools.relay import IDLE_WAIT_S, Relay, RelayConfig, _send_parts


@pytest.fixture
def relay() -> Iterator[Relay]:
    d = tempfile.mkdtemp(prefix="ftt")
    try:
        yield Relay(RelayConfig(f"ipc://{d}/r.sock", "tcp://127.0.0.1:5999", report_s=1.0, flush_s=0.05,
                                max_parts=4, max_age_s=2.0))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _pace(relay: Relay, flush_s: float, until: float) -> None:
    relay._commands.pace = (flush_s, until)


def test_unpaced_report_is_report_s_after_the_last_one(relay: Relay) -> None:
    relay._last_batch = 9.0
    assert relay._report_due(10.0, -math.inf, 10.5) == 11.0
    relay._last_batch = 10.4  # a batch after the report: report_s after the report still
    assert relay._report_due(10.0, -math.inf, 10.5) == 11.0


def test_a_pace_stretches_the_report_and_a_new_pace_restretches_it(relay: Relay) -> None:
    # Pace 0.4 s against the probes' 0.1 s: 4 x report_s = 4 s, within REPORT_PACED_MAX_S (5 s).
    _pace(relay, 0.4, until=100.0)
    relay._last_batch = 13.2  # batches leave: report_s after the last one is later than 4 s after the report
    assert relay._report_due(10.0, -math.inf, 13.3) == 14.0
    relay._last_batch = 9.0  # none left since: report_s after the report, as unpaced
    assert relay._report_due(10.0, -math.inf, 10.5) == 11.0
    # Pace 0.8 s: 8 x report_s, capped at 5 s (a stale 4 s would say 14).
    _pace(relay, 0.8, until=100.0)
    relay._last_batch = 14.5
    assert relay._report_due(10.0, -math.inf, 14.6) == 15.0
    # The pace lapsed: report_s again.
    assert relay._report_due(10.0, -math.inf, 100.0) == 11.0


def test_a_refused_report_waits_for_its_retry(relay: Relay) -> None:
    relay._last_batch = 9.0
    assert relay._report_due(10.0, 11.25, 10.5) == 11.25
    assert relay._report_due(10.0, 10.75, 10.5) == 11.0  # a retry before it is due: when due


def test_the_loop_sleeps_until_the_next_report_at_most_idle_wait(relay: Relay) -> None:
    assert relay._wait(10.0, 10.25, listening=True) == 0.25
    assert relay._wait(10.0, 20.0, listening=True) == IDLE_WAIT_S
    assert relay._wait(10.0, 9.0, listening=True) == 0.0  # overdue: no sleep
    assert relay._wait(10.0, 10.25, listening=False) == IDLE_WAIT_S  # no monitor: no report due


def test_the_loop_sleeps_until_a_batch_is_due_or_a_frame_expires(relay: Relay) -> None:
    relay._queue.append((b"f", 10.0))
    relay._last_batch = 9.5  # none left for flush_s: the frame leaves at once
    assert relay._wait(10.0, 10.5, listening=True) == 0.0
    relay._last_batch = 9.99  # one left 10 ms ago: this one waits until flush_s after it
    assert relay._wait(10.0, 10.5, listening=True) == pytest.approx(0.04)
    # No monitor: until the frame is max_age_s (2 s) old, at most IDLE_WAIT_S.
    assert relay._wait(11.5, 10.5, listening=False) == pytest.approx(0.5)
    assert relay._wait(10.0, 10.5, listening=False) == IDLE_WAIT_S


def test_a_pause_holds_reports_and_batches_until_its_end(relay: Relay) -> None:
    relay._commands.bound.paused_until = 10.5
    assert relay._wait(10.0, 10.25, listening=True) == 0.5  # the report is due sooner: at the pause's end
    relay._queue.append((b"f", 9.0))
    assert relay._wait(10.0, 20.0, listening=True) == 0.5  # a batch due at once: at the pause's end
    assert relay._wait(10.0, 20.0, listening=False) == 0.5  # its end reads upstream, monitor or none


def test_a_full_batch_is_due_at_once_yet_not_before_a_refused_ones_retry(relay: Relay) -> None:
    relay._last_batch = 9.99
    for i in range(4):  # max_parts
        relay._queue.append((b"f", 10.0 + i / 1000))
    assert relay._batch_at() == -math.inf
    relay._retry_at = 10.01
    assert relay._batch_at() == 10.01
    relay._queue.pop()
    assert relay._batch_at() == pytest.approx(10.04)  # flush_s after the last batch


class _Sock:
    """What _send_parts calls: send(data, flags[, copy]); ``full``: the first send says Again."""

    def __init__(self, full: bool = False) -> None:
        self.full = full
        self.calls: list[tuple[bytes, int, bool]] = []

    def send(self, data: Any, flags: int, copy: bool = True) -> None:
        if self.full:
            raise zmq.Again()
        self.calls.append((bytes(data), flags, copy))


def test_a_batch_leaves_part_by_part_the_last_without_more_large_parts_zero_copy() -> None:
    sock = _Sock()
    big = b"k" * 65536  # pyzmq's copy threshold: sent zero-copy, as send_multipart(copy=False) did
    assert _send_parts(sock, b"stamp", (b"a", big))
    noblock, more = 1, 1 | 2  # ZMQ_DONTWAIT, ZMQ_DONTWAIT | ZMQ_SNDMORE
    assert sock.calls == [(b"stamp", more, True), (b"a", more, True), (big, noblock, False)]


def test_a_batch_of_no_part_is_refused_not_sent_as_a_lone_stamp() -> None:
    sock = _Sock(full=False)
    with pytest.raises(ValueError, match="one part at least"):
        _send_parts(sock, b"stamp", ())
    assert sock.calls == []


def test_a_full_upstream_takes_no_part_of_a_batch() -> None:
    sock = _Sock(full=True)
    assert not _send_parts(sock, b"stamp", (b"a", b"b"))
    assert sock.calls == []


def test_a_drain_takes_every_queued_frame_in_order_and_an_empty_one_nothing(relay: Relay) -> None:
    d = tempfile.mkdtemp(prefix="ftd")
    ctx = zmq.Context()
    down, rank = ctx.socket(zmq.XSUB), ctx.socket(zmq.XPUB)
    try:
        down.bind(f"ipc://{d}/d.sock")
        rank.connect(f"ipc://{d}/d.sock")
        for _ in range(100):  # a subscription sent before the connection is attached is lost: again
            down.send(b"\x01")
            if rank.poll(50):
                break
        assert rank.poll(0)
        rank.recv()  # the subscription: the rank sends from now on
        while rank.poll(0):  # the repeats
            rank.recv()
        frames = [f"frame {i}".encode() * (i + 1) for i in range(5)]
        for f in frames:
            rank.send(f)
        deadline = time.monotonic() + 5
        while not down.poll(100):
            assert time.monotonic() < deadline
        time.sleep(0.2)  # all five in the socket's queue (ipc on one host: they are there by now)
        relay._drain_down(down, 7.0)
        assert list(relay._queue) == [(f, 7.0) for f in frames]
        assert (relay.frames_in, relay.bytes_in) == (5, sum(len(f) for f in frames))
        relay._drain_down(down, 8.0)  # nothing left: nothing taken, nothing raised
        assert relay.frames_in == 5
    finally:
        down.close(0)
        rank.close(0)
        ctx.term()
        shutil.rmtree(d, ignore_errors=True)
