"""The "no monitor listens yet" note of a job that holds CURVE keys names the keys too.

A trial: ``flowtop run --connect tcp://127.0.0.1:PORT --curve-dir DIR -- torchrun ...`` (the README's
Many nodes command, tried on one machine) said "start `flowtop --listen tcp://127.0.0.1:PORT`": a
monitor started as told has no keys and refuses every handshake of the keyed probes (or of the node
relay), so the job the user was told how to watch never showed. Real processes: ``flowtop keys``,
``flowtop run`` (direct and through its node relay) and ``flowtop relay``, nothing listening.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowtop.tools.demo.launch import free_port_pair

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent




def _keys(tmp_path: Path, env: dict[str, str]) -> Path:
    keys = tmp_path / "keys"
    made = subprocess.run([sys.executable, "-m", "flowtop.cli", "keys", str(keys)], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    return keys


@pytest.mark.parametrize("relay", ["off", "on"])
def test_run_with_keys_names_the_keyed_monitor_command(tmp_path: Path, run_env: dict[str, str], relay: str) -> None:
    keys = _keys(tmp_path, run_env)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    run = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--curve-dir", str(keys),
                          "--relay", relay, "--", sys.executable, "-c", "print('trained')"],
                         capture_output=True, text=True, timeout=120, env=run_env, cwd=ROOT)
    assert run.returncode == 0 and run.stdout == "trained\n", run.stderr
    assert (f"no monitor listens on {addr} yet: start `flowtop --listen {addr} --curve-dir {keys}` "
            "(another terminal)") in run.stderr, run.stderr


def test_run_without_keys_names_no_keys(run_env: dict[str, str]) -> None:
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    run = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--",
                          sys.executable, "-c", "print('trained')"],
                         capture_output=True, text=True, timeout=120, env=run_env, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert f"start `flowtop --listen {addr}` (another terminal)" in run.stderr, run.stderr


def test_keys_from_the_environment_are_named_too(tmp_path: Path, run_env: dict[str, str]) -> None:
    """``FLOWTOP_CURVE_DIR=DIR`` does what ``--curve-dir DIR`` does (README, Many nodes)."""
    keys = _keys(tmp_path, run_env)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    run = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--relay", "off", "--",
                          sys.executable, "-c", "print('trained')"],
                         capture_output=True, text=True, timeout=120, env={**run_env, "FLOWTOP_CURVE_DIR": str(keys)},
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert f"start `flowtop --listen {addr} --curve-dir {keys}`" in run.stderr, run.stderr


def test_relay_with_keys_names_the_keyed_monitor_command(tmp_path: Path, run_env: dict[str, str]) -> None:
    keys = _keys(tmp_path, run_env)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    cmd = [sys.executable, "-m", "flowtop.cli", "relay", "--connect", addr, "--curve-dir", str(keys)]
    relay = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=run_env, cwd=ROOT)
    try:
        assert relay.stderr is not None
        lines = [relay.stderr.readline() for _ in range(2)]  # where ranks connect, then the note
    finally:
        relay.terminate()
        relay.wait(timeout=60)
    assert lines[1].startswith(f"flowtop relay: no monitor listens on {addr} yet: start "
                               f"`flowtop --listen {addr} --curve-dir {keys}`"), lines

