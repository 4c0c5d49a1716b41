"""``flowtop run --relay on`` with a node relay's ipc:// address as its upstream: said plainly.

Real ``flowtop run`` processes (a trial of the README's relay commands on one machine).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent




def test_relay_on_with_a_relay_address_is_not_called_a_bad_address(run_env: dict[str, str]) -> None:
    """A trial: ``flowtop run --connect ipc:///PATH --relay on`` said "no node relay (bad address
    'ipc:///PATH': expected tcp://HOST:PORT ...)" and then connected its ranks to that very address."""
    path = f"{run_env['XDG_RUNTIME_DIR']}/up.sock"
    run = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--connect", f"ipc://{path}", "--relay", "on",
                          "--", sys.executable, "-c", "print('trained')"],
                         capture_output=True, text=True, timeout=120, env=run_env, cwd=ROOT)
    assert run.returncode == 0 and run.stdout == "trained\n", run.stderr
    assert "bad address" not in run.stderr, run.stderr
    assert (f"flowtop run: --relay on: ipc://{path} is a node relay's address already (a relay cannot sit "
            "behind another); ranks connect to it directly\n") in run.stderr, run.stderr
