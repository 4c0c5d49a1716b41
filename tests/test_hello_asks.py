"""A rank the monitor forgot gets its MFU back at once: the monitor asks it for its hello and count.

The monitor evicts a job whose ranks were all silent for EVICT_AFTER_S (a job frozen with
SIGSTOP). When the ranks resumed, their steps came back on the same connection, which the probe
had no reason to think new: no hello (device, world size) for 10-30 s and no FLOP count until the
next re-count, up to FLOWTOP_RECHECK_STEPS steps: no MFU. Now a rank first heard by a frame that
says it ran before is asked ("hello_now", wire 1.4) unless its hello and count come by themselves
(flowtop.monitor.hello_asks), and the probe sends both again (probe.transport.sender). Unit tests of
the asks and the command, then a real probe's publisher and a real collector, evicting for real
(its clock moved past EVICT_AFTER_S).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from typing import Callable, Iterator

import pytest

from flowtop.monitor import hello_asks as asks_module
from flowtop.monitor.clock import MonitorClock
from flowtop.monitor.collector import Collector
from flowtop.monitor.hello_asks import ASK_AGAIN_S, ASK_GRACE_S, ASK_TRIES, HelloAsk, HelloAsks, Lack, lack_of
from flowtop.monitor.rankstate import EVICT_AFTER_S
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port
from flowtop.tools.relay import Relay, RelayConfig
from monitor_thread import MonitorThread
from probe import wire
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from probe.wire import command_bound as bound

A = [RankKey("a", "h", 10 + r, r, 0) for r in range(2)]
B = RankKey("b", "h", 20, 0, 0)


def test_the_command_is_valid_for_a_job_or_every_job() -> None:
    assert wire.decode_control(wire.encode_control("hello_now", "j", None)) == ("hello_now", "j", None, None, None)
    assert wire.decode_control(wire.encode_control("hello_now", None, None)).job is None
    with pytest.raises(wire.WireError):
        wire.decode_control(wire.encode_control("hello_now", "j", None, 0.5))  # flush_s is the pace's
    with pytest.raises(wire.WireError):
        wire.decode_control(wire.encode_control("kernels_now", None, 0))  # still a job's alone
    assert bound.MONITOR_RATE_PER_S <= bound.RATE_PER_S / 2 and bound.MONITOR_BURST <= bound.BURST / 4


def _lacks(lack: Lack) -> Callable[[RankKey], Lack]:
    return lambda key: lack


def test_a_forgotten_rank_is_asked_after_the_grace_then_again_a_few_times() -> None:
    asks = HelloAsks()
    hello = _lacks("hello")
    asks.note(A[0], 100.0)
    assert asks.due(100.0 + ASK_GRACE_S / 2, hello) is None  # its own may be on the way
    assert asks.due(100.0 + ASK_GRACE_S, hello) == HelloAsk("a", 1)
    assert asks.due(101.0, hello) is None  # asked: again only after ASK_AGAIN_S
    t, sent = 100.0 + ASK_GRACE_S, 1
    for _ in range(10):
        t += ASK_AGAIN_S
        sent += asks.due(t, hello) is not None
    assert sent == ASK_TRIES == asks.sent


def test_a_rank_with_its_hello_but_no_count_is_asked_once() -> None:
    """Its hello came (after the ask, or before it): a probe sends its count with the hello it
    was asked for, so it has none to send (counting off, or not counted yet)."""
    asks = HelloAsks()
    asks.note(A[0], 100.0)
    assert asks.due(101.0, _lacks("count")) == HelloAsk("a", 1)
    assert all(asks.due(101.0 + k * ASK_AGAIN_S, _lacks("count")) is None for k in range(1, 5))


def test_a_rank_that_brought_its_hello_and_count_is_not_asked() -> None:
    asks = HelloAsks()
    asks.note(A[0], 100.0)
    assert asks.due(101.0, _lacks("nothing")) is None and asks.sent == 0
    assert asks.due(200.0, _lacks("hello")) is None  # forgotten once satisfied


def test_several_jobs_waiting_are_asked_job_by_job_while_the_bucket_lasts() -> None:
    """Two jobs and a burst of two asks: one command each, so the ranks of jobs the monitor
    knows whole do not resend; more jobs waiting than asks at hand: one command for every job."""
    assert bound.HELLO_ASKS_BURST == 2
    asks = HelloAsks()
    for key in (*A, B):
        asks.note(key, 100.0)
    assert asks.due(101.0, _lacks("hello")) == HelloAsk("a", 2)
    assert asks.due(101.0, _lacks("hello")) == HelloAsk("b", 1)
    many = HelloAsks()
    for i in range(3):
        many.note(RankKey(f"j{i}", "h", i, 0, 0), 100.0)
    assert many.due(101.0, _lacks("hello")) == HelloAsk(None, 3)


def test_the_asks_stay_within_the_monitors_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks forgotten one after another, each in a job of its own: at most HELLO_ASKS_BURST asks
    at once, then HELLO_ASKS_RATE_PER_S (the monitor's share of what a peer takes)."""
    monkeypatch.setattr(asks_module, "ASK_GRACE_S", 0.0)
    asks = HelloAsks()
    sent = 0
    for i in range(40):  # one new rank every 0.1 s for 4 s
        asks.note(RankKey(f"j{i}", "h", i, 0, 0), 100.0 + i * 0.1)
        sent += asks.due(100.0 + i * 0.1, _lacks("hello")) is not None
    assert sent <= bound.HELLO_ASKS_BURST + 4 * bound.HELLO_ASKS_RATE_PER_S + 1, sent


def test_the_model_notes_ranks_first_heard_by_a_frame_that_says_they_ran() -> None:
    """A starting rank's hello (no step yet) and a bye are not noted; a hello with a last step
    (the first frame of a rank resumed after a long stop: its hello is due then), a step, a
    count are."""
    model = make_model()
    model.hello_asks = asks = HelloAsks()
    frames = [("hello", HELLO), ("hello", dict(HELLO, last_step=7, step_age_s=30.0)),
              ("step", {"step": 8, "wall_s": 0.1, "tokens": 1, "drops": 0}), ("flops", FLOPS),
              ("bye", {"reason": "exit", "steps": 1, "drops": 0})]
    for i, (kind, fields) in enumerate(frames):
        model.ingest(wire.decode(wire.encode(kind, RankKey("n", "h", i, 0, 0), 1, 1.0, fields)), 100.0)
    assert asks.due(101.0, _lacks("hello")) == HelloAsk("n", 3)


def test_what_a_rank_lacks_is_read_from_the_models_own_state() -> None:
    """A rank heard only by a step lacks its hello (three tries); one with a hello but no count
    lacks its count (one); one with both, or a bye, lacks nothing: read from the RankState the
    model keeps, whose hello record holds its defaults until a hello comes."""
    model = make_model()
    model.hello_asks = asks = HelloAsks()
    step = {"step": 8, "wall_s": 0.1, "tokens": 1, "drops": 0}

    def send(rank: int, kind: str, fields: dict[str, object]) -> None:
        model.ingest(wire.decode(wire.encode(kind, RankKey("n", "h", rank, 0, 0), 1, 1.0, fields)), 100.0)

    send(0, "step", step)  # nothing but steps
    send(1, "step", step)
    send(1, "hello", dict(HELLO, last_step=8, step_age_s=0.1))  # its hello, no count
    send(2, "step", step)
    send(2, "hello", dict(HELLO, last_step=8, step_age_s=0.1))
    send(2, "flops", FLOPS)  # both
    lacks = [lack_of(model.ranks.get(RankKey("n", "h", r, 0, 0))) for r in range(3)]
    assert lacks == ["hello", "count", "nothing"]
    lacking = lambda key: lack_of(model.ranks.get(key))  # noqa: E731
    assert asks.due(101.0, lacking) == HelloAsk("n", 2)  # ranks 0 and 1
    assert asks.due(101.0 + ASK_AGAIN_S, lacking) == HelloAsk("n", 1)  # rank 0 again: still no hello
    assert asks.due(101.0 + 2 * ASK_AGAIN_S, lacking) == HelloAsk("n", 1)
    assert asks.due(101.0 + 9 * ASK_AGAIN_S, lacking) is None and asks.sent == 3  # ASK_TRIES for rank 0


def test_the_due_scan_waits_for_the_next_due_instant() -> None:
    """due() runs at every turn of the data loop: before the grace ends it reads no rank."""
    asks = HelloAsks()
    for r in range(1000):
        asks.note(RankKey("a", "h", r, 0, 0), 100.0)
    read: list[RankKey] = []

    def lacking(key: RankKey) -> Lack:
        read.append(key)
        return "hello"

    assert asks.due(100.2, lacking) is None and read == []
    assert asks.due(100.0 + ASK_GRACE_S, lacking) == HelloAsk("a", 1000) and len(read) == 1000
    assert asks.due(101.0, lacking) is None and len(read) == 1000  # next due: ASK_AGAIN_S later


def test_the_probe_sends_its_hello_and_count_again_when_asked() -> None:
    """The sender's round after the command: its hello first, the count in force right after."""
    pub = Publisher(RankKey("a", "h", 10, 0, 0), "tcp://127.0.0.1:9")  # never started: the test is its sender
    pub.hello_fields = dict(HELLO)
    from probe.transport.rounds import Round

    r = pub._round = Round(pub.hello_fields)
    r.listening, r.flops = True, dict(FLOPS)
    r.hello_at = r.next_hello = r.steps_at = now = r.begin()  # heard just now: no hello due
    pub._queue_hello(r, now)
    pub._resend_count(r, now)
    assert not r.pending
    pub._handle_control([wire.encode_control("hello_now", "other", None)])  # another job's
    pub._queue_hello(r, now)
    assert not r.pending
    pub._handle_control([wire.encode_control("hello_now", None, None)])
    pub._queue_hello(r, now)
    pub._resend_count(r, now)
    assert [kind for kind, _, _, _ in r.pending] == ["hello", "flops"]


HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
FLOPS = {"step": 2, "model_flops": 1.0e9, "executed_flops": 1.0e9, "attention": "full", "dtype": "fp32",
         "peak_flops": 1e12, "peak_source": "test", "uncounted": {}, "tokens": 64}


class Skewed:
    """The collector's raw clock: the real one, moved ahead by the test (its pauses are not taken
    out: the jump is time the monitor ran, listening to a silent rank)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead


@pytest.fixture
def skewed() -> Iterator[tuple[MonitorThread, Skewed]]:
    raw = Skewed()
    listen = f"tcp://127.0.0.1:{free_port()}"
    collector = Collector(make_model(), listen, clock=MonitorClock(raw, pause_s=float("inf")), tick_s=0.1)
    m = MonitorThread(listen, collector=collector)
    try:
        yield m, raw
    finally:
        m.close()


def _counted(snap: MonitorSnapshot) -> bool:
    ranks = [r for j in snap.jobs for r in j.ranks]
    return bool(ranks) and all(r.flops is not None and r.flops.model_flops_per_step for r in ranks)


def _until(pred, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(pred())


@pytest.fixture(params=["direct", "relay"])
def connect(request: pytest.FixtureRequest, skewed: tuple[MonitorThread, Skewed]) -> Iterator[str]:
    """Where the rank connects: the monitor, or a node relay (a thread here) that carries the
    monitor's commands down to it."""
    if request.param == "direct":
        yield skewed[0].listen
        return
    tmp = tempfile.mkdtemp(prefix="fth")  # ipc paths are short
    relay = Relay(RelayConfig(f"ipc://{tmp}/r.sock", skewed[0].listen, hosted_by="test"))
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        assert relay.ready.wait(10) and not relay.error
        yield f"ipc://{tmp}/r.sock"
    finally:
        relay.stop()
        thread.join(10)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_rank_resuming_after_its_job_was_evicted_has_its_flop_count_again(
        skewed: tuple[MonitorThread, Skewed], connect: str) -> None:
    monitor, raw = skewed
    pub = Publisher(RankKey("evicted", "h", 1, 0, 0), connect)
    pub.hello_fields = dict(HELLO)
    pub.start()
    try:
        assert _until(lambda: pub.subscribers > 0, 5.0)
        pub.publish_now("flops", dict(FLOPS))
        for step in range(1, 4):
            pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 64})
        assert monitor.wait_for(_counted, 3.0) and _counted(monitor.published())
        # Silent (no step; its next hello is 2.5 s away) past EVICT_AFTER_S: the job is evicted.
        raw.ahead = EVICT_AFTER_S + 60.0
        assert _until(lambda: not monitor.call(lambda: monitor.collector.model.ranks), 2.0)
        pub.publish("step", {"step": 4, "wall_s": 0.05, "tokens": 64})  # it resumes
        snap = monitor.wait_for(_counted, 2.0)
        assert _counted(snap), [(r.rank, r.flops) for j in snap.jobs for r in j.ranks]
        assert monitor.collector.hello_asks.sent == 1
        assert [(j.world_size, r.device) for j in snap.jobs for r in j.ranks] == [(1, "cpu (test)")]  # its hello too
    finally:
        pub.close()
