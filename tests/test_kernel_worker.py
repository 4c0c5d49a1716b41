"""Kernel windows are built off the collector's event loop (flowtop.kernel_worker).

The windows are the real ones the probe sent from an H200 (tests/data/h200-gpt-large.rec.gz):
4,672 records each, ≈50 ms to build on one core — the reason they leave the loop.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from flowtop.kernel_worker import KernelWorker
from flowtop.recording import read_recording
from flowtop.wiring import apply_kernel_stats, build_kernel_stats, make_model
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


def _rank(model: Any) -> Any:
    (st,) = model.ranks.values()
    return st


def test_windows_are_built_on_a_worker_thread_and_applied_on_the_loop() -> None:
    before, windows = _messages()
    threads: dict[str, int] = {}

    def build(fields: dict[str, Any]) -> Any:
        threads["build"] = threading.get_ident()
        return build_kernel_stats(fields)

    async def main() -> Any:
        model = make_model()
        worker = KernelWorker(model, build)
        applied: list[int] = []

        def apply(st: Any, stats: Any) -> None:
            applied.append(threading.get_ident())
            apply_kernel_stats(st, stats)

        model.offload_kernels(worker.submit, apply)
        for msg in before:
            model.ingest(msg, 0.0)
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


def test_the_newest_window_of_a_rank_wins() -> None:
    before, (first, second) = _messages()
    built: list[int] = []

    def build(fields: dict[str, Any]) -> Any:
        built.append(fields["window"])
        return build_kernel_stats(fields)

    async def main() -> Any:
        model = make_model()
        worker = KernelWorker(model, build)
        model.offload_kernels(worker.submit, apply_kernel_stats)
        for msg in before:
            model.ingest(msg, 0.0)
        model.ingest(first, 1.0)
        model.ingest(second, 1.1)  # arrives before the drain task first runs: replaces the first
        await worker.idle()
        # an older window built late must not overwrite a newer one already shown
        model.apply_kernels(first.key, build_kernel_stats(first.fields))
        worker.close()
        return model, worker

    model, worker = asyncio.run(main())
    assert built == [second.fields["window"]] and worker.replaced == 1 and worker.built == 1
    assert _rank(model).kernels.window == second.fields["window"]


def test_a_window_that_fails_to_build_is_a_rejection_and_the_next_still_builds() -> None:
    before, (first, second) = _messages()

    def build(fields: dict[str, Any]) -> Any:
        if fields["window"] == first.fields["window"]:
            raise ValueError("bad window")
        return build_kernel_stats(fields)

    async def main() -> Any:
        model = make_model()
        worker = KernelWorker(model, build)
        model.offload_kernels(worker.submit, apply_kernel_stats)
        for msg in before:
            model.ingest(msg, 0.0)
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
        model = make_model()
        worker = KernelWorker(model, build_kernel_stats)
        model.offload_kernels(worker.submit, apply_kernel_stats)
        for msg in before:
            model.ingest(msg, 0.0)
        model.ingest(first, 1.0)
        model.ranks.clear()  # evicted while the window was being built
        await worker.idle()
        worker.close()
        return model, worker

    model, worker = asyncio.run(main())
    assert model.ranks == {} and worker.built == 1


def test_a_live_collector_builds_windows_off_its_loop() -> None:
    """The real collector wires the worker in at start and takes it out at stop (a replay into
    the same model afterwards builds inline again)."""
    from monitor_thread import MonitorThread

    m = MonitorThread()
    try:
        assert m.call(lambda: m.collector.model.kernel_offload is not None)
        assert m.collector.kernel_worker is not None
    finally:
        m.close()
    assert m.collector.model.kernel_offload is None and m.collector.kernel_worker is None
