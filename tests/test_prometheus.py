"""The Prometheus exporter over real HTTP: a real collector on the data thread, fed by real probe
publishers (ZeroMQ), scraped at /metrics and parsed with prometheus_client's parsers; the values
must be the snapshot's own (read from /snapshot.json of the same moment)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from flowtop.monitor.collector import Collector
from flowtop.monitor.datathread import DataThread
from flowtop.tools.demo.launch import free_port_pair
from flowtop.export.exporter import ExportPolicy
from flowtop.export.metrics_http import HostPort, MetricsServer
from flowtop.monitor.wiring import make_model
from probe.transport.publisher import Publisher
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot

WALL_S = 0.05
TOKENS = 512
MODEL_FLOPS = 2e9  # per counted step
PEAK = 1e12


def http_get(url: str, accept: str | None = None) -> str:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read().decode()


def samples(text: str) -> list[Any]:
    """Every sample of a Prometheus text scrape."""
    return [s for fam in parse_text(text) for s in fam.samples]


def by_name(text: str, name: str) -> list[Any]:
    return [s for s in samples(text) if s.name == name]


class Monitor:
    """A real collector on a DataThread plus the metrics endpoint on a free port."""

    def __init__(self, policy: ExportPolicy) -> None:
        self.listen = f"tcp://127.0.0.1:{free_port_pair()}"
        self.data = DataThread(Collector(make_model(), self.listen), cadence_s=0.1)
        self.data.start().result(10)
        self.metrics = MetricsServer(HostPort("127.0.0.1", 0), lambda: self.data.latest, policy)
        self.where = self.metrics.start()

    def scrape(self, accept: str | None = None) -> str:
        return http_get(self.where.url(), accept)

    def snapshot(self) -> dict[str, Any] | None:
        """/snapshot.json (None before the first snapshot: 503)."""
        try:
            return json.loads(http_get(self.where.url("/snapshot.json")))
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return None
            raise

    def moment(self, timeout: float = 10.0) -> tuple[str, dict[str, Any]]:
        """A scrape and the snapshot JSON it was made from (same ``taken_at``)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.scrape()
            snap = self.snapshot()
            clock = by_name(text, "flowtop_monitor_snapshot_clock_seconds")
            if snap is not None and clock and clock[0].value == snap["taken_at"]:
                return text, snap
            assert time.monotonic() < deadline, "no scrape matched a snapshot"

    def wait(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            if snap is not None and pred(snap):
                return snap
            assert time.monotonic() < deadline, f"condition not reached: {json.dumps(snap)[:2000]}"
            time.sleep(0.1)

    def close(self) -> None:
        self.metrics.stop()
        self.data.stop()


def publisher(addr: str, key: RankKey, world: int, local_rank: int) -> Publisher:
    pub = Publisher(key, addr, flush_s=0.02)
    pub.hello_fields = {"local_rank": local_rank, "world_size": world, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    deadline = time.monotonic() + 10
    while pub.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pub.subscribers, "the monitor never subscribed"
    return pub


def train(pub: Publisher, steps: int, wait_s: float = 0.0) -> None:
    for step in range(1, steps + 1):
        pub.publish("step", {"step": step, "wall_s": WALL_S, "tokens": TOKENS, "drops": 0,
                             "input_wait_s": wait_s})
    pub.publish("flops", {"step": 2, "model_flops": MODEL_FLOPS, "executed_flops": 1.25 * MODEL_FLOPS,
                          "attention": "full", "dtype": "fp32", "peak_flops": PEAK, "peak_source": "test",
                          "uncounted": {}, "tokens": TOKENS})
    pub.publish("telemetry", {"gpu": {"gpu_util": 87.0, "tensor_active": 41.0}, "proc": {}})


@pytest.fixture
def made() -> Iterator[list[Any]]:
    things: list[Any] = []
    yield things
    for t in reversed(things):
        t.close()


def _start(made: list[Any], policy: ExportPolicy, layout: list[tuple[str, int]], job: str = "job-a",
           steps: int = 30, wait_s: float = 0.0) -> tuple[Monitor, list[Publisher]]:
    mon = Monitor(policy)
    made.append(mon)
    pubs = []
    for rank, (host, local) in enumerate(layout):
        pub = publisher(mon.listen, RankKey(job, host, 1000 + rank, rank, 0), len(layout), local)
        made.append(pub)
        pubs.append(pub)
        train(pub, steps, wait_s)
    return mon, pubs


def test_scrape_equals_the_snapshot(made: list[Any]) -> None:
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0), ("node-a", 1)], wait_s=0.01)
    mon.wait(lambda s: s["jobs"] and all(r["mfu"] and r["telemetry"] for r in s["jobs"][0]["ranks"])
             and len(s["jobs"][0]["ranks"]) == 2 and any(h["id"] == "input_wait" for h in s["jobs"][0]["hints"]))
    text, snap = mon.moment()
    assert_valid_snapshot(snap)
    job = snap["jobs"][0]
    ranks = {str(r["rank"]): r for r in job["ranks"]}
    fields = {
        "flowtop_rank_model_flops_per_second": "flops_per_s", "flowtop_rank_executed_flops_per_second":
        "executed_flops_per_s", "flowtop_rank_mfu_ratio": "mfu", "flowtop_rank_hfu_ratio": "hfu",
        "flowtop_rank_peak_flops_per_second": "peak_flops", "flowtop_rank_step_seconds": "step_time_s",
        "flowtop_rank_tokens_per_second": "tokens_per_s", "flowtop_rank_input_wait_ratio": "input_wait_frac",
        "flowtop_rank_step_index": "step", "flowtop_rank_lost_messages_total": "lost_messages",
        "flowtop_rank_dropped_messages_total": "dropped_messages", "flowtop_rank_last_seen_seconds": "age_s",
    }
    for name, field in fields.items():
        got = by_name(text, name)
        assert {s.labels["rank"] for s in got} == set(ranks), name
        for s in got:
            r = ranks[s.labels["rank"]]
            assert s.labels == {"train_job": "job-a", "rank": str(r["rank"]), "host": "node-a",
                                "local_rank": str(r["local_rank"]), "relay": ""}
            assert s.value == pytest.approx(r[field], rel=1e-12), (name, r[field])
    # The figures are the hand count: FLOPs per token x tokens/s, over the peak.
    for r in ranks.values():
        assert r["mfu"] == pytest.approx(MODEL_FLOPS / WALL_S / PEAK, rel=0.01)
    status = by_name(text, "flowtop_rank_status")
    assert {(s.labels["rank"], s.labels["flowtop_rank_status"]) for s in status if s.value == 1} == {
        (k, r["status"]) for k, r in ranks.items()}
    assert len(status) == 7 * len(ranks)  # one sample per state (live, stalled, stale, done, failed, stopped, unheard)
    job_fields = {"flowtop_job_mfu_ratio": "mfu", "flowtop_job_model_flops_per_second": "flops_per_s",
                  "flowtop_job_step_seconds": "step_time_s", "flowtop_job_tokens_per_second": "tokens_per_s",
                  "flowtop_job_world_size": "world_size", "flowtop_job_peak_flops_per_second": "peak_flops"}
    for name, field in job_fields.items():
        (s,) = by_name(text, name)
        assert s.labels == {"train_job": "job-a"} and s.value == pytest.approx(job[field], rel=1e-12), name
    # NVML and GPM report percent: exported as ratios.
    for name, key in (("flowtop_rank_gpu_utilization_ratio", "gpu_util"), ("flowtop_rank_tensor_active_ratio",
                                                                           "tensor_active")):
        got = by_name(text, name)
        assert len(got) == 2 and all(s.value == ranks[s.labels["rank"]]["telemetry"]["device"][key] / 100 for s in got)
        assert {s.value for s in got} == {0.87 if key == "gpu_util" else 0.41}
    active = {(h["id"], h["severity"]) for h in job["hints"] if not h["ended"]}
    assert ("input_wait", "warning") in active  # 20 % of each step waiting for input
    assert {(s.labels["id"], s.labels["severity"]) for s in by_name(text, "flowtop_job_hints")} == active
    (received,) = by_name(text, "flowtop_monitor_frames_received_total")
    assert received.value == snap["received"]
    # No label carries a step, a pid or another unbounded value.
    allowed = {"train_job", "rank", "host", "local_rank", "relay", "rank_quantile", "status", "id", "severity",
               "listen", "version", "flowtop_rank_status", "flowtop_job_status",
               "source", "dtype"}  # the job peak's: one word of five, the dtype's name
    for s in samples(text):
        assert set(s.labels) <= allowed, s
    # pids (1000 here) are not exported: in no label value (sample values such as the monitor's
    # clock may contain the digits by chance)
    assert all("1000" not in v for smp in samples(text) for v in smp.labels.values())


def test_openmetrics_units_and_process_cpu(made: list[Any]) -> None:
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0)])
    mon.wait(lambda s: bool(s["jobs"]))
    time.sleep(0.6)  # the CPU rate needs readings half a second apart
    mon.scrape()
    time.sleep(0.6)
    text = mon.scrape("application/openmetrics-text; version=1.0.0")
    assert text.rstrip().endswith("# EOF")
    fams = {f.name: f for f in parse_openmetrics(text)}
    for name, fam in fams.items():
        if not name.startswith("flowtop_"):
            continue
        if name.endswith("_seconds"):
            assert fam.unit == "seconds", name
        if name.endswith("_ratio"):
            assert fam.unit == "ratio", name
    assert fams["flowtop_rank_status"].type == "stateset"
    assert fams["flowtop_rank_lost_messages"].type == "counter"
    (cpu,) = fams["flowtop_monitor_cpu_cores"].samples
    assert 0 < cpu.value < 4  # this process's CPU per second (2 cores, a few threads)
    assert fams["process_cpu_seconds"].samples[0].value > 0


def test_jobs_above_the_cap_get_node_series(made: list[Any]) -> None:
    layout = [("node-a", 0), ("node-a", 1), ("node-a", 2), ("node-b", 0), ("node-b", 1)]
    mon, _ = _start(made, ExportPolicy(max_ranks=4), layout, job="big")
    mon.wait(lambda s: s["jobs"] and len(s["jobs"][0]["ranks"]) == 5 and all(r["mfu"] for r in s["jobs"][0]["ranks"]))
    text, snap = mon.moment()
    assert not [s for s in samples(text) if s.name.startswith("flowtop_rank_")]
    (series,) = by_name(text, "flowtop_job_rank_series")
    assert series.value == 0
    ranks = snap["jobs"][0]["ranks"]
    for host in ("node-a", "node-b"):
        mine = [r for r in ranks if r["host"] == host]
        labels = {"train_job": "big", "host": host}
        got = {s.name: s.value for s in samples(text) if s.name.startswith("flowtop_node_") and s.labels == labels}
        assert got["flowtop_node_ranks"] == len(mine)
        assert got["flowtop_node_model_flops_per_second"] == pytest.approx(sum(r["flops_per_s"] for r in mine))
        assert got["flowtop_node_tokens_per_second"] == pytest.approx(sum(r["tokens_per_s"] for r in mine))
        assert got["flowtop_node_mfu_min_ratio"] == pytest.approx(min(r["mfu"] for r in mine))
        assert got["flowtop_node_step_max_seconds"] == pytest.approx(max(r["step_time_s"] for r in mine))
    states = [s for s in by_name(text, "flowtop_node_status") if s.value == 1]
    assert {s.labels["host"]: s.labels["flowtop_node_status"] for s in states} == {"node-a": "live", "node-b": "live"}
    # Below the cap the same job has per-rank series.
    small = MetricsServer(HostPort("127.0.0.1", 0), lambda: mon.data.latest, ExportPolicy(max_ranks=5))
    where = small.start()
    try:
        assert {s.labels["rank"] for s in by_name(http_get(where.url()), "flowtop_rank_mfu_ratio")} == {
            "0", "1", "2", "3", "4"}
    finally:
        small.stop()


def test_a_finished_job_stops_its_series(made: list[Any]) -> None:
    mon, pubs = _start(made, ExportPolicy(linger_s=2.0), [("node-a", 0), ("node-a", 1)], job="ends")
    mon.wait(lambda s: s["jobs"] and len(s["jobs"][0]["ranks"]) == 2)
    assert by_name(mon.scrape(), "flowtop_rank_mfu_ratio") or by_name(mon.scrape(), "flowtop_rank_step_seconds")
    for p in pubs:  # the probe's last words: it sends nothing after its bye
        p.publish("bye", {"reason": "exit", "steps": 30, "drops": 0})
        p.close()
    mon.wait(lambda s: s["jobs"] and s["jobs"][0]["status"] == "done")
    done_at = time.monotonic()
    text = mon.scrape()
    # Within the linger the job is still there, as done.
    if time.monotonic() - done_at < 1.5:
        status = [s for s in by_name(text, "flowtop_job_status") if s.value == 1]
        assert [s.labels["flowtop_job_status"] for s in status] == ["done"]
    time.sleep(2.5)
    text = mon.scrape()
    assert not [s for s in samples(text) if s.labels.get("train_job") == "ends"]
    snap = json.loads(http_get(mon.where.url("/snapshot.json")))
    assert [j["job"] for j in snap["jobs"]] == ["ends"]  # the model still holds it; only its series ended
    (jobs,) = by_name(text, "flowtop_monitor_jobs")
    assert jobs.value == 0


def test_no_snapshot_yet_and_other_paths() -> None:
    metrics = MetricsServer(HostPort("127.0.0.1", 0), lambda: None)
    where = metrics.start()
    try:
        text = http_get(where.url())
        names = {f.name for f in parse_text(text)}
        assert "flowtop_rank_mfu_ratio" in names  # declared, no samples yet
        assert not by_name(text, "flowtop_rank_mfu_ratio")
        for path, code in (("/snapshot.json", 503), ("/nothing", 404)):
            with pytest.raises(urllib.error.HTTPError) as err:
                http_get(where.url(path))
            assert err.value.code == code
        # before the first tick: an object saying why, not null (a script's ["jobs"] raised a TypeError)
        with pytest.raises(urllib.error.HTTPError) as err:
            http_get(where.url("/snapshot.json"))
        answer = json.loads(err.value.read())
        assert answer == {"error": "no snapshot yet: the monitor has not taken its first one", "retry_after_s": 1}
        assert err.value.headers["Retry-After"] == "1"
        assert err.value.headers["Content-Type"] == "application/json"
    finally:
        metrics.stop()


def test_the_readme_lists_exactly_the_exported_metrics(made: list[Any]) -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Prometheus and Grafana", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `flowtop_")]
    listed = {name for line in rows for name in re.findall(r"`(flowtop_[a-z_]+)`", line.split(" | ")[0])}
    mon, _ = _start(made, ExportPolicy(), [("node-a", 0)])
    mon.wait(lambda s: bool(s["jobs"]))
    text = mon.scrape()
    exported = {n for n in re.findall(r"^# TYPE (\S+) ", text, re.M) if n.startswith("flowtop_")}
    assert listed == exported, (f"in the README only: {sorted(listed - exported)}; "
                                f"exported only: {sorted(exported - listed)}")


def test_ranks_behind_a_relay_carry_its_host_and_the_relay_its_series(made: list[Any]) -> None:
    import shutil
    import subprocess
    import sys
    import tempfile

    mon = Monitor(ExportPolicy())
    made.append(mon)
    d = tempfile.mkdtemp(prefix="ftx")  # ipc paths are short
    listen = f"ipc://{d}/relay.sock"
    relay = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "relay", "--listen", listen, "--connect",
                              mon.listen], stderr=subprocess.PIPE, text=True)
    try:
        pub = publisher(listen, RankKey("relayed", "node-r", 4242, 0, 0), 1, 0)
        made.append(pub)
        train(pub, 20)
        snap = mon.wait(lambda s: s["jobs"] and s["jobs"][0]["ranks"][0]["relay"] and s["relays"]
                        and s["relays"][0]["frames_in"], 30)
        text, snap = mon.moment()
        (rel,) = snap["relays"]
        (step,) = by_name(text, "flowtop_rank_step_seconds")
        assert step.labels["relay"] == rel["host"] and step.labels["host"] == "node-r"
        status = [s for s in by_name(text, "flowtop_relay_status") if s.value == 1]
        assert [(s.labels["relay"], s.labels["flowtop_relay_status"]) for s in status] == [(rel["host"], "live")]
        (frames,) = by_name(text, "flowtop_relay_frames_in_total")
        assert frames.value == rel["frames_in"] > 0
        (ranks,) = by_name(text, "flowtop_relay_ranks")
        assert ranks.value == rel["ranks"] == 1
    finally:
        relay.terminate()
        relay.wait(10)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.asyncio
async def test_top_serves_metrics_while_the_tui_runs(made: list[Any]) -> None:
    """flowtop top --prometheus: the UI takes the mailbox, the exporter still reads the newest
    snapshot the data thread published (DataThread.latest), a second reader."""
    import asyncio

    from flowtop.tui.app import FlowtopApp

    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    app = FlowtopApp(Collector(make_model(), listen))
    metrics = MetricsServer(HostPort("127.0.0.1", 0), lambda: app.data.latest)
    where = metrics.start()
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            pub = publisher(listen, RankKey("tui-job", "node-t", 77, 0, 0), 1, 0)
            made.append(pub)
            train(pub, 20)
            for _ in range(100):
                await pilot.pause(0.1)
                text = await asyncio.to_thread(http_get, where.url())
                if by_name(text, "flowtop_rank_mfu_ratio") and app.latest is not None and app.latest.jobs:
                    break
            (mfu,) = by_name(text, "flowtop_rank_mfu_ratio")
            assert mfu.labels["train_job"] == "tui-job" and mfu.value == pytest.approx(MODEL_FLOPS / WALL_S / PEAK, rel=0.01)
            assert app.delivered > 0  # the UI got its snapshots too
    finally:
        metrics.stop()
