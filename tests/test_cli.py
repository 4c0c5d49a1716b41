"""CLI: clear errors for bad input, JSON snapshot with no probes, README/CI consistency."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowtop.tools.demo.launch import free_port_pair
from snapshot_schema import assert_valid_snapshot

ROOT = Path(__file__).resolve().parent.parent


def _flowtop(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowtop.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["snapshot", "--timeout", "-1"], "must be a positive number"),
        (["snapshot", "--timeout", "soon"], "expected a number"),
        (["demo", "--ranks", "0"], "must be positive"),
        (["top", "--peak-tflops", "inf"], "must be a positive number"),
        (["snapshot", "--listen", "udp://x"], "expected tcp://HOST:PORT"),
        (["snapshot", "--listen", "tcp://0.0.0.0:5999"], "--insecure-bind"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    out = _flowtop(*args)
    assert out.returncode == 2
    assert message in out.stderr


def test_snapshot_json_with_no_probes() -> None:
    port = free_port_pair()
    out = _flowtop("snapshot", "--listen", f"tcp://127.0.0.1:{port}", "--timeout", "0.3", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert_valid_snapshot(data)
    from flowtop.monitor.snapshot import SCHEMA

    assert data["schema"] == SCHEMA == "flowtop.snapshot/1.5"
    assert data["jobs"] == [] and data["received"] == 0


def test_snapshot_port_in_use_is_a_clear_error() -> None:
    import socket

    port = free_port_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        out = _flowtop("snapshot", "--listen", f"tcp://127.0.0.1:{port}", "--timeout", "0.3")
    assert out.returncode == 2
    assert "cannot bind" in out.stderr


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)\n```", readme, re.S)
    install, test = blocks[0].strip(), blocks[1].strip()
    assert "flowtop demo" in install and "torch==2.13.0" in install
    ci = (ROOT / ".ci" / "run").read_text()
    assert test in ci.splitlines()
