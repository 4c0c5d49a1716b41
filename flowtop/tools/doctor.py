"""``flowtop doctor``: why nothing shows up, in words, each finding with its fix. No Textual.

It starts a child interpreter with exactly the environment ``flowtop run`` gives a training
(flowtop.tools.runner.probe_env) and asks it (flowtop.tools.doctor_child) what a training process would
see; it checks the address, the keys and the open-file limit here (flowtop.tools.doctor_checks).
Exit status 1 when a finding would stop monitoring (``fail``), else 0; 2 for bad arguments.
``--json`` prints the findings as one JSON object for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from flowtop import settings
from flowtop.tools.doctor_checks import (
    FAIL,
    Finding,
    address_findings,
    child_python_finding,
    device_findings,
    env_keys,
    fd_findings,
    key_findings,
    probe_findings,
)

CHILD = Path(__file__).resolve().parent / "doctor_child.py"
#: Seconds the child interpreter may take (importing torch on a loaded machine is slow).
CHILD_TIMEOUT_S = 120.0
MARK = "FLOWTOP-DOCTOR "
_ICON = {"ok": "ok  ", "info": "info", "warn": "warn", "fail": "FAIL"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The doctor's options (flowtop.tools.cli_args.build_parser)."""
    from flowtop.tools.common import positive_int  # the CLI's one parser of counts

    default = settings.ADDR.read()
    p.add_argument("--listen", default=default,
                   help=f"the monitor's address to check (default {default}; env FLOWTOP_ADDR)")
    p.add_argument("--curve-dir", default=None, metavar="DIR",
                   help="CURVE keys to check (default env FLOWTOP_CURVE_DIR)")
    p.add_argument("--insecure-bind", action="store_true", help="the monitor will run with --insecure-bind")
    p.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                   help="ranks expected: check the open-file limit for them")
    p.add_argument("--python", default=sys.executable, metavar="PATH",
                   help="the training's interpreter (default: this one)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")




def ask_child(python: str, env: dict[str, str]) -> tuple[dict[str, Any] | None, Finding | None]:
    """Run flowtop.tools.doctor_child in ``python`` under ``env`` (flowtop run's); its report, or why not."""
    with tempfile.TemporaryDirectory(prefix="flowtop-doctor-") as tmp:
        child_env = dict(env)
        # The attach test must never reach a real monitor: an ipc path nobody binds.
        settings.PROBE_ADDR.put(child_env, f"ipc://{tmp}/nobody-listens")
        child_env.setdefault(settings.PROBE_TELEMETRY.name, "0")
        settings.PROBE_KERNELS.put(child_env, "0")
        try:
            proc = subprocess.run([python, str(CHILD)], env=child_env, capture_output=True, text=True,
                                  timeout=CHILD_TIMEOUT_S, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, child_python_finding(python, -1, f"{type(exc).__name__}: {exc}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            try:
                return json.loads(line[len(MARK):]), None
            except ValueError:
                break
    return None, child_python_finding(python, proc.returncode, proc.stderr)


def run_checks(listen: str, curve_dir: str | None, insecure: bool, ranks: int | None, python: str,
               environ: dict[str, str] | None = None) -> list[Finding]:
    """Every check, in the order they are printed."""
    from flowtop.tools.runner import probe_env

    env = probe_env(os.environ if environ is None else environ, connect=listen, curve_dir=curve_dir)
    child, failed = ask_child(python, env)
    findings: list[Finding] = []
    if child is None:
        assert failed is not None
        findings.append(failed)
    else:
        findings.append(Finding("python", "info", f"training interpreter {child.get('executable')} "
                                f"(Python {child.get('python')})", details={"executable": child.get("executable")}))
        findings += probe_findings(child, python)
        findings += device_findings(child)
    address = address_findings(listen, curve_dir, insecure)
    findings += address
    keys = key_findings(curve_dir, loopback_ok=all(f.status == "ok" for f in address if f.check == "security"))
    findings += keys
    findings += handshake_findings(listen, curve_dir, address, keys)
    findings += fd_findings(ranks)
    return findings


def handshake_findings(listen: str, curve_dir: str | None, address: list[Finding],
                       keys: list[Finding]) -> list[Finding]:
    """A probe's handshake with the monitor (flowtop.tools.doctor_handshake), where a monitor
    answers the port check and the keys, if any, load: the greeting alone passed a monitor
    whose server key was another directory's."""
    answers = any(f.check == "port" and f.status == "ok" and "greeting" in f.details for f in address)
    if not answers or any(f.status == FAIL for f in keys):
        return []
    from flowtop.tools.doctor_handshake import handshake_finding
    from flowtop.tools.relay_setup import RelayError, client_keys

    try:
        loaded = client_keys(curve_dir)
    except RelayError:
        return []  # the keys check said why
    return [handshake_finding(listen, loaded, curve_dir)]


def render(findings: Sequence[Finding]) -> str:
    """The findings in words, a fix under each that needs one, and the verdict."""
    lines = []
    for f in findings:
        lines.append(f"[{_ICON.get(f.status, f.status)}] {f.check}: {f.summary}")
        if f.fix and f.status in ("warn", "fail"):
            lines.append(f"       fix: {f.fix}")
    fails = [f for f in findings if f.status == FAIL]
    warns = sum(1 for f in findings if f.status == "warn")
    if fails:
        counts: dict[str, int] = {}
        for f in fails:  # each check once, with how many findings it failed ("keys (3)")
            counts[f.check] = counts.get(f.check, 0) + 1
        names = ", ".join(check if n == 1 else f"{check} ({n})" for check, n in counts.items())
        lines.append(f"\n{len(fails)} problem(s) would stop monitoring: {names}")
    else:
        lines.append(f"\nnothing would stop monitoring ({warns} warning(s))")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """``flowtop doctor``: 1 when something would stop monitoring, else 0."""
    curve_dir = args.curve_dir or env_keys()
    findings = run_checks(args.listen, curve_dir, args.insecure_bind, args.ranks, args.python)
    failed = any(f.status == FAIL for f in findings)
    if args.json:
        text = json.dumps({"ok": not failed, "findings": [asdict(f) for f in findings]}, indent=2)
    else:
        text = render(findings)
    print(text, flush=True)
    return 1 if failed else 0
