"""The monitor's heap trimmer (flowtop.monitor.heaptrim): real glibc, real RSS."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

import pytest

from flowtop import settings
from flowtop.monitor import heaptrim

#: glibc's own malloc, at its default thresholds (another allocator or a lowered mmap threshold
#: would hand the test's blocks back by itself, or never).
needs_glibc = pytest.mark.skipif(
    heaptrim.glibc_trim() is None or not heaptrim.rss_bytes() or bool(os.environ.get("LD_PRELOAD"))
    or any(k.startswith("MALLOC_") for k in os.environ),
    reason="malloc_trim and /proc/self/statm: glibc's malloc on Linux, default thresholds")


@pytest.fixture
def no_process_trimmer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's trimmer (a test that ran a monitor command in-process started it) stopped
    and forgotten while the test runs: its trims would give the test's memory back first."""
    running = heaptrim.current()
    if running is not None:
        running.stop()
    monkeypatch.setattr(heaptrim, "_PROCESS", None)
    yield


def _until(done: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def _freed_inside_the_heap(mb: int) -> list[bytes]:
    """Allocate ``mb`` MB in 60 KB blocks (under glibc's mmap threshold: from its heaps), keep
    every tenth alive and free the rest: the freed memory is not at the top of a heap, so free()
    gives none of it back. Returns the kept blocks (the caller holds them)."""
    blocks = [bytes(60_000) + b"x" for _ in range(mb * 1_000_000 // 60_000)]
    return blocks[::10]


@needs_glibc
def test_a_trim_gives_back_memory_freed_inside_the_heap(no_process_trimmer: None) -> None:
    trimmer = heaptrim.HeapTrimmer(every_s=10.0)
    trimmer.trim_once()  # whatever earlier tests left
    kept = _freed_inside_the_heap(200)
    before = heaptrim.rss_bytes()
    released = trimmer.trim_once()
    after = heaptrim.rss_bytes()
    # ~180 MB was freed; without the trim glibc keeps it resident
    assert before - after > 100 * 2**20, (before, after)
    assert abs(released - (before - after)) < 8 * 2**20  # its own reading of the same
    t = trimmer.trims()
    assert t.count == 2 and t.released_bytes >= released and t.cpu_s >= 0.0
    assert len(kept) > 0


def test_the_thread_trims_every_period_until_stopped() -> None:
    calls: list[float] = []
    trimmer = heaptrim.HeapTrimmer(every_s=0.05, trim=lambda: calls.append(time.monotonic()))
    assert trimmer.start()
    assert not trimmer.start()  # one thread
    assert _until(lambda: len(calls) >= 3)
    trimmer.stop()
    n = len(calls)
    assert trimmer.trims().count == n
    assert all(b - a >= 0.04 for a, b in zip(calls, calls[1:]))  # not a busy loop
    time.sleep(0.15)
    assert len(calls) == n  # stopped


def test_a_failing_trim_ends_the_thread_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise OSError("no allocator here")

    trimmer = heaptrim.HeapTrimmer(every_s=0.01, trim=broken)
    with caplog.at_level(logging.WARNING, logger="flowtop.monitor.heaptrim"):
        assert trimmer.start()
        assert _until(lambda: bool(caplog.records))
        time.sleep(0.1)  # ten more periods: it does not call again
        trimmer.stop()
    assert calls == [1]
    assert [r.getMessage() for r in caplog.records] == ["heap trimming stopped: OSError: no allocator here"]


def test_without_a_trim_or_a_period_nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heaptrim, "glibc_trim", lambda: None)
    trimmer = heaptrim.HeapTrimmer(every_s=10.0)
    assert not trimmer.start()
    assert trimmer.trim_once() == 0 and trimmer.trims().count == 0
    assert not heaptrim.HeapTrimmer(every_s=0.0, trim=lambda: None).start()


def test_the_process_trimmer_follows_its_variable(monkeypatch: pytest.MonkeyPatch, no_process_trimmer: None,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "0")
    off = heaptrim.for_process()
    assert off.every_s == 0.0 and not off.start() and heaptrim.current() is off
    assert heaptrim.for_process() is off  # one per process
    monkeypatch.setattr(heaptrim, "_PROCESS", None)
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "soon")
    with caplog.at_level(logging.WARNING, logger="flowtop.settings"):
        assert settings.HEAP_TRIM_S.read() == 10.0
    assert "FLOWTOP_HEAP_TRIM_S" in caplog.text
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "2.5")
    assert settings.HEAP_TRIM_S.read() == 2.5
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "0.0")
    assert settings.HEAP_TRIM_S.read() == 0.0
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "-1")
    assert settings.HEAP_TRIM_S.read() == 10.0


@pytest.mark.parametrize("follow", [[], ["--follow"]])
def test_snapshot_reads_and_checks_the_variable_as_top_and_serve(
        follow: list[str], monkeypatch: pytest.MonkeyPatch, no_process_trimmer: None,
        caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """`flowtop snapshot` (and --follow) started no trimmer: the variable was ignored, a bad value unsaid."""
    from flowtop import cli
    from flowtop.tools.demo.launch import free_port_pair

    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "soon")
    try:
        with caplog.at_level(logging.WARNING, logger="flowtop.settings"):
            assert cli.main(["snapshot", *follow, "--listen", listen, "--timeout", "0.1"]) == 0
        assert "FLOWTOP_HEAP_TRIM_S" in caplog.text
        trimmer = heaptrim.current()
        assert trimmer is not None and trimmer.every_s == 10.0
    finally:
        if heaptrim.current() is not None:
            heaptrim.current().stop()  # type: ignore[union-attr]
    monkeypatch.setattr(heaptrim, "_PROCESS", None)
    monkeypatch.setenv("FLOWTOP_HEAP_TRIM_S", "0")
    assert cli.main(["snapshot", *follow, "--listen", listen, "--timeout", "0.1"]) == 0
    assert heaptrim.current() is not None and heaptrim.current().every_s == 0.0  # type: ignore[union-attr]
    capsys.readouterr()

