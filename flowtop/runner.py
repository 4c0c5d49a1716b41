"""``flowtop run -- CMD``: run a command with the probe injected through sitecustomize."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping

import probe.wire as wire

BOOTSTRAP_DIR = Path(__file__).resolve().parent.parent / "probe" / "bootstrap"


def probe_env(
    base: Mapping[str, str], connect: str | None = None, job: str | None = None, curve_dir: str | None = None
) -> dict[str, str]:
    """The environment CMD runs in: bootstrap first on PYTHONPATH, probe importable."""
    env = dict(base)
    package_root = str(BOOTSTRAP_DIR.parent.parent)
    parts = [str(BOOTSTRAP_DIR), package_root]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if connect:
        env["FLOWTOP_ADDR"] = connect
    env.setdefault("FLOWTOP_ADDR", wire.DEFAULT_ADDR)
    if job:
        env["FLOWTOP_JOB"] = job
    if curve_dir:
        env["FLOWTOP_CURVE_DIR"] = os.path.abspath(curve_dir)
    return env


def run(cmd: list[str], connect: str | None = None, job: str | None = None, curve_dir: str | None = None) -> int:
    """Run ``cmd`` to completion; forward SIGINT/SIGTERM/SIGHUP; return its exit code."""
    if not cmd:
        print("flowtop run: no command given (usage: flowtop run [--connect ADDR] -- CMD ARGS...)", file=sys.stderr)
        return 2
    try:
        child = subprocess.Popen(cmd, env=probe_env(os.environ, connect, job, curve_dir))
    except OSError as exc:
        print(f"flowtop run: cannot start {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: object) -> None:
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    # A child killed by a signal: report it the way a shell does.
    return code if code >= 0 else 128 - code
