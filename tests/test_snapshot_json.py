"""The JSON snapshot: every field always present (null when unknown), and the JSON Schema shipped
in the package, which the README's field list and the code must both match."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flowtop.tools.demo.launch import free_port_pair
from flowtop.monitor.hints import HintEngine
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import FLOP_FIELDS, NO_COUNT_REASON, json_schema, to_json
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot, snapshot_errors
from test_hints_factories import GEMM_H, b_rank_conflict, flops, history, job, kwin, rank, telemetry

ROOT = Path(__file__).resolve().parent.parent
HELLO = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}


def _full_snapshot() -> dict[str, Any]:
    """A snapshot using every optional part: counted FLOPs, telemetry, a kernel window, hints,
    a rank conflict, a rank without a count."""
    conflict = b_rank_conflict(1.0, 0.0)
    conflict = dataclasses.replace(conflict, hints=HintEngine().evaluate(conflict, 0.0), rank_conflicts=1)
    counted = job(rank(0, fl=flops(), tel=telemetry(gpu_util=97.0, throttle=["sw_power_cap"]),
                       kernels=kwin([(GEMM_H, 10, 800.0)]), hist=history(12)),
                  rank(1, hist=history(12)), fl=flops(), name="counted")
    return to_json(MonitorSnapshot(12.0, "tcp://127.0.0.1:5759", (conflict, counted), 40, 1, {"bad frame": 1}))


def test_rank_without_a_count_has_every_flop_field_null_over_the_wire() -> None:
    """A real probe publisher (hello, steps, bye; no flops message) into `flowtop snapshot --json`."""
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", addr, "--until-done",
                                "--timeout", "30", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pub = Publisher(RankKey("nocount", "h", 4242, 0, 0), addr)
    pub.hello_fields = dict(HELLO)
    pub.start()
    try:
        deadline = time.monotonic() + 20
        while pub.subscribers == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the monitor's collector has started and subscribed
        for step in range(1, 9):
            pub.publish("step", {"step": step, "wall_s": 0.05, "tokens": 64, "drops": 0})
            time.sleep(0.05)
        pub.publish("bye", {"reason": "exit", "steps": 8, "drops": 0})
        out, err = monitor.communicate(timeout=40)
    finally:
        pub.close()
        if monitor.poll() is None:
            monitor.kill()
    assert monitor.returncode == 0, err
    data = json.loads(out)
    assert_valid_snapshot(data)
    (j,) = data["jobs"]
    (r,) = j["ranks"]
    assert r["step"] == 8 and r["status"] == "done" and r["tokens_per_step"] == 64
    for where in (r, j):
        missing = [k for k in FLOP_FIELDS if k not in where]
        assert not missing, missing
        assert {k: where[k] for k in FLOP_FIELDS if k != "mfu_reason"} == dict.fromkeys(
            [k for k in FLOP_FIELDS if k != "mfu_reason"])
        assert where["mfu_reason"] == NO_COUNT_REASON
    assert r["conflict"] == [] and j["rank_conflicts"] == 0


def test_full_snapshot_is_valid_and_every_flop_field_is_present() -> None:
    data = _full_snapshot()
    assert_valid_snapshot(data)
    counted = data["jobs"][1]
    assert counted["ranks"][0]["flops_per_step"] == 1e12 and counted["ranks"][0]["counted"] is True
    assert list(k for k in counted["ranks"][1] if k in FLOP_FIELDS) == list(FLOP_FIELDS)
    assert counted["ranks"][1]["flops_per_s"] is None  # rank 1 has no count, rank 0 has one
    hint = data["jobs"][0]["hints"][0]
    assert (hint["id"], hint["ended"], hint["first_step"], hint["last_step"]) == ("rank_conflict", False, 1, 10)
    assert data["jobs"][0]["ranks"][0]["conflict"] == [{"host": "node2", "pid": 4100}]


@pytest.mark.parametrize(("path", "change", "expect"), [
    (("jobs", 1, "ranks", 0), lambda d: d.pop("mfu"), "'mfu' is a required property"),
    (("jobs", 1, "ranks", 1), lambda d: d.pop("peak_source"), "'peak_source' is a required property"),
    (("jobs", 1), lambda d: d.pop("rank_conflicts"), "'rank_conflicts' is a required property"),
    (("jobs", 0, "hints", 0), lambda d: d.pop("ended"), "'ended' is a required property"),
    (("jobs", 1, "ranks", 0), lambda d: d.update(new_field=1), "Unevaluated properties are not allowed"),
    (("jobs", 1, "ranks", 0, "kernels", "anatomy"), lambda d: d.update(x=1), "Additional properties"),
    (("jobs", 1, "ranks", 0), lambda d: d.update(step_time_s="fast"), "is not of type"),
    (("jobs", 1), lambda d: d.update(status="finished"), "is not one of"),
    ((), lambda d: d.update(schema="flowtop.snapshot/2.0"), "does not match"),
])
def test_schema_rejects_drift(path: tuple[Any, ...], change: Any, expect: str) -> None:
    data = copy.deepcopy(_full_snapshot())
    node = data
    for part in path:
        node = node[part]
    change(node)
    errors = snapshot_errors(data)
    assert errors and any(expect in e for e in errors), errors


def test_schema_and_code_agree_on_the_flop_fields() -> None:
    schema = json_schema()
    assert list(schema["$defs"]["flops"]["properties"]) == list(FLOP_FIELDS)
    for name in ("flops", "rank", "job", "hint", "claimant"):
        d = schema["$defs"][name]
        assert sorted(d["required"]) == sorted(d["properties"]), name  # every field required


def _readme_snapshot_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme[readme.index("## Snapshot JSON"):readme.index("## Architecture")]


def _quoted(text: str) -> set[str]:
    return set(re.findall(r'"(\w+)"', text))


def _ticked(text: str) -> set[str]:
    return set(re.findall(r"`(\w+)`", text))


def test_readme_field_lists_match_the_schema() -> None:
    """The README documents the layout; the schema enforces it: they must name the same fields."""
    section = _readme_snapshot_section()
    block = re.search(r"```\n(.*?)\n```", section, re.S).group(1)  # type: ignore[union-attr]
    top, rest = block.split('"jobs": [{', 1)
    conventions = re.search(r'"conventions": \{(.*?)\}', top).group(1)  # type: ignore[union-attr]
    job_part, rank_part = rest.split('"ranks": [{', 1)
    flop_text = section[section.index("FLOP fields (per rank"):section.index("Hints:")]
    hint_text = section[section.index("Hints:"):section.index("Every field is always")]
    schema = json_schema()
    defs = schema["$defs"]
    flop_fields = set(defs["flops"]["properties"])
    assert _ticked(flop_text) == flop_fields
    assert _quoted(top.replace(conventions, "")) | {"jobs"} == set(schema["properties"])
    assert _quoted(conventions) == set(schema["properties"]["conventions"]["properties"])
    assert _quoted(job_part) | {"ranks"} == set(defs["job"]["properties"])
    assert _quoted(rank_part) == set(defs["rank"]["properties"])
    assert _ticked(hint_text) == set(defs["hint"]["properties"])
    assert "<FLOP fields>" in job_part and "<FLOP fields>" in rank_part


def test_schema_is_shipped_as_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'flowtop = \[[^\]]*"schema/\*\.json"', pyproject)
    assert re.search(r'dev = \[[^\]]*"jsonschema', pyproject)
    assert (ROOT / "flowtop" / "schema" / "snapshot.schema.json").is_file()
    assert json_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_a_bounded_backward_travels_as_model_note() -> None:
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.wire import flops_report

    note = "backward bounded at 2x the forward: recompute inside a compiled backward (18.0% ...)"
    base = {"step": 2, "model_flops": 3e9, "executed_flops": 3.6e9, "attention": "full", "dtype": "fp32",
            "peak_flops": 1e12, "peak_source": "test", "uncounted": {}, "tokens": 1000}
    bounded = rank_flops(flops_report({**base, "model_note": note}), 0.1)
    plain = rank_flops(flops_report(base), 0.1)
    assert bounded is not None and plain is not None
    assert (bounded.model_note, plain.model_note) == (note, "")
    assert job_flops([bounded, plain]).model_note == note  # the job says one of its ranks is bounded
