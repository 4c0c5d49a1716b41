"""Shared fixtures: a real monitor, the environment for probed subprocesses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from monitor_thread import MonitorThread  # noqa: E402


def _cuda_missing() -> str:
    """Why CUDA tests cannot run here ('' when torch sees a CUDA device)."""
    try:
        import torch
    except ImportError:
        return "needs a CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        return "needs a CUDA device: torch sees none (run on the GPU machine, e.g. bench/device_run.sh)"
    return ""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile flowtop's, the probe's, the recipes' and the tests' helpers to ``__pycache__`` once.
    Where PYTHONDONTWRITEBYTECODE is set (CI's machines), no interpreter writes bytecode, so every
    subprocess the tests start (hundreds: CLIs, probed trainings, torchrun ranks) compiled the
    modules it imports from source again, ~0.1 s of CPU each; bytecode written here is read by all
    of them (and checked against its source's mtime and size, as any ``.pyc``)."""
    import compileall

    for top in ("flowtop", "probe", "recipes", "tests"):
        compileall.compile_dir(str(ROOT / top), quiet=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where there is no CUDA device; torch is imported only if any is."""
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu:
        return
    reason = _cuda_missing()
    if reason:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _monitor_gc_policy_undone() -> Iterator[None]:
    """A test that runs a monitor's command in this process (``cli.main(["top", ...])``) sets the
    monitor's process-wide GC policy (flowtop.monitor.gcpolicy): undone after it, so later tests'
    collectors do not freeze pytest's heap at their ticks."""
    yield
    from flowtop.monitor import gcpolicy

    gcpolicy.undo()


@pytest.fixture
def monitor() -> Iterator[MonitorThread]:
    """A real collector bound to a free loopback port."""
    m = MonitorThread()
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def run_env() -> Iterator[dict[str, str]]:
    """The environment of a `flowtop run` / `flowtop relay` subprocess: a short runtime dir of its
    own (a relay's ipc path is at most 100 bytes; pytest's tmp_path is long), no keys or address
    from the caller's environment."""
    runtime = tempfile.mkdtemp(prefix="ftrun", dir="/tmp")
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    env.pop("FLOWTOP_CURVE_DIR", None)
    env.pop("FLOWTOP_ADDR", None)
    yield env
    shutil.rmtree(runtime, ignore_errors=True)


def probed_env(addr: str, **extra: str) -> dict[str, str]:
    """Environment of a training subprocess that should reach ``addr``."""
    from flowtop.tools.runner import probe_env

    env = probe_env(os.environ, connect=addr)
    env.update(extra)
    return env


def finished(proc: "subprocess.Popen[str]", timeout: float) -> tuple[str, str]:
    """(stdout, stderr) of ``proc`` once it has exited within ``timeout`` seconds; killed (and the
    timeout raised) when it has not: a failed test leaves no process behind."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out, err


def wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``cond`` every 10 ms until it holds (True) or ``timeout_s`` passed (its last reading)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


async def pilot_until(pilot: Any, pred: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Let a Textual pilot's app run until ``pred()`` holds or ``timeout`` s passed; its value then."""
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    return pred()

