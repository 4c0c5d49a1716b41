"""Scrapes between two snapshots reuse the rendered body (flowtop.export.scrape_cache): several Prometheus
servers scraping one monitor must not render its ~2 MB each. Over real HTTP, with a counter on the
exporter's per-job rendering."""

from __future__ import annotations

import gzip
import threading
import urllib.request
from typing import Any, Iterator

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

import flowtop.export.exporter
from flowtop.export.exporter import ExportPolicy
from flowtop.export.metrics_http import HostPort, MetricsServer
from flowtop.export.scrape_cache import ScrapeCache
from synthetic.cluster import cluster_snapshot

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
#: Families rendered at every scrape (the fresh part), not from the snapshot.
LIVE = ("flowtop_monitor_cpu_cores", "flowtop_monitor_frames_per_second", "flowtop_monitor_snapshot_age",
        "process_")


def get(url: str, accept: str | None = None, zipped: bool = False) -> tuple[str, dict[str, str]]:
    headers = {"Accept": accept} if accept else {}
    if zipped:
        headers["Accept-Encoding"] = "gzip"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
        body, info = resp.read(), dict(resp.headers)
    if info.get("Content-Encoding") == "gzip":
        body = gzip.decompress(body)
    return body.decode(), info


def snapshot_samples(text: str, openmetrics: bool = False) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every sample of the snapshot's families (the fresh ones left out)."""
    parse = parse_openmetrics if openmetrics else parse_text
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in parse(text) for s in f.samples
            if not s.name.startswith(LIVE)}


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The jobs the exporter rendered, one entry per job per rendering."""
    calls: list[str] = []
    real = flowtop.export.exporter.add_job

    def counted(fam: Any, job: Any, *args: Any) -> None:
        calls.append(job.job)
        real(fam, job, *args)

    monkeypatch.setattr(flowtop.export.exporter, "add_job", counted)  # the name snapshot_families calls
    return calls


@pytest.fixture
def served() -> Iterator[tuple[MetricsServer, dict[str, Any]]]:
    current: dict[str, Any] = {"snap": cluster_snapshot(0, n_ranks=64)}
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: current["snap"], ExportPolicy())
    server.start()
    yield server, current
    server.stop()


def test_one_rendering_per_snapshot_and_format(served: tuple[MetricsServer, dict[str, Any]],
                                               renders: list[str]) -> None:
    server, current = served
    url = server.where.url()
    plain = [get(url) for _ in range(3)]
    assert renders == ["llm-4k"]  # three scrapes, one rendering
    om = [get(url, OPENMETRICS, zipped=True) for _ in range(2)] + [get(url, OPENMETRICS)]
    assert renders == ["llm-4k"] * 2  # OpenMetrics: its own body, once (gzip'd or not)
    assert om[0][1]["Content-Encoding"] == "gzip" and "Content-Encoding" not in om[2][1]
    for text, _ in om:  # one # EOF, last; parses; the same samples as the text format's
        assert text.endswith("# EOF\n") and text.count("# EOF") == 1
        assert snapshot_samples(text, openmetrics=True) == snapshot_samples(om[2][0], openmetrics=True)
    # The fresh part is fresh: the process's own figures in every scrape, after the cached body.
    for text, _ in plain:
        assert "process_cpu_seconds_total" in text and "flowtop_monitor_cpu_cores" in text
    # The cached body says what an uncached rendering of the same snapshot says.
    from prometheus_client import generate_latest

    assert snapshot_samples(plain[0][0]) == snapshot_samples(generate_latest(server.registry).decode())
    renders.clear()
    # A new snapshot is rendered anew, with its own values.
    current["snap"] = cluster_snapshot(1, n_ranks=64)
    text, _ = get(url)
    assert renders == ["llm-4k"]
    assert snapshot_samples(text) != snapshot_samples(plain[0][0])
    clock = [s for f in parse_text(text) for s in f.samples if s.name == "flowtop_monitor_snapshot_clock_seconds"]
    assert clock[0].value == current["snap"].taken_at


def test_concurrent_scrapers_of_a_new_snapshot_render_it_once(served: tuple[MetricsServer, dict[str, Any]],
                                                              renders: list[str]) -> None:
    server, current = served
    current["snap"] = cluster_snapshot(2, n_ranks=256)
    bodies: list[str] = []
    threads = [threading.Thread(target=lambda: bodies.append(get(server.where.url(), zipped=True)[0]))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(bodies) == 4 and len({frozenset(snapshot_samples(b)) for b in bodies}) == 1
    assert renders == ["llm-4k"]


def test_snapshot_json_is_rendered_once_per_snapshot(served: tuple[MetricsServer, dict[str, Any]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import flowtop.export.metrics_http

    server, current = served
    calls: list[float] = []
    real = flowtop.export.metrics_http.to_json
    monkeypatch.setattr(flowtop.export.metrics_http, "to_json", lambda s: calls.append(s.taken_at) or real(s))

    def served() -> str:  # the cached body: what follows the age it is served with (served_age_s, first)
        body = get(server.where.url("/snapshot.json"))[0]
        assert body.startswith('{"served_age_s": ')
        return body.split(", ", 1)[1]

    first = [served() for _ in range(3)]
    assert len(set(first)) == 1 and calls == [current["snap"].taken_at]
    current["snap"] = cluster_snapshot(3, n_ranks=64)
    assert served() != first[0] and len(calls) == 2


def test_the_cache_is_bounded() -> None:
    cache = ScrapeCache(max_entries=2, max_bytes=100)
    snap = object()
    for version in range(10):  # an Accept header can name any version: as many keys
        cache.get(snap, f"openmetrics {version}", lambda: b"x" * 10)
    assert len(cache) == 2 and cache.renders == 10
    big = cache.get(snap, "big", lambda: b"y" * 101)  # served, never kept
    assert big.body == b"y" * 101 and cache.held_bytes() <= 100 and len(cache) <= 2
    cache.get(object(), "openmetrics 9", lambda: b"z")  # a newer snapshot drops the older's bodies
    assert len(cache) == 1 and cache.held_bytes() == 1


def test_gzip_of_the_cached_body_plus_a_fresh_tail() -> None:
    cache = ScrapeCache()
    snap = object()
    entry = cache.get(snap, "text", lambda: b"a 1\n" * 50_000)
    for tail in (b"b 2\n", b"b 3\n", b""):
        assert gzip.decompress(cache.get(snap, "text", lambda: b"never").gzip(tail)) == entry.body + tail
    assert cache.renders == 1 and cache.hits == 3
