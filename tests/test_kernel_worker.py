"""Kernel windows are built off the collector's event loop (flowtop.monitor.kernel_worker).

The windows are the real ones the probe sent from an H200 (tests/data/h200-gpt-large.rec.gz):
4,672 records each, ≈50 ms to build on one core — the reason they leave the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from flowtop.monitor.kernel_worker import KernelWorker
from flowtop.monitor.recording import read_recording, replay_all
from flowtop.monitor.rankkernels import build_window
from flowtop.monitor.wiring import make_model
from probe import wire

DATA = Path(__file__).parent / "data"


def _messages() -> tuple[list[wire.Message], list[wire.Message]]:
    """(the messages before the first kernel window, the kernel windows)."""
    before: list[wire.Message] = []
    windows: list[wire.Message] = []
    for _, frame in read_recording(DATA / "h200-gpt-large.rec.gz"):
        msg = wire.decode(frame)
        if msg.kind == "kernels":
            windows.append(msg)
        elif not windows:
            before.append(msg)
    assert len(windows) == 2
    return before, windows


def _offloaded(build: Any, before: list[wire.Message], processes: bool = False) -> tuple[Any, KernelWorker]:
    """A monitor model whose kernel windows go to a worker with ``build`` (in a process with
    ``processes``), fed ``before`` (call on a running loop)."""
    model = make_model()
    worker = KernelWorker(model, build, processes=processes)
    model.offload_kernels(worker.submit)
    for msg in before:
        model.ingest(msg, 0.0)
    return model, worker


def _built(build: Any, before: list[wire.Message], timed: list[tuple[wire.Message, float]],
           processes: bool = False) -> tuple[Any, KernelWorker]:
    """The model and worker of :func:`_offloaded` after ``timed`` (message, time) were ingested
    and every window built; the worker closed."""

    async def main() -> tuple[Any, KernelWorker]:
        model, worker = _offloaded(build, before, processes=processes)
        for msg, at in timed:
            model.ingest(msg, at)
        await worker.idle()
        worker.close()
        return model, worker

    return asyncio.run(main())


@contextlib.contextmanager
def _recording_sent(timeout: float) -> Iterator[Any]:
    """A real collector (MonitorThread) fed the H200 recording's frames over a real socket, once
    a rank's kernel table is built (``timeout`` seconds at most); closed after."""
    import time

    import zmq

    from monitor_thread import MonitorThread

    frames = [f for _, f in read_recording(DATA / "h200-gpt-large.rec.gz")]
    m = MonitorThread()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        pub.connect(m.listen)
        time.sleep(0.5)  # the subscription reaches the publisher (a late joiner loses frames)
        for frame in frames:
            pub.send(frame)
        m.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].kernels is not None, timeout)
        yield m
    finally:
        pub.close()
        ctx.term()
        m.close()


def _rank(model: Any) -> Any:
    (st,) = model.ranks.values()
    return st


def test_windows_are_built_on_a_worker_thread_and_applied_on_the_loop() -> None:
    before, windows = _messages()
    threads: dict[str, int] = {}

    def build(fields: dict[str, Any]) -> Any:
        threads["build"] = threading.get_ident()
        return build_window(fields)

    async def main() -> Any:
        applied: list[int] = []

        model, worker = _offloaded(build, before)
        apply_kernels = model.apply_kernels

        def apply(key: Any, stats: Any) -> None:
            applied.append(threading.get_ident())
            apply_kernels(key, stats)

        model.apply_kernels = apply  # type: ignore[method-assign]
        model.ingest(windows[0], 1.0)
        assert _rank(model).kernels is None  # queued, not built on the loop
        await worker.idle()
        worker.close()
        return model, applied, threading.get_ident()

    model, applied, loop_thread = asyncio.run(main())
    stats = _rank(model).kernels
    assert stats is not None and stats.anatomy.step_basis == "device" and stats.anatomy.launches == 1259
    assert threads["build"] != loop_thread and applied == [loop_thread]
    assert _rank(model).kernels_cumulative.windows == 1


def test_every_window_is_built_in_order_into_the_cumulative_table() -> None:
    """Two windows of a rank queued before the first is built: both are built, in order, so the
    cumulative table holds what a replay of the same frames holds."""
    before, (first, second) = _messages()
    built: list[int] = []

    def build(fields: dict[str, Any]) -> Any:
        built.append(fields["window"])
        return build_window(fields)

    model, worker = _built(build, before, [(first, 1.0), (second, 1.1)])  # the second before the drain task runs
    assert built == [first.fields["window"], second.fields["window"]] and worker.built == 2
    st = _rank(model)
    assert st.kernels.window == second.fields["window"] and st.kernels_cumulative.windows == 2
    replayed = replay_all(DATA / "h200-gpt-large.rec.gz", make_model()).jobs[0].ranks[0]
    assert st.kernels_cumulative.rows() == replayed.kernels_cumulative


def test_a_flood_drops_the_oldest_windows_and_counts_them(monkeypatch: Any) -> None:
    before, (first, second) = _messages()
    monkeypatch.setattr("flowtop.monitor.kernel_worker.MAX_PENDING", 1)

    async def main() -> Any:
        model, worker = _offloaded(build_window, before)
        model.ingest(first, 1.0)
        model.ingest(second, 1.1)  # the queue holds one: the first is dropped
        await worker.idle()
        model.ingest(first, 2.0)
        worker.close()  # queued, never built: dropped too
        await worker.idle()  # returns at once after close
        worker.submit(first.key, dict(first.fields))  # after close: dropped, nothing scheduled
        return model, worker

    model, worker = asyncio.run(main())
    assert (worker.built, worker.dropped) == (1, 3)
    assert _rank(model).kernels.window == second.fields["window"]


def test_a_window_that_fails_to_build_is_a_rejection_and_the_next_still_builds() -> None:
    before, (first, second) = _messages()

    def build(fields: dict[str, Any]) -> Any:
        if fields["window"] == first.fields["window"]:
            raise ValueError("bad window")
        return build_window(fields)

    async def main() -> Any:
        model, worker = _offloaded(build, before)
        model.ingest(first, 1.0)
        await worker.idle()
        model.ingest(second, 2.0)
        await worker.idle()
        worker.close()
        return model

    model = asyncio.run(main())
    assert model.rejected == 1 and "kernels: ValueError: bad window" in next(iter(model.rejected_reasons))
    assert _rank(model).kernels.window == second.fields["window"]


def test_a_window_for_a_rank_gone_meanwhile_is_dropped() -> None:
    before, (first, _) = _messages()

    async def main() -> Any:
        model, worker = _offloaded(build_window, before)
        model.ingest(first, 1.0)
        model.ranks.clear()  # evicted while the window was being built
        await worker.idle()
        worker.close()
        return model, worker

    model, worker = asyncio.run(main())
    assert model.ranks == {} and worker.built == 1


def test_a_live_collector_builds_windows_off_its_loop() -> None:
    """Real frames from the H200 recording over a real socket into a real collector: the window
    is built by its worker; at stop the model goes back to building inline."""
    with _recording_sent(20) as m:
        assert m.call(lambda: m.collector.model.kernels.submit is not None)
        snap = m.snapshot()
        assert snap.jobs[0].ranks[0].kernels.anatomy.step_basis == "device"
        assert m.collector.kernel_worker is not None and m.collector.kernel_worker.built >= 1
    assert m.collector.model.kernels.submit is None and m.collector.kernel_worker is None


def test_a_flood_never_takes_all_of_one_ranks_windows(monkeypatch: Any) -> None:
    """256+ ranks send windows at the same step: when the queue is full, a rank with another
    window queued gives one up, not the rank whose only window is oldest."""
    before, (first, second) = _messages()
    monkeypatch.setattr("flowtop.monitor.kernel_worker.MAX_PENDING", 2)
    other = first._replace(key=first.key._replace(rank=1))
    built: list[tuple[int, int]] = []

    def build(fields: dict[str, Any]) -> Any:
        return build_window(fields)

    async def main() -> Any:
        model, worker = _offloaded(build, before)

        def apply(key: Any, stats: Any) -> None:
            built.append((key.rank, stats.window))

        model.apply_kernels = apply  # type: ignore[method-assign]
        worker.submit(other.key, dict(other.fields))  # rank 1: its only window, the oldest
        worker.submit(first.key, dict(first.fields))
        worker.submit(second.key, dict(second.fields))  # full: rank 0's older window goes
        await worker.idle()
        worker.close()
        return worker

    worker = asyncio.run(main())
    assert built == [(1, first.fields["window"]), (0, second.fields["window"])] and worker.dropped == 1


# --- a live collector reads a known rank's window envelope first (probe.wire.envelope) -------------


def _frames() -> tuple[list[bytes], list[bytes]]:
    """(the raw frames before the first kernel window, the raw windows)."""
    before: list[bytes] = []
    windows: list[bytes] = []
    for _, frame in read_recording(DATA / "h200-gpt-large.rec.gz"):
        if wire.decode(frame).kind == "kernels":
            windows.append(frame)
        elif not windows:
            before.append(frame)
    return before, windows


def _collecting(model: Any) -> tuple[Any, KernelWorker]:
    """A collector fed by hand (call on a running loop) whose model builds windows on a worker."""
    from flowtop.monitor.collector import Collector

    collector = Collector(model, "tcp://127.0.0.1:1")  # not started: frames handed in
    worker = collector.kernel_worker = KernelWorker(model, build_window)
    model.offload_kernels(worker.submit)
    return collector, worker


def _count_decodes(monkeypatch: Any) -> list[tuple[int, str]]:
    """The (thread, kind) of every frame ``probe.wire.decode`` decodes whole from now on."""
    decoded: list[tuple[int, str]] = []
    real = wire.decode

    def decode(frame: bytes, admit: Any = None) -> wire.Message:
        msg = real(frame, admit)
        decoded.append((threading.get_ident(), msg.kind))
        return msg

    monkeypatch.setattr(wire, "decode", decode)
    return decoded


def test_a_known_ranks_window_is_decoded_by_the_worker_not_on_the_loop(monkeypatch: Any) -> None:
    before, (first, _) = _frames()

    async def main() -> Any:
        model = make_model()
        collector, worker = _collecting(model)
        for frame in before:
            collector.handle_frame(frame, 0.5)
        decoded = _count_decodes(monkeypatch)
        collector.handle_frame(first, 1.0)
        on_loop = list(decoded)
        st = _rank(model)
        heard = (st.last_seq, st.last_recv, model.received)
        await worker.idle()
        worker.close()
        return model, decoded, on_loop, heard, threading.get_ident()

    model, decoded, on_loop, heard, loop = asyncio.run(main())
    assert on_loop == []  # the envelope only, on the loop
    assert [kind for _, kind in decoded] == ["kernels"] and decoded[0][0] != loop
    # The envelope counted at once: its seq, its time, the frame received.
    assert heard == (wire.envelope(first).seq, 1.0, len(before) + 1)
    stats = _rank(model).kernels
    assert stats.anatomy.launches == 1259 and stats.window == wire.decode(first).fields["window"]
    assert model.rejected == 0


def test_a_window_with_bad_fields_behind_a_good_envelope_is_rejected_by_the_worker() -> None:
    import msgpack

    before, (first, second) = _frames()
    body = msgpack.unpackb(first)
    body["ops"] = "not records"
    bad = msgpack.packb(body)
    assert len(bad) >= wire.PEEK_BYTES
    with pytest.raises(wire.WireError) as err:
        wire.decode(bad)

    async def main() -> Any:
        model = make_model()
        collector, worker = _collecting(model)
        for frame in before:
            collector.handle_frame(frame, 0.5)
        collector.handle_frame(bad, 1.0)
        await worker.idle()
        rejected = dict(model.rejected_reasons)
        collector.handle_frame(second, 2.0)
        await worker.idle()
        worker.close()
        return model, rejected

    model, rejected = asyncio.run(main())
    assert rejected == {str(err.value): 1}  # the reason the whole decode gives
    assert _rank(model).kernels.window == wire.decode(second).fields["window"]
    # A replay of the same frames (windows built where they arrive) counts them the same way:
    # the envelope heard, the fields refused.
    from flowtop.monitor.recording import feed

    replayed = make_model()
    for frame in before:
        feed(replayed, frame, 0.5)
    feed(replayed, bad, 1.0)
    assert dict(replayed.rejected_reasons) == rejected
    feed(replayed, second, 2.0)
    counts = [(m.received, m.rejected, _rank(m).last_seq, _rank(m).last_recv) for m in (model, replayed)]
    assert counts[0] == counts[1]
    assert _rank(replayed).kernels == _rank(model).kernels


def test_a_window_over_the_byte_rate_is_refused_from_its_envelope(monkeypatch: Any) -> None:
    """The per-rank byte rate fits one window: the second, at the same instant, is refused, and
    nobody decodes it whole."""
    from flowtop.monitor.limits import Limits

    before, (first, second) = _frames()

    async def main() -> Any:
        model = make_model()
        model.limits = Limits(kernel_burst_rank=len(first), kernel_bytes_per_s_rank=1.0)
        collector, worker = _collecting(model)
        for frame in before:
            collector.handle_frame(frame, 0.5)
        decoded = _count_decodes(monkeypatch)
        collector.handle_frame(first, 1.0)
        collector.handle_frame(second, 1.0)
        await worker.idle()
        worker.close()
        return model, decoded

    model, decoded = asyncio.run(main())
    assert model.rejected_reasons == {"kernel window refused: over the per-rank kernel byte rate": 1}
    assert [kind for _, kind in decoded] == ["kernels"] and _rank(model).kernels_cumulative.windows == 1


def test_an_unknown_ranks_window_is_decoded_whole_before_it_makes_the_rank(monkeypatch: Any) -> None:
    """A window is a rank's first frame: it is decoded, and validated, on the loop like any
    frame that may create a rank (a bad one makes none)."""
    import msgpack

    _, (first, _) = _frames()
    body = msgpack.unpackb(first)
    body["ops"] = "not records"
    bad = msgpack.packb(body)

    async def main() -> Any:
        model = make_model()
        collector, worker = _collecting(model)
        decoded = _count_decodes(monkeypatch)
        collector.handle_frame(bad, 1.0)
        made_by_bad = len(model.ranks)
        collector.handle_frame(first, 2.0)
        await worker.idle()
        worker.close()
        return model, decoded, made_by_bad, threading.get_ident()

    model, decoded, made_by_bad, loop = asyncio.run(main())
    assert made_by_bad == 0 and model.rejected == 1
    assert [t for t, kind in decoded if kind == "kernels"] == [loop]  # the good one, on the loop
    assert _rank(model).kernels.anatomy.launches == 1259


# --- the live collector's builder is a child process ----------------------------------------------


def _kill_builders() -> int:
    """SIGKILL every builder process of this test (multiprocessing's children); how many."""
    import multiprocessing
    import os
    import signal

    children = multiprocessing.active_children()
    for p in children:
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
    return len(children)


def _build_or_die(window: Any) -> Any:
    """A builder whose process exits on a window marked ``_die``, as one killed mid-build."""
    import os

    if window.get("_die"):
        os._exit(3)
    return build_window(window)


def test_a_builder_process_that_dies_is_replaced(monkeypatch: Any) -> None:
    """A builder process that dies is replaced and its window tried once more: a window it dies
    on twice is rejected, one whose builder was killed while idle is built; after MAX_RESTARTS
    deaths windows are no longer built (dropped, counted) and the user is told."""
    import multiprocessing

    monkeypatch.setattr("flowtop.monitor.kernel_worker.MAX_RESTARTS", 4)
    before, (first, second) = _messages()

    async def main() -> Any:
        model, worker = _offloaded(_build_or_die, before, processes=True)
        seen = []

        async def step(window: Any, kill_first: bool = False) -> None:
            killed = _kill_builders() if kill_first else 0
            worker.submit(first.key, window)
            await worker.idle()
            st = _rank(model)
            seen.append((st.kernels.window if st.kernels else None, model.rejected, worker.restarts,
                         worker.dropped, killed))

        await step(dict(first.fields))
        await step({**second.fields, "_die": True})  # dies on it, and again: rejected
        await step(dict(second.fields))  # a new builder process
        await step(dict(first.fields), kill_first=True)  # killed while idle: replaced for this window
        await step(dict(second.fields), kill_first=True)  # the fourth death: no more building
        worker.close()
        return model, worker, seen

    model, worker, seen = asyncio.run(main())
    w1, w2 = first.fields["window"], second.fields["window"]
    assert seen == [
        (w1, 0, 0, 0, 0),
        (w1, 1, 2, 0, 0),
        (w2, 1, 2, 0, 0),
        (w1, 1, 3, 0, 1),  # one builder killed before each of the last two
        (w1, 1, 4, 1, 1),
    ]
    # None runs after the last death (a pool torn down while a process was starting ends it
    # from its own manager thread: a moment later).
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
    assert dict(model.rejected_reasons) == {"kernels: the window builder process died on this window twice": 1}
    assert worker.built == 3 and worker.gave_up
    assert any("no longer built" in n.text and "died 4 times" in n.text for n in model.notices.history)


def test_where_no_builder_process_starts_a_thread_builds(monkeypatch: Any) -> None:
    """A process that cannot be started (here: no descriptors left at the spawn) costs no window:
    it is built on a thread, and the user is told once."""
    import multiprocessing.popen_spawn_posix as popen

    def no_fds(self: Any, process_obj: Any) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(popen.Popen, "_launch", no_fds)
    before, (first, second) = _messages()

    model, worker = _built(build_window, before, [(first, 1.0), (second, 2.0)], processes=True)
    assert (worker.built, worker.processes, model.rejected) == (2, False, 0)
    assert _rank(model).kernels == build_window(second.fields)
    assert [n.text for n in model.notices.history if "own thread" in n.text] == [
        "kernel windows are built on the monitor's own thread: no builder process could be started "
        "(OSError: [Errno 24] Too many open files)"]


def test_the_live_collectors_builder_is_a_child_process() -> None:
    import multiprocessing
    import time

    with _recording_sent(30) as m:
        assert m.collector.kernel_worker is not None and m.collector.kernel_worker.processes
        assert len(multiprocessing.active_children()) == 1
    deadline = time.monotonic() + 10
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []  # the monitor stopped: so did its builder


def test_a_monitor_without_windows_starts_no_builder_process() -> None:
    """The process pool (and multiprocessing's resource tracker with it) waits for a first window."""
    async def main() -> Any:
        model, worker = _offloaded(build_window, _messages()[0], processes=True)
        await asyncio.sleep(0.2)
        started = worker.started
        worker.close()
        return started

    assert asyncio.run(main()) is False


ORPHAN = """
import asyncio, multiprocessing, sys, time
sys.path.insert(0, {tests!r})
from test_kernel_worker import _messages, _offloaded, _rank
from flowtop.monitor.rankkernels import build_window

async def main():
    before, (first, _) = _messages()
    model, worker = _offloaded(build_window, before, processes=True)
    model.ingest(first, 1.0)
    await worker.idle()
    assert _rank(model).kernels is not None
    print(*[p.pid for p in multiprocessing.active_children()], flush=True)
    time.sleep(60)

asyncio.run(main())
"""


def test_the_builder_process_leaves_when_the_monitor_is_killed() -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", ORPHAN.format(tests=str(Path(__file__).parent))],
                            stdout=subprocess.PIPE, text=True)
    try:
        (builder,) = map(int, proc.stdout.readline().split())
        assert psutil.Process(builder).ppid() == proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(builder) and psutil.Process(builder).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the builder outlived its monitor"
        time.sleep(0.1)


def test_a_table_built_in_the_builder_process_shares_its_names_with_the_others() -> None:
    """Tables come back pickled: their kernel names are interned again, so thousands of ranks'
    tables hold one string per name, as when built on a thread."""
    import pickle

    _, (first, _) = _messages()
    built = build_window(first.fields)
    a, b = (pickle.loads(pickle.dumps(built)) for _ in range(2))
    assert a == built
    for x, y in zip(a.kernels, b.kernels):
        assert x.name is y.name and x.short is y.short and x.category is y.category and x.op is y.op
    assert all(x.category is y.category for x, y in zip(a.categories, b.categories))
    assert all(p is q for g, h in zip(a.anatomy.gaps, b.anatomy.gaps) for p, q in zip(g.host_ops, h.host_ops))


UNDER_A_TUI = """
import asyncio, multiprocessing, sys
sys.path.insert(0, {tests!r})
from test_kernel_worker import _messages, _offloaded, _rank
from flowtop.monitor.rankkernels import build_window

class Capture:  # what Textual puts in sys.stderr while its app runs: no file descriptor
    def write(self, text): return len(text)
    def flush(self): pass
    def fileno(self): return -1

async def main():
    before, (first, _) = _messages()
    model, worker = _offloaded(build_window, before, processes=True)
    sys.stderr = Capture()
    model.ingest(first, 1.0)
    await worker.idle()
    builders = len(multiprocessing.active_children())
    worker.close()
    sys.stderr = sys.__stderr__
    print(worker.processes, builders, _rank(model).kernels is not None,
          [n.text for n in model.notices.history], flush=True)

asyncio.run(main())
"""


def test_a_builder_process_starts_under_a_tui_that_captured_stderr() -> None:
    """Under the TUI, sys.stderr has no file descriptor: the first window still gets a builder
    process (a fresh interpreter: multiprocessing's resource tracker not started yet)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", UNDER_A_TUI.format(tests=str(Path(__file__).parent))],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True 1 True []", out.stderr[-2000:]
