"""Shared fixtures: a real monitor, the environment for probed subprocesses."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from monitor_thread import MonitorThread  # noqa: E402


@pytest.fixture
def monitor() -> Iterator[MonitorThread]:
    """A real collector bound to a free loopback port."""
    m = MonitorThread()
    try:
        yield m
    finally:
        m.close()


def probed_env(addr: str, **extra: str) -> dict[str, str]:
    """Environment of a training subprocess that should reach ``addr``."""
    from flowtop.runner import probe_env

    env = probe_env(os.environ, connect=addr)
    env.update(extra)
    return env
