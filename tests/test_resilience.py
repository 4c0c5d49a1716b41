"""A dead monitor, a restarted monitor and a dead rank: nothing hangs, nothing is lost silently."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import finished, probed_env
from monitor_thread import MonitorThread

SCRIPT = textwrap.dedent(
    """
    import os, sys, time, torch
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline = time.monotonic() + float(sys.argv[1])
    stop = sys.argv[2] if len(sys.argv) > 2 else None  # a file: trains until it exists (or the deadline)
    while time.monotonic() < deadline and not (stop and os.path.exists(stop)):
        model(torch.randn(8, 16)).sum().backward(); opt.step(); opt.zero_grad()
        time.sleep(0.02)
    print("trained", flush=True)
    """
)


@pytest.mark.slow
def test_monitor_restart_resumes_and_counts_the_gap(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    first = MonitorThread()
    listen = first.listen
    env = probed_env(listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0")
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(script), "60", str(stop)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        _restart_and_stop(first, listen, stop)
    finally:
        stop.touch()  # a failed check must not leave the training running its 60 s
        out, _ = finished(proc, 30)
    assert proc.returncode == 0 and "trained" in out


def _restart_and_stop(first: MonitorThread, listen: str, stop: Path) -> None:
    """The checks of test_monitor_restart_resumes_and_counts_the_gap: the first monitor hears
    the rank, dies, a second one on its address hears it again; then the training is stopped."""
    try:
        snap = first.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step >= 20, 30)
        assert snap.jobs[0].ranks[0].step >= 20
        last_seen_by_first = first.snapshot().jobs[0].ranks[0].step
    finally:
        first.close()  # the monitor dies; training must not notice
    time.sleep(2.5)  # > the probe's 2 s retention: messages of this gap are dropped and counted
    second = MonitorThread(listen=listen)
    try:
        # Once the new monitor hears the rank's steps again, the training stops (it ran a fixed
        # 12 s, ~8 s of it past this point).
        second.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step > last_seen_by_first + 10, 30)
        stop.touch()
        snap = second.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 30)
        rank = snap.jobs[0].ranks[0]
        assert rank.device.startswith("cpu")  # the hello is repeated, so a new monitor knows the rank
        assert rank.step > 20
        # The bye carries the probe's drop count: the steps sent while nobody listened.
        assert rank.dropped_messages > 0
        # No stale flood: what waited more than 2 s was dropped, so the new monitor's first
        # step is well past the last one the old monitor saw (at ~50 steps/s, 2.5 s gap).
        first_seen_by_second = min(step for step, _ in rank.history.reached)
        assert first_seen_by_second > last_seen_by_first + 10
    finally:
        second.close()


@pytest.mark.slow
def test_dead_rank_goes_stale_without_bye(monitor, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = probed_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0")
    proc = subprocess.Popen([sys.executable, str(script), "60"], env=env, stdout=subprocess.DEVNULL)
    try:
        monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step >= 5, 30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        snap = monitor.wait_for(lambda s: s.jobs[0].ranks[0].status == "stale", 15)
        rank = snap.jobs[0].ranks[0]
        assert rank.status == "stale" and rank.bye_reason is None
        assert snap.jobs[0].status == "stale"
    finally:
        if proc.poll() is None:
            proc.kill()
