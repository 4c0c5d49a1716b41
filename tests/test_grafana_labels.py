"""contrib/grafana/flowtop.json against the series as Prometheus stores them.

Prometheus sets its scrape config's ``job`` and ``instance`` on every series it scrapes and, with
``honor_labels: false`` (the default), renames an exported label of either name to
``exported_job``/``exported_instance``. A dashboard that picks training jobs by ``job`` then
lists the scrape job ("flowtop") as the one training job, and ``avg by (job)`` merges every
training into one line (seen on a real Prometheus 2.42 scraping ``flowtop serve``). Here a real
scrape of two training jobs is relabelled the way Prometheus does it, and every panel's
selectors, groupings and legends are evaluated on it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.export.exporter import ExportPolicy
from flowtop.export.metrics_http import HostPort, MetricsServer
from flowtop.monitor.snapshot import MonitorSnapshot
from synthetic.cluster import cluster_job
from test_grafana import DASHBOARD, metric_names
from test_prometheus import http_get

#: The target labels of a scrape config ``job_name: flowtop``.
TARGET = {"job": "flowtop", "instance": "127.0.0.1:9759"}
JOBS = ("llm-a", "llm-b")
#: Metrics the synthetic snapshot has no sample of (no kernel window was taken).
NO_SAMPLES = {"flowtop_rank_device_busy_ratio"}
SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:\\.|[^"\\])*)"')


def stored_series() -> dict[str, list[dict[str, str]]]:
    """Metric name -> label sets as Prometheus stores a scrape of two jobs (the second above
    the rank cap: per-node series) from a real MetricsServer."""
    jobs = (cluster_job(16, job=JOBS[0]), cluster_job(24, job=JOBS[1]))
    snap = MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", jobs=jobs, received=10, rejected=0)
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: snap, ExportPolicy(max_ranks=20))
    where = server.start()
    try:
        text = http_get(where.url())
    finally:
        server.stop()
    out: dict[str, list[dict[str, str]]] = {}
    for fam in parse_text(text):
        for s in fam.samples:
            labels = {f"exported_{k}" if k in TARGET else k: v for k, v in s.labels.items()}
            out.setdefault(s.name, []).append({**labels, **TARGET})
    return out


def variables(dash: dict[str, Any], series: dict[str, list[dict[str, str]]]) -> dict[str, list[str]]:
    """Each query variable's values: ``label_values(METRIC, LABEL)`` over the stored series."""
    out = {}
    for var in dash["templating"]["list"]:
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query).groups()
        out[var["name"]] = sorted({s[label] for s in series.get(metric, []) if label in s})
    return out


def matches(labels: dict[str, str], matchers: str) -> bool:
    for name, op, value in MATCHER.findall(matchers):
        have = labels.get(name, "")
        hit = re.fullmatch(value, have) is not None if "~" in op else have == value
        if hit == op.startswith("!"):
            return False
    return True


def test_the_job_variable_lists_the_training_jobs_not_the_scrape_job() -> None:
    dash = json.loads(DASHBOARD.read_text())
    values = variables(dash, stored_series())
    assert list(JOBS) in values.values(), values


def test_every_selector_grouping_and_legend_sees_the_training_jobs() -> None:
    dash = json.loads(DASHBOARD.read_text())
    series = stored_series()
    values = variables(dash, series)
    problems = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, vals in values.items():  # Grafana's multi-value "All": an alternation
                expr = expr.replace("$" + name, "|".join(re.escape(v) for v in vals))
            selected: list[dict[str, str]] = []
            for metric, matchers in SELECTOR.findall(expr):
                got = [s for s in series.get(metric, []) if matches(s, matchers)]
                if not got and metric not in NO_SAMPLES:
                    problems.append(f"{panel['title']}: {metric}{{{matchers}}} selects nothing")
                selected += got
            for metric in metric_names(expr) - {m for m, _ in SELECTOR.findall(expr)}:
                selected += series.get(metric, [])
            grouping = re.search(r"\bby\s*\(([^)]*)\)", expr)
            have = ({g.strip() for g in grouping.group(1).split(",")} if grouping
                    else set().union(*selected) if selected else set())
            if grouping:
                missing = have - set().union(*selected) if selected else set()
                problems += [f"{panel['title']}: by ({m}) is no label of {expr}" for m in missing]
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                if selected and label not in have:
                    problems.append(f"{panel['title']}: legend {{{{{label}}}}} is no label of {expr}")
            # Vector matching: on (...) labels on both sides, group_left (...) labels on the right
            # (the info side), whose series must be one per matched label set (else PromQL refuses
            # the query: many-to-many).
            on = re.search(r"\bon\s*\(([^)]*)\)\s*group_left\s*\(([^)]*)\)", expr)
            if on:
                keys = [k.strip() for k in on.group(1).split(",")]
                extra = {k.strip() for k in on.group(2).split(",")}
                sides = [[s for s in series.get(m, []) if matches(s, ms)] for m, ms in SELECTOR.findall(expr)]
                if len(sides) != 2:
                    problems.append(f"{panel['title']}: {expr}: a one-to-one match of two selectors expected")
                else:
                    left, right = sides
                    problems += [f"{panel['title']}: on ({k}) is no label of a side of {expr}" for k in keys
                                 for side in (left, right) if side and any(k not in s for s in side)]
                    problems += [f"{panel['title']}: group_left ({k}) is no label of the right of {expr}"
                                 for k in sorted(extra) if right and any(k not in s for s in right)]
                    matched = [tuple(s.get(k) for k in keys) for s in right]
                    if len(matched) != len(set(matched)):
                        problems.append(f"{panel['title']}: {expr}: many series on the right per ({', '.join(keys)})")
                    unmatched = {tuple(s.get(k) for k in keys) for s in left} - set(matched)
                    problems += [f"{panel['title']}: {expr}: nothing on the right for {u}" for u in sorted(unmatched)]
            # Training jobs told apart: series of both jobs never collapse onto the scrape's job.
            if grouping and selected and "job" in have and not ({"train_job", "exported_job"} & have):
                problems.append(f"{panel['title']}: {expr} groups by the scrape job")
    assert not problems, "\n".join(problems)


def test_a_heat_map_holds_one_job() -> None:
    """A heat map row is a rank (a node): two jobs' rank 0 would share a row, so the panel repeats
    per selected job."""
    dash = json.loads(DASHBOARD.read_text())
    job_var = next(v["name"] for v in dash["templating"]["list"] if v.get("type") == "query")
    maps = [p for p in dash["panels"] if p["type"] == "heatmap"]
    assert maps
    for p in maps:
        assert p.get("repeat") == job_var, p["title"]
        assert all(f"${job_var}" in t["expr"] for t in p["targets"]), p["title"]
