"""The "no monitor listens yet" note is said once per node, not once per ``flowtop run``.

A trial of the README's per-rank launch (``srun --ntasks-per-node 8 flowtop run ... -- python
train.py``, simulated as two ``flowtop run --relay on`` of one node): each run printed the same
note, one line per rank of the node (the peer check was already once per node, through the lock
beside the node relay's socket). Real processes, nothing listening at the monitor's address.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowtop.tools.demo.launch import free_port_pair

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent




def _run(addr: str, code: str) -> list[str]:
    return [sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--relay", "on", "--",
            sys.executable, "-c", code]


def test_second_run_of_a_node_does_not_repeat_the_note(run_env: dict[str, str]) -> None:
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    note = f"flowtop run: no monitor listens on {addr} yet: start `flowtop --listen {addr}` (another terminal)"
    # the first run holds the node's relay and its check lock while its command waits for a line
    first = subprocess.Popen(_run(addr, "import sys; sys.stdin.readline(); print('first')"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env, cwd=ROOT)
    try:
        assert first.stderr is not None
        said = first.stderr.readline()  # said before its command starts
        assert said.startswith(note), said
        second = subprocess.run(_run(addr, "print('second')"), capture_output=True, text=True, timeout=120,
                                env=run_env, cwd=ROOT)
        assert second.returncode == 0 and second.stdout == "second\n", second.stderr
        assert "no monitor listens" not in second.stderr, second.stderr
        out, err = first.communicate("go\n", timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0 and out == "first\n", err
    assert "no monitor listens" not in err  # once, the line read above
    # the node spoken for has no speaker left: the next run of it says the note again
    third = subprocess.run(_run(addr, "print('third')"), capture_output=True, text=True, timeout=120, env=run_env, cwd=ROOT)
    assert third.returncode == 0 and third.stderr.startswith(note), third.stderr
