"""The monitor's heap trimmer (flowtop.monitor.heaptrim): real glibc, real RSS."""

from __future__ import annotations

import logging
import time

import pytest

from flowtop.monitor import heaptrim

needs_glibc = pytest.mark.skipif(heaptrim.glibc_trim() is None or not heaptrim.rss_bytes(),
                                 reason="malloc_trim and /proc/self/statm: glibc on Linux")


def _freed_inside_the_heap(mb: int) -> list[bytes]:
    """Allocate ``mb`` MB in 60 KB blocks (under glibc's mmap threshold: from its heaps), keep
    every tenth alive and free the rest: the freed memory is not at the top of a heap, so free()
    gives none of it back. Returns the kept blocks (the caller holds them)."""
    blocks = [bytes(60_000) + b"x" for _ in range(mb * 1_000_000 // 60_000)]
    return blocks[::10]


@needs_glibc
def test_a_trim_gives_back_memory_freed_inside_the_heap() -> None:
    trimmer = heaptrim.HeapTrimmer()
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
    deadline = time.monotonic() + 5.0
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    n = len(calls)
    assert n >= 3 and trimmer.trims().count == n
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
        time.sleep(0.2)
        trimmer.stop()
    assert calls == [1]
    assert [r.getMessage() for r in caplog.records] == ["heap trimming stopped: OSError: no allocator here"]


def test_without_a_trim_nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heaptrim, "glibc_trim", lambda: None)
    trimmer = heaptrim.HeapTrimmer()
    assert not trimmer.start()
    assert trimmer.trim_once() == 0 and trimmer.trims().count == 0
