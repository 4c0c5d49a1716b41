"""A snapshot served after a pause of the monitor says how old it really is.

The monitor clock (``taken_at``) leaves the monitor's own pauses out (flowtop.monitor.clock). A
scrape that came while the monitor was stopped (SIGSTOP) is answered as soon as it runs again, by
the HTTP thread, before the data thread's next tick rebuilds the snapshot: it got the snapshot from
before the pause, with nothing to tell it from a fresh one (a trial saw that for ~2 s). Each snapshot
now carries ``built_at`` on the process's own clock, and the endpoint serves its real age:
``flowtop_monitor_snapshot_age_seconds``, ``served_age_s`` in /snapshot.json and an HTTP ``Age``
header. Over real HTTP, the process's clock injected (a pause is that clock moving on while the
snapshot stays the same)."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flowtop.export.metrics_http import HostPort, MetricsServer
from snapshot_schema import assert_valid_snapshot
from synthetic.cluster import cluster_snapshot


def _get(url: str) -> tuple[bytes, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read(), dict(resp.headers)


def _age(text: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "flowtop_monitor_snapshot_age_seconds")


def test_a_snapshot_served_after_a_monitor_pause_says_its_age() -> None:
    now = [1000.2]
    current: dict[str, Any] = {"snap": replace(cluster_snapshot(0, n_ranks=8), built_at=1000.0)}
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: current["snap"], clock=lambda: now[0])
    where = server.start()
    try:
        body, headers = _get(where.url())
        assert abs(_age(body.decode()) - 0.2) < 1e-6
        body, headers = _get(where.url("/snapshot.json"))
        assert abs(json.loads(body)["served_age_s"] - 0.2) < 1e-6 and headers["Age"] == "0"
        now[0] += 30.0  # the monitor was stopped for 30 s: the same snapshot is served on resume
        body, _ = _get(where.url())  # the cached rendering of the snapshot, its age fresh
        assert abs(_age(body.decode()) - 30.2) < 1e-6
        body, headers = _get(where.url("/snapshot.json"))
        doc = json.loads(body)
        assert abs(doc["served_age_s"] - 30.2) < 1e-6 and headers["Age"] == "30"
        assert int(headers["Content-Length"]) == len(body)
        assert_valid_snapshot(doc)
        # The next tick's snapshot, built after the pause: young again.
        current["snap"] = replace(cluster_snapshot(1, n_ranks=8), built_at=now[0] - 0.1)
        body, _ = _get(where.url())
        assert abs(_age(body.decode()) - 0.1) < 1e-6
    finally:
        server.stop()
