"""HostTelemetry (probe/telemetry/hostinfo.py) on this machine, with real DataLoader worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from probe.telemetry.hostinfo import HOST_FIELDS, HostTelemetry

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train]); the monitor-only install has none")


class BurnDataset(torch.utils.data.Dataset):  # type: ignore[misc]
    """Each item burns CPU in the worker for a while, like a heavy decode/augment step."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        total = 0
        for k in range(400_000):  # ~30-60 ms of pure-Python work
            total += k * k
        return torch.tensor([i, total % 7])


def test_sample_fields_on_this_process() -> None:
    t = HostTelemetry()
    s = t.sample()
    assert set(HOST_FIELDS) <= set(s)
    assert s["reasons"] == {}
    me = psutil.Process()
    assert s["threads"] == me.num_threads()
    assert s["rss_bytes"] > 10 * 2**20  # a Python process with pytest loaded
    assert s["host_mem_total"] == psutil.virtual_memory().total
    assert 0 < s["host_mem_used"] <= s["host_mem_total"]
    # first reading is the average since start, never the fake 0.0 of an unprimed cpu_percent
    assert s["proc_cpu_pct"] > 0.0
    assert 0.0 <= s["host_cpu_pct"] <= 100.0


def test_cpu_percent_reflects_work_between_samples() -> None:
    t = HostTelemetry()
    t.sample()
    start = time.process_time()
    total = 0
    while time.process_time() - start < 0.6:  # burn 0.6 s of CPU in this process
        total += 1
    s = t.sample()
    assert total > 0
    assert s["proc_cpu_pct"] > 10.0  # the loop kept one core busy for most of the interval


class SteppedBack:
    """The ``time`` module as hostinfo sees it once NTP stepped the wall clock a minute back."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def time() -> float:
        return time.time() - 60.0


def test_cpu_percent_between_samples_ignores_a_step_of_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """NTP steps the wall clock a minute back between two samples: the CPU % is still measured
    over the time between them. On the wall clock the window looked negative and the previous
    figure (an idle one here) was repeated for a minute."""
    from probe.telemetry import hostinfo

    t = HostTelemetry()
    t.sample()
    time.sleep(0.5)
    t.sample()  # idle since the first one
    monkeypatch.setattr(hostinfo, "time", SteppedBack)
    start = time.process_time()
    while time.process_time() - start < 0.6:  # burn 0.6 s of CPU in this process
        pass
    assert t.sample()["proc_cpu_pct"] > 30.0


def test_readings_closer_than_the_window_repeat_the_last_figure() -> None:
    t = HostTelemetry()
    first = t.sample()
    again = t.sample()  # microseconds later: tick noise would read as hundreds of percent
    assert again["proc_cpu_pct"] == first["proc_cpu_pct"]
    assert again["host_cpu_pct"] == first["host_cpu_pct"]


def test_dataloader_workers_are_counted_while_iterating() -> None:
    t = HostTelemetry()
    before = t.sample()
    loader = torch.utils.data.DataLoader(BurnDataset(), batch_size=1, num_workers=2)
    during: list[dict[str, Any]] = []
    for _ in loader:
        during.append(t.sample())
    assert before["workers"] == 0
    assert all(s["workers"] >= 1 for s in during)
    assert max(s["workers"] for s in during) == 2
    # the workers burned CPU: their share shows up in workers_cpu_pct, not in proc_cpu_pct
    assert max(s["workers_cpu_pct"] for s in during) > 0.0
    del loader
    assert t.sample()["workers"] == 0


def test_zombie_children_are_not_workers() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # wait until it exits but do not reap it: it stays a zombie child of this process
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert HostTelemetry().sample()["workers"] == 0
    finally:
        child.wait()


def test_unreadable_process_gives_reasons() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    s = HostTelemetry(pid=gone.pid).sample()
    for key in HOST_FIELDS:
        assert s[key] is None
        assert s["reasons"][key].startswith(f"process {gone.pid} not readable")


def test_only_multiprocessing_children_are_workers() -> None:
    """A child that is not a multiprocessing worker (here a plain subprocess, like the monitor a
    benchmark starts) is a child, not an input worker."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        s = HostTelemetry().sample()
        assert s["workers"] == 0 and s["children"] >= 1
        assert s["workers_cpu_pct"] == 0.0
    finally:
        child.kill()
        child.wait()


def test_worker_recognition_by_command_line() -> None:
    from probe.telemetry.hostinfo import is_worker

    parent = ["python", "train.py", "--lr", "3e-4"]
    assert is_worker(parent, parent)  # forked: same argv
    spawned = ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, "
               "pipe_handle=11)", "--multiprocessing-fork"]
    assert is_worker(spawned, parent)
    from probe.telemetry.hostinfo import is_forkserver

    server = ["python", "-c", "from multiprocessing.forkserver import main; main(10, 11, ['__main__'])"]
    assert is_forkserver(server) and not is_worker(server, parent)  # its children are the workers
    assert not is_worker(["python", "-m", "flowtop.cli", "snapshot"], parent)
    assert not is_worker(["python", "/site-packages/torch/_inductor/compile_worker/__main__.py"], parent)
    assert not is_worker([], parent)


def test_forkserver_dataloader_workers_are_counted() -> None:
    """With the forkserver start method (Python 3.14's default on Linux) the workers are children
    of the fork server, not of the training process."""
    t = HostTelemetry()
    loader = torch.utils.data.DataLoader(BurnDataset(), batch_size=1, num_workers=2,
                                         multiprocessing_context="forkserver")
    during = [t.sample() for _ in loader]
    assert max(s["workers"] for s in during) == 2
    assert max(s["workers_cpu_pct"] for s in during) > 0.0


def test_children_are_read_without_scanning_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's children() reads the stat file of every process on the host (~8 ms a sample with
    100 processes, every rank every second): the probe lists its children from its threads'
    /proc children files instead, and finds them all the same."""
    from probe.telemetry.hostinfo import child_pids

    if child_pids(os.getpid()) is None:
        pytest.skip("this kernel has no /proc/<pid>/task/<tid>/children files")

    def scan(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("psutil.Process.children scans the whole process table")

    monkeypatch.setattr(psutil.Process, "children", scan)
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        assert set(child_pids(os.getpid()) or []) >= {k.pid for k in kids}
        s = HostTelemetry().sample()
        assert s["children"] >= 2 and "children" not in s["reasons"]
    finally:
        for k in kids:
            k.kill()
            k.wait()
