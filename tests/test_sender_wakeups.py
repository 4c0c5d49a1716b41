"""The probe's sender thread sleeps until something is due, and wakes at once for what cannot wait.

Each wake-up costs a sleeping thread 0.1-0.4 ms of CPU on a loaded host (taken from training), so
the sender sleeps until a batch, a hello or a periodic job is due; a subscription, a command, a
rare message, close() and the first step after a quiet spell wake it. These tests run a real probe
(its runtime's every-round job, telemetry, the SIGTERM watch where this process allows one) against
a real ZeroMQ socket standing where the monitor binds, and count the sender's rounds
(probe.transport.link.Waker.waits)."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest
import zmq

import probe
from flowtop.tools.demo.launch import free_port
from probe import wire
from probe.transport import outbox as outbox_module
from probe.transport import publisher as publisher_module
from probe.transport import rounds as rounds_module
from probe.transport import sender as sender_module
from probe.transport.outbox import HELLO_S, STEPS_ALIVE_S
from probe.transport.publisher import Publisher

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")


class RawMonitor:
    """A real XSUB bound where the monitor would be: subscribes, keeps what arrives (kind, records,
    arrival time) and sends commands, all from one reader thread (a ZeroMQ socket is not
    thread-safe)."""

    def __init__(self, addr: str | None = None, rcvhwm: int = 1000) -> None:
        self.addr = addr or f"tcp://127.0.0.1:{free_port()}"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.XSUB)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)  # small: a paused reader backs the sender up
        self._sock.setsockopt(zmq.RCVBUF, 64 * 1024)
        self._sock.bind(self.addr)
        self._sock.send(b"\x01")  # subscribe to everything (XSUB repeats it to each new peer)
        self.got: list[tuple[float, str, int]] = []  # (arrival, kind, step records)
        self.frames: list[tuple[float, wire.Message]] = []  # (arrival, the decoded frame)
        self.delays: dict[str, list[float]] = {}  # kind -> seconds from its timestamp to its arrival
        self._out: list[bytes] = []
        self._stop = False
        self.paused = False  # reads nothing while set (a monitor that is slow to take its frames)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            if self.paused:
                time.sleep(0.01)
            elif self._sock.poll(20):
                try:
                    msg = wire.decode(self._sock.recv())
                except wire.WireError as exc:  # a test's assertion says so, not a dead thread
                    self.got.append((time.monotonic(), f"invalid: {exc}", 0))
                    continue
                kind = "steps" if msg.steps is not None else msg.kind  # a batch: "stepcols" on the wire
                self.got.append((time.monotonic(), kind, len(msg.steps.step) if msg.steps else 0))
                self.frames.append((self.got[-1][0], msg))
                self.delays.setdefault(kind, []).append(time.time() - msg.sent_at)
            while self._out:
                self._sock.send(self._out.pop(0))

    def send_raw(self, frame: bytes) -> None:
        self._out.append(frame)

    def command(self, name: str, flush_s: float | None = None, key: wire.RankKey | None = None) -> None:
        job, rank = (key.job, key.rank) if key is not None else (None, None)
        self._out.append(wire.encode_control(name, job, rank, flush_s))

    def kinds(self, since: float = 0.0) -> list[str]:
        return [k for t, k, _ in self.got if t >= since]

    def records(self) -> int:
        return sum(n for _, _, n in self.got)

    def __enter__(self) -> "RawMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self._sock.close(0)
        self._ctx.term()


@pytest.fixture
def monitor() -> Iterator[RawMonitor]:
    m = RawMonitor()
    yield m
    m.close()


def _attach(monkeypatch: pytest.MonkeyPatch, addr: str, kernels: bool = False) -> Any:
    monkeypatch.setenv("FLOWTOP_ADDR", addr)
    monkeypatch.setenv("FLOWTOP_KERNELS", "1" if kernels else "0")
    monkeypatch.setenv("FLOWTOP_KERNELS_MIN_STEPS", "4")
    assert probe.attach(job="wakeups")
    p = probe._current()
    deadline = time.monotonic() + 10
    while p.publisher.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.publisher.subscribers > 0, "the monitor's subscription never arrived"
    return p


class Loop:
    """A real training loop: a tiny model stepped every ``step_s``."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(16, 16)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.steps = 0

    def step(self) -> None:
        self.model(torch.randn(4, 16)).sum().backward()
        self.opt.step()
        self.opt.zero_grad()
        self.steps += 1

    def run(self, seconds: float, step_s: float = 0.01) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()
            time.sleep(step_s)


def _rounds(p: Any) -> int:
    waker = p.publisher.waker
    assert waker is not None, "the sender has not started its loop"
    return int(waker.waits)


def _wait_until(pred: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(pred())

HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}


def _started(job: str, addr: str, hello: dict[str, Any] | None = None, **kwargs: Any) -> Publisher:
    """A real Publisher of rank 0 of ``job`` to ``addr``, with a hello, its sender running."""
    pub = Publisher(wire.RankKey(job, "h", 1, 0, 0), addr, **kwargs)
    pub.hello_fields = hello or dict(HELLO)
    pub.start()
    return pub



def test_an_idle_probe_wakes_only_for_its_telemetry_and_hello(monkeypatch: pytest.MonkeyPatch,
                                                              monitor: RawMonitor) -> None:
    """Attached, heard, stepping no more (a stall in data loading, a hang): a telemetry sample a
    second and, once the steps stopped saying the rank lives, a hello every 2 s are all that is
    due. The old sender woke ten times a second (30 rounds here)."""
    p = _attach(monkeypatch, monitor.addr)
    try:
        Loop().run(0.3)  # telemetry starts with the first step
        time.sleep(0.5)
        rounds, start = _rounds(p), time.monotonic()
        time.sleep(3.0)
        rounds = _rounds(p) - rounds
        kinds = monitor.kinds(since=start)
        assert rounds <= 10, rounds  # 3 telemetry samples, 1-2 hellos, and their coincidences
        assert kinds.count("telemetry") >= 2 and kinds.count("hello") >= 1, kinds
        # a sample leaves in the round that took it, not a tick later (a hung rank's GPU reading)
        assert max(monitor.delays["telemetry"]) < 0.3, monitor.delays["telemetry"]
        # A malformed command is counted for the next step message; a rank that does not step
        # cannot undo the wake-up that asks for it, so the sender does not look again and again.
        monitor.send_raw(b"\x02not a command")
        assert _wait_until(lambda: p.publisher.control_rejected == 1, 2.0)
        rounds = _rounds(p)
        time.sleep(2.0)
        assert _rounds(p) - rounds <= 7, _rounds(p) - rounds
    finally:
        probe.detach()


@pytest.mark.parametrize("step_s", [0.002, 0.05, 0.12])
def test_a_stepping_probe_wakes_once_a_batch_and_loses_no_step(monkeypatch: pytest.MonkeyPatch, monitor: RawMonitor,
                                                               step_s: float) -> None:
    """The default 0.1 s flush: one round a batch, when it is due (a wait after the last one),
    ten a second for steps faster than the flush; for slower ones a look every flush (LOOK_S),
    which finds the step or sleeps on; and a telemetry sample a second. The old sender took two
    rounds a batch (~20 a second), so did this one's first version for steps of 30-120 ms."""
    p = _attach(monkeypatch, monitor.addr)
    loop = Loop()
    try:
        loop.run(0.5, step_s=step_s)
        rounds, steps, start = _rounds(p), loop.steps, time.monotonic()
        loop.run(3.0, step_s=step_s)
        rounds, steps, elapsed = _rounds(p) - rounds, loop.steps - steps, time.monotonic() - start
        batches = min(10 * elapsed, steps)
        assert rounds <= batches + 3 * elapsed, (rounds, batches, elapsed)
        frames = monitor.kinds(since=start).count("steps")
        assert 0.7 * batches <= frames <= 11 * elapsed, (frames, batches, elapsed)
    finally:
        probe.detach()
    assert _wait_until(lambda: "bye" in monitor.kinds(), 2.0)
    assert monitor.records() == loop.steps  # every step, once


def test_a_paced_probe_wakes_about_once_a_pace(monkeypatch: pytest.MonkeyPatch, monitor: RawMonitor) -> None:
    """The monitor asks for a 1 s pace (it hears too many ranks): the sender then wakes about once
    a second for the batch, its telemetry stretched to every 5 s; it woke ten times a second."""
    p = _attach(monkeypatch, monitor.addr)
    loop = Loop()
    try:
        monitor.command("pace", 1.0)
        assert _wait_until(lambda: p.publisher.current_flush_s() == 1.0)
        loop.run(1.0)
        rounds, start = _rounds(p), time.monotonic()
        loop.run(4.0)
        rounds, elapsed = _rounds(p) - rounds, time.monotonic() - start
        assert rounds <= 3 * elapsed, (rounds, elapsed)
        frames = monitor.kinds(since=start).count("steps")
        assert 2 <= frames <= elapsed + 2, (frames, elapsed)
    finally:
        probe.detach()
    assert _wait_until(lambda: "bye" in monitor.kinds(), 2.0)
    assert monitor.records() == loop.steps


def test_what_cannot_wait_wakes_a_paced_sender_at_once(monkeypatch: pytest.MonkeyPatch, monitor: RawMonitor) -> None:
    """Paced at 2 s: a kernel-window request reaches the probe, and a FLOP count published while
    steps flow (the sender sleeps until their batch is due) and the bye leave, each well within
    the pace."""
    p = _attach(monkeypatch, monitor.addr, kernels=True)
    loop = Loop()
    try:
        monitor.command("pace", 2.0)
        assert _wait_until(lambda: p.publisher.current_flush_s() == 2.0)
        loop.run(0.3)  # the FLOP count of step 2 went with the steps
        time.sleep(2.5)  # a quiet spell: nothing due for seconds but telemetry
        scheduler = p._kernels.scheduler
        refused, sent = scheduler.refused, time.monotonic()
        # taken (a window at the next step) or refused (too soon after the last one): seen either way
        monitor.command("kernels_now", key=p.publisher.key)
        assert _wait_until(lambda: scheduler.requested or scheduler.refused > refused, 2.0)
        assert time.monotonic() - sent < 0.3, time.monotonic() - sent
        loop.run(0.5)  # steps flow again: their batch is due ~2 s after the first
        before = time.monotonic()
        p.publisher.publish_now("flops", {"step": 1, "model_flops": 1.0, "executed_flops": 1.0, "attention": "full",
                                          "dtype": "float32", "peak_source": "test", "uncounted": {}, "tokens": 1})
        loop.run(0.3)
        arrived = [t for t, k, _ in monitor.got if t >= before and k == "flops"]
        assert arrived and arrived[0] - before < 0.25, arrived
    finally:
        before = time.monotonic()
        probe.detach()
    assert _wait_until(lambda: "bye" in monitor.kinds(since=before), 2.0)
    assert time.monotonic() - before < 1.0


def test_steps_slower_than_the_flush_do_not_write_the_wake_up_pipe(monkeypatch: pytest.MonkeyPatch,
                                                                    monitor: RawMonitor) -> None:
    """Steps of 150 ms (slower than the 0.1 s flush): the sender looks at the queue every flush
    instead of having each step's publish() write its pipe (a syscall on the training thread, and
    a woken sender that takes the interpreter lock from it: ~30 µs a step in
    bench/probe_costs.py); each step record still leaves within its flush."""
    writes: list[int] = []
    real = publisher_module.nudge

    def counted(fd: int) -> None:
        writes.append(fd)
        real(fd)

    _attach(monkeypatch, monitor.addr)
    monkeypatch.setattr(publisher_module, "nudge", counted)
    loop = Loop()
    try:
        loop.run(0.5, step_s=0.15)
        writes.clear()
        start = time.monotonic()
        loop.run(2.0, step_s=0.15)
        assert len(writes) <= 1, writes  # one for each step before: 13
        assert _wait_until(lambda: monitor.kinds(since=start).count("steps") >= 10, 2.0)
        assert max(monitor.delays["steps"][-10:]) < 0.25, monitor.delays["steps"][-10:]
    finally:
        probe.detach()


def test_a_look_that_finds_nothing_runs_no_round() -> None:
    """Steps of 0.5 s: the sender looks at the queue every 0.1 s for a step (see the test above),
    and a look that finds nothing sleeps on without a round (a round costs the thread ~0.1 ms of
    CPU more on this VM: bench figures in the README)."""
    with RawMonitor() as monitor:
        pub = _started("looks", monitor.addr)
        try:
            assert _wait_until(lambda: pub.subscribers > 0)
            waker = pub.waker
            assert waker is not None
            step, nxt = 0, time.monotonic()
            rounds = waits = 0
            for i in range(8):
                if i == 2:
                    rounds, waits = pub.rounds, waker.waits
                step += 1
                pub.publish("step", {"step": step, "wall_s": 0.5, "tokens": 1})
                nxt += 0.5
                time.sleep(max(0.0, nxt - time.monotonic()))
            rounds, waits = pub.rounds - rounds, waker.waits - waits
            assert waits >= 20, waits  # it looked (~5 a step)
            assert rounds <= 6 + 3, rounds  # a round a step, a hello or two; ~30 before
            assert _wait_until(lambda: monitor.records() == step, 2.0)
        finally:
            pub.close()


def test_the_first_step_after_a_quiet_spell_leaves_within_its_flush(monkeypatch: pytest.MonkeyPatch,
                                                                    monitor: RawMonitor) -> None:
    """The sender sleeps with nothing to send (no round for a step that may never come); the first
    step's publish() wakes it, so its frame still leaves within the 0.1 s flush, not at the next
    telemetry sample."""
    p = _attach(monkeypatch, monitor.addr)
    loop = Loop()
    try:
        loop.run(0.3)
        time.sleep(1.5)
        for _ in range(5):
            time.sleep(0.6)
            assert _wait_until(lambda: p.publisher.queue.asleep, 2.0)  # quiet again: the sender went back to sleep
            start = time.monotonic()
            loop.step()  # a step ends at the next optimizer step's boundary
            loop.step()
            assert _wait_until(lambda since=start: "steps" in monitor.kinds(since=since), 2.0)
            arrived = min(t for t, k, _ in monitor.got if t >= start and k == "steps")
            assert arrived - start < 0.25, arrived - start
    finally:
        probe.detach()


def test_a_monitor_that_stops_reading_is_tried_less_and_less_often() -> None:
    """At the high-water mark (a monitor whose socket is open but not read: a stuck UI) each try
    encodes a frame again: the tries back off from 50 ms to 1 s instead of 20 a second."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.setsockopt(zmq.RCVHWM, 10)
    addr = f"tcp://127.0.0.1:{free_port()}"
    sock.bind(addr)
    sock.send(b"\x01")
    # ~60 KB a hello: the kernel's buffers fill soon
    pub = _started("stuck", addr, dict(HELLO, argv=["x" * 1000] * 60), max_age_s=60.0)
    try:
        # A socket passes its subscription to a new peer when its owner calls into it: asked for
        # its events (nothing is read), it does.
        assert _wait_until(lambda: sock.getsockopt(zmq.EVENTS) >= 0 and pub.subscribers > 0)
        for _ in range(3000):
            pub.rekey(pub.key, "test")  # a bye and a hello each: frames at once, in numbers
        time.sleep(2.0)  # blocked by now
        waker = pub.waker
        assert waker is not None
        rounds = waker.waits
        time.sleep(3.0)
        assert waker.waits - rounds <= 8, waker.waits - rounds  # 1 s apart by then
    finally:
        pub.close(timeout_s=0.2)
        sock.close(0)
        ctx.term()


def test_a_sender_whose_wake_up_pipe_is_closed_under_it_looks_every_tenth_of_a_second() -> None:
    """A library that closes descriptors it does not own: the poll would find the pipe "ready"
    forever (a spinning thread); the sender drops it, stops writing into it, and looks every
    0.1 s, its steps still leaving."""
    monitor = RawMonitor()
    pub = _started("nopipe", monitor.addr)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        import os

        os.close(pub._nudge_r)
        pub.publish_now("bye", {"reason": "test", "steps": 0, "drops": 0})
        assert _wait_until(lambda: pub.waker is not None and pub.waker.degraded, 2.0)
        assert pub._nudge_w == -1
        rounds = pub.waker.waits
        time.sleep(1.0)
        assert 5 <= pub.waker.waits - rounds <= 13, pub.waker.waits - rounds
        pub.publish("step", {"step": 1, "wall_s": 0.01, "tokens": 1})
        assert _wait_until(lambda: monitor.records() == 1, 2.0)
    finally:
        pub.close(timeout_s=0.5)
        monitor.close()


def test_a_fast_loop_under_a_long_pace_loses_nothing_to_a_small_queue() -> None:
    """Paced at 2 s with a 2,000-entry queue, 3,000 steps in ~1.5 s: the sender takes the queue
    before it could fill (at the rate it sees), though nothing else is due for 2 s."""
    monitor = RawMonitor()
    pub = _started("fast", monitor.addr, queue_size=2000)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        monitor.command("pace", 2.0)
        assert _wait_until(lambda: pub.current_flush_s() == 2.0)
        time.sleep(0.5)
        for step in range(1, 3001):
            pub.publish("step", {"step": step, "wall_s": 0.0005, "tokens": 1})
            time.sleep(0.0005)
        assert pub.drops == 0
        pub.close(timeout_s=3.0)
        assert _wait_until(lambda: monitor.records() == 3000, 5.0), monitor.records()  # the last batch lands
    finally:
        pub.close(timeout_s=3.0)
        monitor.close()


def test_a_lapsing_pace_sends_the_waiting_batch_when_it_lapses(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2 s pace that lapses after 1 s (its monitor went quiet): the batch opened under it is due
    at once then (the probe's own 0.1 s holds), not at the 2 s it was planned for."""
    monkeypatch.setattr(wire, "PACE_TTL_S", 1.0)
    monitor = RawMonitor()
    pub = _started("lapse", monitor.addr)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        monitor.command("pace", 2.0)
        assert _wait_until(lambda: pub.current_flush_s() == 2.0)
        paced_at, lapses = time.monotonic(), pub._pace.until  # the pace's deadline, on this clock
        step = 0
        while time.monotonic() < lapses + 0.5:  # steps go on through the lapse
            step += 1
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 1})
            time.sleep(0.01)
        assert lapses - paced_at < 1.5
        # the first step leaves at once (none sent for a flush); the batch after it waits for
        # the 2 s pace, until the pace lapses
        batches = [t for t, k, _ in monitor.got if k == "steps" and t > paced_at + 0.2]
        assert batches and abs(batches[0] - lapses) < 0.3, (batches[:3], lapses)
    finally:
        pub.close(timeout_s=0.5)
        monitor.close()


def test_no_hello_follows_a_bye() -> None:
    """A rank that said bye (detach; the process lingers) sends no heartbeat after it: its hello
    would make the monitor hear it again, its last contact moving on after the bye."""
    monitor = RawMonitor()
    pub = _started("bye", monitor.addr)
    try:
        assert _wait_until(lambda: "hello" in monitor.kinds())
        pub.publish_now("bye", {"reason": "test", "steps": 0, "drops": 0})
        assert _wait_until(lambda: "bye" in monitor.kinds(), 2.0)
        time.sleep(2.5)  # a hello is due every 2 s while no step says the rank lives
        kinds = monitor.kinds()
        assert kinds[kinds.index("bye") + 1:] == [], kinds
    finally:
        pub.close(timeout_s=0.5)
        monitor.close()


class SteppedTime:
    """The ``time`` module as the probe's sender modules see it, its wall clock stepped by
    ``step_s`` (NTP stepping the clock, an admin's ``date -s``): the one clock a test cannot step
    for real. Their monotonic clock, the monitor's clock and the test's own are the real ones."""

    def __init__(self) -> None:
        self.step_s = 0.0

    def time(self) -> float:
        return time.time() + self.step_s

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def wall(monkeypatch: pytest.MonkeyPatch) -> SteppedTime:
    """Patched by name where the sender reads the wall clock, publish()'s stamp included (the
    ``time`` module itself stays real: the test's timings, the monitor's thread, pytest's)."""
    fake = SteppedTime()
    for module in (publisher_module, sender_module, outbox_module, rounds_module):
        monkeypatch.setattr(module, "time", fake)
    monkeypatch.setattr(publisher_module, "_clock", fake.time)
    return fake


class Stepper:
    """Step records published to ``pub``, each remembered with when (the real monotonic clock,
    and the wall clock as the probe reads it)."""

    def __init__(self, pub: Publisher, wall: SteppedTime) -> None:
        self.pub, self.wall = pub, wall
        self.published: dict[int, tuple[float, float]] = {}  # step -> (monotonic, probe's wall)

    def step(self) -> None:
        n = len(self.published) + 1
        self.published[n] = (time.monotonic(), self.wall.time())
        self.pub.publish("step", {"step": n, "wall_s": 0.01, "tokens": 1})

    def run(self, seconds: float, step_s: float = 0.02) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.step()
            time.sleep(step_s)

    def arrivals(self, monitor: RawMonitor) -> dict[int, tuple[float, float]]:
        """step -> (arrival, its frame's timestamp)."""
        return {int(n): (at, msg.sent_at) for at, msg in list(monitor.frames) if msg.steps for n in msg.steps.step}

    def delays(self, monitor: RawMonitor, since: float = 0.0) -> list[float]:
        """Seconds from publish() to arrival of each record published after ``since``."""
        got = self.arrivals(monitor)
        return [got[n][0] - at for n, (at, _) in self.published.items() if at >= since and n in got]

    def all_arrived(self, monitor: RawMonitor) -> bool:
        return len(self.arrivals(monitor)) == len(self.published)


def test_a_wall_clock_stepped_back_holds_back_neither_jobs_nor_steps_nor_hellos(wall: SteppedTime,
                                                                               monitor: RawMonitor) -> None:
    """The wall clock steps a minute back: the sender's periodic job keeps its interval, step
    records still leave within their flush, and the hello is still due once steps stop. On the
    wall clock every timer of the sender was a minute in the future: telemetry and hellos stopped
    for a minute, and the monitor saw the rank go stale."""
    ticks: list[float] = []
    pub = _started("back", monitor.addr)
    pub.add_tick(0.2, lambda: ticks.append(time.monotonic()))
    steps = Stepper(pub, wall)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        steps.run(0.6)
        wall.step_s, stepped = -60.0, time.monotonic()
        steps.run(2.0)
        after = [t for t in ticks if t >= stepped]
        gaps = [b - a for a, b in zip([stepped] + after, after + [time.monotonic()])]
        assert len(after) >= 7 and max(gaps) < 0.5, (len(after), gaps)
        assert _wait_until(lambda: steps.all_arrived(monitor), 2.0), (len(steps.published),
                                                                        len(steps.arrivals(monitor)))
        delays = steps.delays(monitor, since=stepped)
        assert max(delays) < 0.3, max(delays)
        quiet = time.monotonic()  # steps stop: the hello says the rank lives STEPS_ALIVE_S later
        assert _wait_until(lambda: "hello" in monitor.kinds(since=quiet), STEPS_ALIVE_S + 1.0), monitor.kinds(quiet)
    finally:
        pub.close(timeout_s=0.5)


def test_a_wall_clock_stepped_forward_expires_nothing_that_waits(wall: SteppedTime, monitor: RawMonitor) -> None:
    """The wall clock steps a minute forward while a step record waits for its batch (a 1 s
    flush): it leaves when its batch is due, none dropped, and so do the steps after it. On the
    wall clock it looked a minute old, past max_age_s (2 s), and was dropped."""
    pub = _started("forward", monitor.addr, flush_s=1.0)
    steps = Stepper(pub, wall)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        steps.run(1.5)
        steps.step()  # taken by the sender after the step: it sleeps until its batch is due
        wall.step_s = 60.0
        steps.run(2.0)
        assert _wait_until(lambda: steps.all_arrived(monitor), 3.0), (len(steps.published),
                                                                        len(steps.arrivals(monitor)), pub.drops)
        assert pub.drops == 0, pub.drops
        delays = steps.delays(monitor)
        assert max(delays) < 1.0 + 0.3, max(delays)
    finally:
        pub.close(timeout_s=0.5)


@pytest.mark.parametrize("step_s", [-60.0, 60.0])
def test_frames_carry_the_wall_time_of_their_publication_across_a_step(wall: SteppedTime, monitor: RawMonitor,
                                                                      step_s: float) -> None:
    """A frame's timestamp is the wall time at which the training thread published its first
    record (the monitor aligns ranks by it): a batch opened before the wall clock steps and sent
    after it carries the wall time from before the step, the next ones the time after it, and
    each leaves within its flush. On the wall clock that batch was held a minute (stepped back)
    or dropped as a minute old (stepped forward)."""
    pub = _started("stamps", monitor.addr, flush_s=0.5)
    steps = Stepper(pub, wall)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        steps.run(0.7)
        steps.step()
        before = len(steps.published)  # the last record published before the step
        wall.step_s = step_s
        steps.run(1.0)
        assert _wait_until(lambda: steps.all_arrived(monitor), 2.0), (len(steps.published),
                                                                        len(steps.arrivals(monitor)))
        frames = [msg.steps for _, msg in monitor.frames if msg.steps]
        stamps = [(msg.sent_at, steps.published[int(msg.steps.step[0])][1]) for _, msg in monitor.frames if msg.steps]
        assert all(abs(sent - published) < 0.01 for sent, published in stamps), stamps
        sent = {int(n): at for at, frame in zip([s for s, _ in stamps], frames) for n in frame.step}
        last = len(steps.published)
        # the batch that held the last record before the step opened before it, the last batch after it
        assert abs(sent[before] - steps.published[before][1]) < 1.0, (sent[before], steps.published[before])
        assert abs(sent[last] - steps.published[last][1]) < 1.0, (sent[last], steps.published[last])
        delays = steps.delays(monitor)
        assert max(delays) < 0.5 + 0.3, max(delays)
    finally:
        pub.close(timeout_s=0.5)


FLOPS = {"step": 3, "model_flops": 1.0e9, "executed_flops": 1.0e9, "attention": "full", "dtype": "float32",
         "peak_source": "test", "uncounted": {}, "tokens": 64}


def test_a_new_rank_key_sends_the_flop_count_in_force_after_its_hello(monitor: RawMonitor) -> None:
    """A rank that learns its real identity (its process group) goes on as a new key: the count
    it published under the old one still holds, and the new key gets it right after its hello,
    not at the next re-count (up to 500 steps later)."""
    pub = _started("rekey", monitor.addr)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        pub.publish_now("flops", dict(FLOPS))
        assert _wait_until(lambda: "flops" in monitor.kinds())
        new = wire.RankKey("rekey", "h", 1, 5, 0)
        pub.rekey(new, "re-identified")
        assert _wait_until(lambda: any(m.kind == "flops" and m.key == new for _, m in monitor.frames), 2.0)
        after = [m.kind for _, m in monitor.frames if m.key == new]
        assert after[:2] == ["hello", "flops"], after
        assert [m.fields["model_flops"] for _, m in monitor.frames if m.kind == "flops"] == [1.0e9, 1.0e9]
    finally:
        pub.close()


def _paced_steps(pub: Publisher, step_s: float, seconds: float) -> int:
    """Step records published to ``pub`` every ``step_s`` for ``seconds``; how many."""
    n, nxt, end = 0, time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
        pub.publish("step", {"step": n, "wall_s": step_s, "tokens": 1})
        nxt += step_s
        time.sleep(max(0.0, nxt - time.monotonic()))
    return n


def test_a_tiny_flush_does_not_make_the_looks_a_spin(monitor: RawMonitor) -> None:
    """FLOWTOP_FLUSH_S=0.002 (a user who wants every step at once) and 50 ms steps: the sender
    looked every 2 ms for a second after each step (~1,500 waits in 3 s, a review's script); under
    LOOK_MIN_S a step's publish() wakes it instead, as before the looks."""
    pub = _started("tiny", monitor.addr, flush_s=0.002)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        waker = pub.waker
        assert waker is not None
        waits = waker.waits
        steps = _paced_steps(pub, 0.05, 2.0)
        waits = waker.waits - waits
        assert waits <= 3 * steps + 10, (waits, steps)
        assert _wait_until(lambda: monitor.records() == steps, 2.0)
    finally:
        pub.close()


def test_steps_slower_than_a_second_take_no_looks(monitor: RawMonitor) -> None:
    """Steps of 1.2 s: each one's publish() wakes the sender (one write in 1.2 s), and no looks
    follow it for the next second (there were ~10 a step)."""
    pub = _started("slow", monitor.addr)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        waker = pub.waker
        assert waker is not None
        _paced_steps(pub, 1.2, 1.3)  # two steps: the gap is known
        waits = waker.waits
        steps = _paced_steps(pub, 1.2, 3.5)
        waits = waker.waits - waits
        assert waits <= 4 * steps, (waits, steps)
    finally:
        pub.close()


def test_no_flop_count_follows_a_bye_nor_goes_twice() -> None:
    """A count and a bye queued before any monitor listens, then one appears: it gets the hello,
    the count once and the bye, in that order (the count re-sent for a monitor that appears went
    after everything pending: after the bye, and twice)."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    pub = _started("nobye", addr)
    try:
        pub.publish_now("flops", dict(FLOPS))
        pub.publish_now("bye", {"reason": "exit", "steps": 0, "drops": 0})
        time.sleep(0.3)  # taken by the sender, pending: nobody listens
        with RawMonitor(addr) as monitor:
            assert _wait_until(lambda: "bye" in monitor.kinds(), 3.0)
            time.sleep(0.3)
            assert monitor.kinds() == ["hello", "flops", "bye"], monitor.kinds()
    finally:
        pub.close()


def test_a_sender_that_said_bye_does_not_spin(monitor: RawMonitor) -> None:
    """After its bye (a monitor listening) the hello is never due again: its due time, left in
    the past, made every wait the shortest (~300 waits a second)."""
    pub = _started("byespin", monitor.addr)
    try:
        assert _wait_until(lambda: pub.subscribers > 0)
        pub.publish_now("bye", {"reason": "exit", "steps": 0, "drops": 0})
        assert _wait_until(lambda: "bye" in monitor.kinds())
        time.sleep(HELLO_S)  # the hello's due time passes
        waker = pub.waker
        assert waker is not None
        waits = waker.waits
        time.sleep(1.0)
        assert waker.waits - waits <= 5, waker.waits - waits
    finally:
        pub.close()


def test_a_record_stamped_before_the_clock_stepped_back_still_expires(wall: SteppedTime) -> None:
    """A record stamped a minute ahead of the wall clock the sender reads when it takes it (the
    clock stepped back a minute in between): it is placed no later than the round that took it,
    so with nobody listening it expires after max_age_s like any other. Placed a minute ahead, it
    waited a minute, and a monitor that appeared meanwhile got it a minute old."""
    pub = _started("future", f"tcp://127.0.0.1:{free_port()}")  # nobody listens
    try:
        time.sleep(0.3)
        wall.step_s = 60.0
        pub.publish("step", {"step": 1, "wall_s": 0.01, "tokens": 1})
        wall.step_s = 0.0  # back a minute, before the sender's round takes the record
        assert _wait_until(lambda: pub.drops == 1, pub.max_age_s + 2.5), pub.drops
    finally:
        pub.close(timeout_s=0.5)
