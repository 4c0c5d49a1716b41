"""A monitor that starts after the training, or restarts, gets the rank's FLOP count at once.

The probe counts a step's FLOPs once (and again every FLOWTOP_RECHECK_STEPS steps, 500 by
default) and sends the count once. A monitor that was not listening then showed no FLOP/s or MFU
("no FLOP count yet") until the next re-count: minutes at a 1 s step. The sender now keeps the
latest count and sends it again after the hello whenever a monitor (re)appears. A real probe
trains a real model here against a real collector (tests/monitor_thread.py) started late, then
restarted on the same address.
"""

from __future__ import annotations

import time
from typing import Iterator

import pytest

import probe
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.tools.demo.launch import free_port
from monitor_thread import MonitorThread

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")

JOB = "late"


class Loop:
    """A real training loop: a small model stepped every ``step_s`` from the test's thread."""

    def __init__(self) -> None:
        self.model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def run(self, seconds: float, step_s: float = 0.05) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.model(torch.randn(16, 32)).sum().backward()
            self.opt.step()
            self.opt.zero_grad()
            time.sleep(step_s)


def _counted(snap: MonitorSnapshot) -> bool:
    ranks = [r for job in snap.jobs if job.job == JOB for r in job.ranks]
    return bool(ranks) and all(r.flops is not None and r.flops.model_flops_per_step for r in ranks)


@pytest.fixture
def addr(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    address = f"tcp://127.0.0.1:{free_port()}"
    monkeypatch.setenv("FLOWTOP_ADDR", address)
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    yield address


def _train_until(loop: Loop, monitor: MonitorThread, timeout: float) -> float:
    """Train until the monitor shows the rank's FLOP count; the seconds it took (inf: never)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        loop.run(0.2)
        if _counted(monitor.published()):
            return time.monotonic() - start
    return float("inf")


def test_a_monitor_started_late_or_restarted_gets_the_flop_count(addr: str) -> None:
    assert probe.attach(job=JOB)
    loop = Loop()
    monitor: MonitorThread | None = None
    try:
        loop.run(3.0)  # counted at its first steady steps, sent to nobody, expired (max_age_s 2 s)
        monitor = MonitorThread(listen=addr)
        took = _train_until(loop, monitor, 6.0)
        assert took < 4.0, took  # the next re-count is step 500: ~30 s away at this step time
        monitor.close()
        loop.run(1.0)
        monitor = MonitorThread(listen=addr)  # a restart on the same address
        took = _train_until(loop, monitor, 6.0)
        assert took < 4.0, took
    finally:
        probe.detach()
        if monitor is not None:
            monitor.close()
