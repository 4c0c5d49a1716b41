"""Import boundaries (docs/design.md, "Data flow"), checked in fresh interpreters via sys.modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def _top(mods: set[str]) -> set[str]:
    return {m.split(".")[0] for m in mods}


def test_probe_imports_neither_textual_nor_flowtop() -> None:
    mods = _top(_modules_after("import probe, probe.runtime, probe.steps, probe.publisher; probe.attach()"))
    assert "textual" not in mods and "flowtop" not in mods


@pytest.mark.parametrize(
    "module",
    ["flowtop.collector", "flowtop.model", "flowtop.accounting", "flowtop.snapshot", "flowtop.wiring",
     "flowtop.textreport", "flowtop.runner", "flowtop.cli", "flowtop.claims", "flowtop.rankstate",
     "flowtop.datathread", "flowtop.clock", "flowtop.ticker", "flowtop.notices", "flowtop.rankviews",
     "flowtop.recording", "flowtop.fdwatch", "flowtop.gcpolicy", "flowtop.exporter", "flowtop.metrics_http",
     "flowtop.serve", "flowtop.selfload", "flowtop.doctor", "flowtop.doctor_checks"],
)  # fmt: skip
def test_monitor_data_side_imports_without_textual_or_torch(module: str) -> None:
    mods = _top(_modules_after(f"import {module}"))
    assert "textual" not in mods
    assert "torch" not in mods  # the monitor runs on login nodes without torch
    # From probe, the monitor may import only the wire schema.
    probe_mods = {m for m in _modules_after(f"import {module}") if m.startswith("probe.")}
    assert {m for m in probe_mods if not m.startswith("probe.wire.")} <= {"probe.wire", "probe._log"}


def test_snapshot_data_path_imports_without_textual() -> None:
    mods = _top(_modules_after("from flowtop.wiring import make_model; m = make_model(); m.tick(0.5); m.snapshot(0.0)"))
    assert "textual" not in mods and "torch" not in mods


def test_the_data_thread_runs_a_collector_without_textual() -> None:
    """The data thread hosts the collector (sockets, ticks, hints) with no UI module loaded."""
    code = ("from flowtop.collector import Collector; from flowtop.datathread import DataThread; "
            "from flowtop.demo.launch import free_port_pair; from flowtop.wiring import make_model; "
            "d = DataThread(Collector(make_model(), f'tcp://127.0.0.1:{free_port_pair()}'), cadence_s=0.05); "
            "d.start().result(10); import time; time.sleep(0.3); d.refresh().result(10); d.stop()")
    mods = _top(_modules_after(code))
    assert "textual" not in mods and "torch" not in mods
