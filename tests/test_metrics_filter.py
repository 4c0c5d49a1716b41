"""``/metrics?name[]=...``: prometheus_client's series filter (``restricted_registry``) on the real
endpoint. The filter asks only the collectors whose ``describe()`` named a series at registration;
flowtop's collectors described nothing, so ``name[]=flowtop_job_mfu_ratio`` answered an empty body.
Scraped over real HTTP from a real monitor (collector, model, data thread) fed by real publishers,
and each filtered scrape compared with an unfiltered one of the same snapshot."""

from __future__ import annotations

import itertools
import time
import urllib.request
from typing import Any, Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.export.exporter import ExportPolicy, LoadCollector, SnapshotCollector
from flowtop.export.families import SNAPSHOT_FAMILIES, Families
from flowtop.export.metrics_http import HostPort, MetricsServer
from flowtop.monitor.selfload import LoadMeter
from flowtop.monitor.snapshot import MonitorSnapshot, RelaySnapshot
from synthetic.cluster import cluster_job
from test_prometheus import MODEL_FLOPS, PEAK, WALL_S, _start, made  # noqa: F401  (made: the fixture)

CLOCK = "flowtop_monitor_snapshot_clock_seconds"
#: Read at scrape time (the process, the monitor's own load): two scrapes never agree on the value.
FRESH = ("process_", "flowtop_monitor_cpu_cores", "flowtop_monitor_frames_per_second",
         "flowtop_monitor_snapshot_age_seconds")
#: By hand: each rank counts 2e9 model FLOPs per 0.05 s step against a 1e12 FLOP/s peak, so
#: 4e10 FLOP/s, MFU 0.04; the job sums two such ranks over two peaks: 8e10 / 2e12, 0.04 too.
MFU = 0.04

Sample = tuple[str, tuple[tuple[str, str], ...], float]


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    """(status, Content-Type, body) of a GET."""
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.headers["Content-Type"], resp.read().decode()


def query(*names: str) -> str:
    return "?" + "&".join(f"name[]={n}" for n in names)


def samples(text: str) -> set[Sample]:
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in parse_text(text) for s in f.samples}


def clock(text: str) -> float | None:
    return next((value for name, _, value in samples(text) if name == CLOCK), None)


def same_snapshot(url: str, *names: str, timeout: float = 20.0) -> tuple[str, str]:
    """An unfiltered and a filtered scrape of one snapshot: the filtered one taken between two
    unfiltered scrapes that show the same snapshot clock (snapshots only move forward, so it
    read that snapshot too)."""
    deadline = time.monotonic() + timeout
    while True:
        before = get(url)[2]
        filtered = get(url + query(*names))[2]
        after = get(url)[2]
        if clock(before) is not None and clock(before) == clock(after):
            return before, filtered
        assert time.monotonic() < deadline, "no two scrapes of one snapshot"


def each_of_one_snapshot(url: str, names: list[str], timeout: float = 20.0) -> Iterator[tuple[str, set[Sample], str]]:
    """(name, the unfiltered scrape's samples, the scrape filtered to the name) of one snapshot
    for each name, as :func:`same_snapshot` takes them, one name after another: the unfiltered
    scrape after a name's filtered one is the one before the next name's (a scrape fewer, and one
    parse of it instead of four, per name)."""
    def scrape() -> tuple[set[Sample], float | None]:
        got = samples(get(url)[2])
        return got, next((value for name, _, value in got if name == CLOCK), None)

    before = scrape()
    for name in names:
        deadline = time.monotonic() + timeout
        while True:
            filtered = get(url + query(name))[2]
            after = scrape()
            if before[1] is not None and before[1] == after[1]:
                break
            before = after
            assert time.monotonic() < deadline, "no two scrapes of one snapshot"
        yield name, before[0], filtered
        before = after


@pytest.fixture
def endpoint(made: list[Any]) -> Iterator[str]:  # noqa: F811
    """/metrics of a real monitor that holds one job of two ranks with FLOP counts."""
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0), ("node-a", 1)], job="job-a")
    mon.wait(lambda s: bool(s["jobs"]) and len(s["jobs"][0]["ranks"]) == 2
             and all(r["mfu"] for r in s["jobs"][0]["ranks"]) and s["jobs"][0]["mfu"])
    yield mon.where.url()


def test_one_family_is_exactly_its_series_with_the_unfiltered_values(endpoint: str) -> None:
    full, filtered = same_snapshot(endpoint, "flowtop_job_mfu_ratio")
    assert [f.name for f in parse_text(filtered)] == ["flowtop_job_mfu_ratio"]
    got = samples(filtered)
    assert got == {s for s in samples(full) if s[0] == "flowtop_job_mfu_ratio"}
    ((name, labels, value),) = got
    assert dict(labels) == {"train_job": "job-a"}
    assert value == pytest.approx(MFU, rel=0.01)
    assert MFU == pytest.approx(MODEL_FLOPS / WALL_S / PEAK)  # the hand figure's inputs are the publishers'


def test_two_names_give_both_families_and_nothing_else(endpoint: str) -> None:
    """The pair a dashboard shows side by side: the MFU and what it is a fraction of."""
    full, filtered = same_snapshot(endpoint, "flowtop_job_mfu_ratio", "flowtop_job_peak_info")
    assert sorted(f.name for f in parse_text(filtered)) == ["flowtop_job_mfu_ratio", "flowtop_job_peak_info"]
    wanted = {"flowtop_job_mfu_ratio", "flowtop_job_peak_info"}
    assert samples(filtered) == {s for s in samples(full) if s[0] in wanted}
    (peak,) = [dict(labels) for name, labels, _ in samples(filtered) if name == "flowtop_job_peak_info"]
    # The test publishers send dtype fp32 and no peak_kind (as a probe before wire 1.4): unknown.
    assert peak == {"train_job": "job-a", "source": "unknown", "dtype": "fp32"}


def test_an_unknown_name_is_an_empty_answer(endpoint: str) -> None:
    status, content_type, body = get(endpoint + query("flowtop_no_such_metric"))
    assert (status, body) == (200, "")
    assert content_type.startswith("text/plain")
    # A family's name without its unit suffix is no series name either (samples are matched by name).
    assert get(endpoint + query("flowtop_job_mfu"))[2] == ""
    status, _, body = get(endpoint + query("flowtop_no_such_metric"), "application/openmetrics-text; version=1.0.0")
    assert (status, body) == (200, "# EOF\n")


def test_every_series_name_of_a_scrape_passes_its_own_filter(made: list[Any]) -> None:  # noqa: F811
    """Per-rank and (cap 1) per-node series of a real monitor: each sample name of the unfiltered
    scrape, asked for alone, gives the same samples (fresh ones: the same label sets)."""
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0), ("node-b", 0)], job="job-f", wait_s=0.01)
    mon.wait(lambda s: bool(s["jobs"]) and len(s["jobs"][0]["ranks"]) == 2
             and all(r["mfu"] and r["telemetry"] for r in s["jobs"][0]["ranks"]))
    nodes = MetricsServer(HostPort("127.0.0.1", 0), lambda: mon.data.latest, ExportPolicy(max_ranks=1))
    url = nodes.start().url()
    try:
        checked = set()
        for where in (mon.where.url(), url):
            names = sorted({name for name, _, _ in samples(get(where)[2])})
            assert "flowtop_rank_mfu_ratio" in names or "flowtop_node_mfu_min_ratio" in names
            for name, full_samples, filtered in each_of_one_snapshot(where, names):
                want = {s for s in full_samples if s[0] == name}
                got = samples(filtered)
                if name.startswith(FRESH):
                    assert {s[:2] for s in got} == {s[:2] for s in want}, name
                else:
                    assert got == want, name
                checked.add(name)
    finally:
        nodes.stop()
    assert {"flowtop_rank_mfu_ratio", "flowtop_node_mfu_min_ratio", "flowtop_job_status", "flowtop_job_peak_info",
            "flowtop_rank_lost_messages_total", "process_cpu_seconds_total"} <= checked


def _rich_snapshot() -> MonitorSnapshot:
    """Every kind of series: a job under the cap of 20 (per rank), one above (per node), hints, a relay."""
    relay = RelaySnapshot(relay="node-r:12:ab", host="node-r", pid=12, status="live", age_s=0.5, listen="ipc://x",
                          upstream="tcp://m:1", hosted_by="flowtop relay", ranks_connected=2, ranks=2,
                          frames_in=10, frames_out=9, bytes_in=100, bytes_out=90, drops=1, queued=0, commands=3,
                          commands_dropped=1, link_ups=1, uptime_s=5.0, batches=4, link_lag_s=0.25)
    return MonitorSnapshot(taken_at=5000.0, listen="tcp://127.0.0.1:5759", received=10, rejected=2,
                           jobs=(cluster_job(16, job="small"), cluster_job(24, job="big")), relays=(relay,))


def _meter() -> LoadMeter:
    """A meter with a first reading behind it, so the CPU and frame rates have samples."""
    ticks = itertools.count()
    meter = LoadMeter(wall=lambda: float(next(ticks)), cpu=lambda: 0.25 * next(ticks))
    meter.read(4999.0, 0)
    return meter


def _shape(metrics: Any) -> list[tuple[str, str, str]]:
    return [(m.name, m.type, m.unit) for m in metrics]


@pytest.mark.parametrize("which", ["snapshot", "snapshot+load", "load"])
def test_each_collector_yields_exactly_the_families_it_describes(which: str) -> None:
    """A family yielded but not described would be invisible to name[]: the two lists must be the
    same families, in the same order, with samples in every one that can have them here."""
    snap = _rich_snapshot()
    collector: Any
    if which == "load":
        collector = LoadCollector(lambda: snap, _meter())
    else:
        collector = SnapshotCollector(lambda: snap, ExportPolicy(max_ranks=20),
                                      meter=_meter() if which == "snapshot+load" else None)
    yielded = list(collector.collect())
    assert _shape(yielded) == _shape(collector.describe())
    assert all(not m.samples for m in collector.describe())  # describe() reads no snapshot
    empty = {m.name for m in yielded if not m.samples}
    # Only the kernel window's share has no sample: the synthetic ranks took no kernel window.
    assert empty == ({"flowtop_rank_device_busy_ratio"} if which != "load" else set())
    # And the registry, told by describe(), lets every yielded series through its filter.
    # (The filter of a name is asked once, for all its samples: one collect per sample was ~10 s.)
    registry = CollectorRegistry()
    registry.register(collector)
    passed: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for m in yielded:
        for s in m.samples:
            if s.name not in passed:
                passed[s.name] = [(t.name, t.labels) for r in registry.restricted_registry([s.name]).collect()
                                  for t in r.samples]
            assert (s.name, s.labels) in passed[s.name], s.name  # values aside: the load is read again


def test_a_family_nobody_declared_cannot_be_filled() -> None:
    fam = Families(SNAPSHOT_FAMILIES)
    with pytest.raises(KeyError):
        fam.gauge("flowtop_job_undeclared")
    with pytest.raises(TypeError):
        fam.counter("flowtop_job_mfu_ratio")  # declared a gauge
