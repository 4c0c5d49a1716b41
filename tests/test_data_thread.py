"""The monitor's data side on its own thread (issue 15 part 1): real sockets, real publishers.

* the UI thread never touches a zmq socket nor calls into the collector: every socket is created
  and used on the data thread (recorded by instrumenting pyzmq's socket classes);
* snapshots reach the UI latest-wins: a UI that is busy gets the newest one, older ones are
  dropped, and the messages that wake it do not pile up;
* monitor-side errors (a port that cannot be bound, a recording that stops on a full disk, a hint
  rule that raises, a listener that cannot accept connections) become notifications.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import zmq
import zmq._future
import zmq.asyncio
from conftest import pilot_until
from synthetic.replay import ReplaySource, synthetic_snapshot

from flowtop.monitor.collector import Collector
from flowtop.monitor.datathread import DataThread, Mailbox
from flowtop.monitor.hints.engine import MEASURES, HintEngine
from flowtop.monitor.model import Model
from flowtop.monitor.recording import Recorder
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.wiring import make_model
from flowtop.tools.demo.launch import free_port_pair
from flowtop.tui.app import FlowtopApp
from probe.transport.publisher import Publisher
from probe.wire import RankKey

SIZE = (80, 24)
ROOT = Path(__file__).resolve().parent.parent
#: Socket methods whose calling thread is recorded (creation, options, traffic, teardown).
SOCKET_OPS = ("__init__", "bind", "connect", "setsockopt", "send", "recv", "send_multipart",
              "recv_multipart", "poll", "close", "get_monitor_socket")


def _instrument(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, int]]:
    """Record (thread ident, op, id(socket)) of every pyzmq socket operation in this process."""
    ops: list[tuple[int, str, int]] = []
    for cls in (zmq.Socket, zmq._future._AsyncSocket):
        for name in SOCKET_OPS:
            if cls is not zmq.Socket and name not in cls.__dict__:
                continue  # inherited from zmq.Socket: recorded there
            original = getattr(cls, name)

            def wrapper(self: Any, *a: Any, __original: Callable[..., Any] = original, __name: str = name,
                        **kw: Any) -> Any:
                ops.append((threading.get_ident(), __name, id(self)))
                return __original(self, *a, **kw)

            monkeypatch.setattr(cls, name, wrapper)
    return ops


def _publisher(addr: str, rank: int, job: str = "threads") -> Publisher:
    pub = Publisher(RankKey(job, "node-a", 5000 + rank, rank, 0), addr)
    pub.hello_fields = {"local_rank": rank, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    return pub


@pytest.mark.asyncio
async def test_the_ui_thread_never_touches_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    ops = _instrument(monkeypatch)
    calls: list[tuple[int, str]] = []  # the threads that call into the collector
    for name in ("snapshot", "request_kernels", "handle_frame", "catch_up", "start", "stop"):
        original = getattr(Collector, name)

        def spy(self: Any, *a: Any, __original: Callable[..., Any] = original, __name: str = name, **kw: Any) -> Any:
            calls.append((threading.get_ident(), __name))
            return __original(self, *a, **kw)

        monkeypatch.setattr(Collector, name, spy)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    collector = Collector(make_model(), listen)
    app = FlowtopApp(collector, refresh_s=0.2)
    ui = threading.get_ident()
    pub = _publisher(listen, 0)
    try:
        async with app.run_test(size=SIZE) as pilot:
            step = 0

            def shown() -> bool:
                nonlocal step
                step += 1
                pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 64, "drops": 0})
                snap = app.latest
                return snap is not None and bool(snap.jobs) and snap.jobs[0].ranks[0].step > 3

            assert await pilot_until(pilot, shown), "the rank never reached the UI"
            await pilot.press("k")  # a command: sent upstream on the collector's socket
            app.data.flush()
            await pilot.press("q")
    finally:
        pub.close()
    data = app.data.ident
    assert data is not None and data != ui
    assert not [o for o in ops if o[0] == ui], "the UI thread called a zmq socket"
    assert not [c for c in calls if c[0] == ui], "the UI thread called into the collector"
    created = {sid: t for t, op, sid in ops if op == "__init__"}
    for sock in (collector._sub, collector._events_async):
        assert created[id(sock)] == data  # the collector's sockets were made on the data thread
    assert (data, "request_kernels") in calls and (data, "handle_frame") in calls
    sends = [o for o in ops if o[1] == "send" and o[0] == data]
    assert len(sends) >= 2  # the subscription, then the kernels_now command


class _Counting(ReplaySource):
    """A source whose every snapshot is new (taken_at counts up), slow to render on purpose."""

    def __init__(self) -> None:
        super().__init__([synthetic_snapshot()], advance=False)
        self.served = 0
        self.threads: set[int] = set()

    def snapshot(self) -> MonitorSnapshot:
        import dataclasses

        self.served += 1
        self.threads.add(threading.get_ident())
        return dataclasses.replace(super().snapshot(), taken_at=float(self.served))


@pytest.mark.asyncio
async def test_a_busy_ui_gets_the_newest_snapshot_and_older_ones_are_dropped() -> None:
    source = _Counting()
    app = FlowtopApp(source, refresh_s=0)
    wakes: list[int] = []
    wake = app.data._wake
    app.data._wake = lambda: (wakes.append(1), wake())  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        delivered, dropped, woken = app.delivered, app.data.mailbox.dropped, len(wakes)
        # 50 snapshots while the UI thread is busy (here: waiting for them) and renders nothing.
        futures = [app.data.refresh() for _ in range(50)]
        made = [f.result(10) for f in futures]
        await pilot.pause()
        await pilot.pause()
        assert len({id(s) for s in made}) == 50
        assert app.delivered - delivered == 1  # rendered once ...
        assert app.latest is made[-1]  # ... the newest one
        assert app.data.mailbox.dropped - dropped == 49  # the others were dropped, not queued
        assert len(wakes) - woken == 1  # and one wake-up message waited in the UI's queue, not 50
        await pilot.press("q")
    assert source.threads == {app.data.ident}  # the source was only ever called on the data thread


def test_mailbox_latest_wins_and_wakes_once() -> None:
    box = Mailbox()
    a, b = synthetic_snapshot(120), synthetic_snapshot(121)
    assert box.put(a) is True  # empty -> full: wake the UI
    assert box.put(b) is False  # already full: no second wake-up
    got = box.take()
    assert got.snapshot is b and box.dropped == 1 and box.taken == 1
    assert box.take().snapshot is None
    assert box.put(None) is False  # nothing to hand over


def test_data_thread_commands_run_on_it_and_their_errors_come_back_as_notices() -> None:
    source = ReplaySource([synthetic_snapshot()])
    data = DataThread(source, cadence_s=0)
    data.start().result(10)
    try:
        seen: list[int] = []
        data.call(lambda: seen.append(threading.get_ident())).result(5)
        assert seen == [data.ident]

        def boom() -> None:
            raise RuntimeError("no such rank")

        with pytest.raises(RuntimeError):
            data.call(boom).result(5)
        (notice,) = data.mailbox.take().notices
        assert notice.severity == "error" and notice.text == "boom failed: RuntimeError: no such rank"
    finally:
        data.stop()
    assert source.stopped and not data._thread.is_alive()


def _notes(app: FlowtopApp) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.mark.asyncio
async def test_a_port_that_cannot_be_bound_is_a_notification() -> None:
    port = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        app = FlowtopApp(Collector(make_model(), f"tcp://127.0.0.1:{port}"), refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert any("cannot bind" in n and "source failed to start" in n for n in _notes(app))
            await pilot.press("q")


@pytest.mark.asyncio
async def test_a_failed_bind_is_the_header_and_no_rec_shows(tmp_path: Path) -> None:
    """The header said "waiting for ranks on …" (the address cut off, the error on a line cut at
    100 columns) and the footer REC though the recording never started."""
    from flowtop.tui.widgets.job_header import JobHeader
    from flowtop.tui.widgets.status_footer import recording_state

    port = free_port_pair()
    listen = f"tcp://127.0.0.1:{port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        collector = Collector(make_model(), listen, recorder=Recorder(tmp_path / "x.rec"))
        app = FlowtopApp(collector, refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.pause()
            header = str(app.screen.query_one(JobHeader).render()).splitlines()
            assert header[0] == f"flowtop cannot bind {listen}: Address already in use", header
            assert len(header[0]) <= SIZE[0] - 2 and header[1].startswith("(is another flowtop running?")
            assert recording_state(collector).plain == ""
            assert not app.screen.query_one("#monitor-status").display  # no REC on screen either
            await pilot.press("q")
    assert not (tmp_path / "x.rec").exists()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.asyncio
async def test_a_full_disk_and_a_raising_hint_rule_are_notifications(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(rule: Any, job: Any, now: float) -> Any:
        raise ZeroDivisionError("in the input_wait measure")

    engine = HintEngine(measures={**MEASURES, "input_wait": broken})
    model = Model(hint_engine=engine)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    app = FlowtopApp(Collector(model, listen, recorder=Recorder("/dev/full")), refresh_s=0.1)
    pub = _publisher(listen, 0, job="errors")
    try:
        async with app.run_test(size=SIZE) as pilot:
            step = 0

            def both() -> bool:
                nonlocal step
                for _ in range(20):  # > the file buffer within a second: the flush hits ENOSPC
                    step += 1
                    pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 64, "drops": 0})
                notes = _notes(app)
                return any("recording to /dev/full stopped" in n for n in notes) and any(
                    "hint rule input_wait raised ZeroDivisionError" in n for n in notes)

            assert await pilot_until(pilot, both), _notes(app)
            assert app.latest is not None and app.latest.jobs[0].ranks[0].step > 0  # monitoring goes on
            await pilot.press("q")
    finally:
        pub.close()
    assert "recording to /dev/full" not in capsys.readouterr().err  # the TUI owns stderr


def test_a_listener_that_cannot_accept_is_reported(tmp_path: Path) -> None:
    """At the open-file limit a probe's connection cannot be accepted: the monitor says so (here
    headless, on stderr) instead of losing ranks silently."""
    port = free_port_pair()

    def low_limit() -> None:  # soft and hard: the monitor raises its soft limit to the hard one
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--timeout", "4",
                             "--listen", f"tcp://127.0.0.1:{port}"], cwd=ROOT, preexec_fn=low_limit,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    conns: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 15
        while len(conns) < 60 and time.monotonic() < deadline and proc.poll() is None:
            try:
                conns.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        for c in conns:
            c.close()
    assert proc.returncode == 0, err
    assert "cannot accept probe connections on" in err and "open files in use (Too many open files)" in err
    assert err.count("cannot accept probe connections") == 1  # told once, not once per attempt
