"""contrib/grafana/flowtop.json: every metric its PromQL names is one a real exporter writes (with
samples), scraped over HTTP from real publishers; the panels the README promises are there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.export.exporter import ExportPolicy
from flowtop.export.metrics_http import HostPort, MetricsServer
from test_prometheus import MODEL_FLOPS, PEAK, WALL_S, _start, http_get, made  # noqa: F401  (made: the fixture)

DASHBOARD = Path(__file__).resolve().parent.parent / "contrib" / "grafana" / "flowtop.json"
#: Needs a kernel window (a profiled step): the scrape must declare it, samples come with windows.
NEEDS_A_WINDOW = {"flowtop_rank_device_busy_ratio"}
#: PromQL words that are not metric names.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def expressions(dash: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and the template queries."""
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield t["expr"]
            yield from walk(p.get("panels", []))

    yield from walk(dash["panels"])
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if var.get("type") == "query":
            text = query["query"] if isinstance(query, dict) else query
            yield re.sub(r"label_values\((\w+),\s*\w+\)", r"\1", text)


def metric_names(expr: str) -> set[str]:
    """Metric names in one PromQL expression (strings, label matchers, ranges, grouping
    clauses, functions and keywords taken out)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        after = text[m.end():].lstrip()
        if word in KEYWORDS or after.startswith("(") or word.startswith("$"):
            continue
        names.add(word)
    return names


def test_metric_names_in_a_promql_expression() -> None:
    assert metric_names('avg by (job) (flowtop_rank_mfu_ratio{job=~"$job"})') == {"flowtop_rank_mfu_ratio"}
    assert metric_names("rate(flowtop_monitor_frames_rejected_total[$__rate_interval])") == {
        "flowtop_monitor_frames_rejected_total"}
    assert metric_names('topk(10, a_b{x="y"}) / on (job) c') == {"a_b", "c"}


def test_every_dashboard_metric_is_exported(made: list[Any]) -> None:  # noqa: F811
    dash = json.loads(DASHBOARD.read_text())
    used: dict[str, str] = {}
    for expr in expressions(dash):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for n in names:
            used.setdefault(n, expr)
    # A real exporter: one job on two nodes, scraped per rank and (cap 1) per node.
    layout = [("node-a", 0), ("node-b", 0)]
    mon, _ = _start(made, ExportPolicy(), layout, job="dash", wait_s=0.01)
    mon.wait(lambda s: s["jobs"] and all(r["mfu"] and r["telemetry"] for r in s["jobs"][0]["ranks"])
             and len(s["jobs"][0]["ranks"]) == 2 and any(not h["ended"] for h in s["jobs"][0]["hints"]))
    nodes = MetricsServer(HostPort("127.0.0.1", 0), lambda: mon.data.latest, ExportPolicy(max_ranks=1))
    where = nodes.start()
    try:
        import time

        scrapes = [mon.scrape()]
        # The monitor's CPU and frame rates need two readings of two snapshots: a fixed 0.6 s
        # missed the frame rate when a loaded box's tick came late (seen once in a full run).
        deadline = time.monotonic() + 10
        while True:
            time.sleep(0.3)
            scrapes.append(mon.scrape())
            if "\nflowtop_monitor_frames_per_second " in scrapes[-1] or time.monotonic() > deadline:
                break
        scrapes.append(http_get(where.url()))
    finally:
        nodes.stop()
    exported = {s.name for text in scrapes for fam in parse_text(text) for s in fam.samples}
    declared = {f.name for f in parse_text(scrapes[0])}
    exported |= NEEDS_A_WINDOW & declared
    missing = {n: e for n, e in used.items() if n not in exported}
    assert not missing, f"the dashboard queries metrics no scrape has: {missing}"
    # What the README promises of the dashboard.
    titles = " | ".join(p["title"] for p in dash["panels"])
    for want in ("Job MFU", "Peak source", "Job FLOP/s", "heat map", "percentiles", "hints"):
        assert want.lower() in titles.lower(), want


def test_the_peak_source_panel_shows_each_jobs_mfu_with_its_peaks_source_and_dtype(made: list[Any]) -> None:  # noqa: F811
    """The MFU alone does not say what it is a fraction of (a datasheet's peak, a CPU estimate, an
    override): a table beside Job MFU joins flowtop_job_peak_info's source and dtype onto each job's
    MFU. Its one query, evaluated on a real scrape (one target: the match labels job and instance
    are Prometheus' and the same on every series), gives one row per job with the hand-counted MFU."""
    dash = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dash["panels"] if any("flowtop_job_peak_info" in t["expr"] for t in p.get("targets", []))]
    mfu_panel = next(p for p in dash["panels"] if p["title"] == "Job MFU")
    assert panel["type"] == "table" and panel["datasource"] == mfu_panel["datasource"]
    assert panel["gridPos"]["y"] == mfu_panel["gridPos"]["y"]  # on its row, right of it
    assert panel["gridPos"]["x"] == mfu_panel["gridPos"]["x"] + mfu_panel["gridPos"]["w"]
    (target,) = panel["targets"]
    assert target["instant"] and target["format"] == "table" and target["datasource"] == mfu_panel["datasource"]
    match = re.fullmatch(r'(\w+)\{train_job=~"\$train_job"\} \* on \(job, instance, train_job\) '
                         r'group_left \(source, dtype\) (\w+)\{train_job=~"\$train_job"\}', target["expr"])
    assert match and match.groups() == ("flowtop_job_mfu_ratio", "flowtop_job_peak_info"), target["expr"]
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0), ("node-b", 0)], job="peaky")
    mon.wait(lambda s: bool(s["jobs"]) and len(s["jobs"][0]["ranks"]) == 2 and bool(s["jobs"][0]["mfu"]))
    text, _ = mon.moment()
    got = [s for fam in parse_text(text) for s in fam.samples]
    mfu = {s.labels["train_job"]: s.value for s in got if s.name == "flowtop_job_mfu_ratio"}
    info = [s.labels for s in got if s.name == "flowtop_job_peak_info"]
    rows = {(i["train_job"], i["source"], i["dtype"]): mfu[i["train_job"]] for i in info if i["train_job"] in mfu}
    # The test publishers say dtype fp32 and no peak kind (a probe before wire 1.4: unknown); each
    # rank 2e9 FLOPs per 0.05 s step against 1e12 FLOP/s: MFU 0.04, the job's the same.
    assert list(rows) == [("peaky", "unknown", "fp32")]
    assert rows[("peaky", "unknown", "fp32")] == pytest.approx(0.04, rel=0.01)
    assert MODEL_FLOPS / WALL_S / PEAK == pytest.approx(0.04)
