"""Cost of a Prometheus scrape of the exporter at thousands of ranks, over real HTTP.

A real MetricsServer (flowtop.export.metrics_http) serves synthetic snapshots of one job
(synthetic.cluster: nodes of 8, one rank hung, a silent rack, a slow node ...) and a client
scrapes /metrics; per scrape: wall time (request to last byte), the exporter's CPU time in this
process (generating the text happens on the monitor's HTTP thread: CPU the data thread then
shares), the bytes and the samples. Per rank (the cap raised above the job) and per node (the
default cap of 1,024 below it). The synthetic job holds one rank claimed twice: N + 1 rank rows.

``--replicas R`` scrapes each snapshot R times in a row, as R Prometheus servers (an HA pair,
a second team's) scraping the same monitor between two of its ticks do: the first scrape of a
snapshot and the repeats are reported apart (``cpu_ms_median`` and ``cpu_ms_repeat_median``).
``--prometheus`` asks as Prometheus 2.x does: OpenMetrics first, ``Accept-Encoding: gzip``.
Prints JSON. Usage::

    python bench/scrape.py [--ranks 1024 --ranks 4096] [--scrapes 10] [--replicas 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/synthetic

from flowtop.export.exporter import ExportPolicy  # noqa: E402
from flowtop.export.metrics_http import HostPort, MetricsServer
from synthetic.cluster import cluster_snapshot

#: What Prometheus 2.x sends (scrape.go: acceptHeader for the default protocols, gzip on).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def scrape_costs(ranks: int, max_ranks: int, scrapes: int, openmetrics: bool = False, replicas: int = 1,
                 prometheus: bool = False) -> dict[str, object]:
    snaps = [cluster_snapshot(t, n_ranks=ranks) for t in range(scrapes)]
    current = {"snap": snaps[0]}
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: current["snap"], ExportPolicy(max_ranks=max_ranks))
    where = server.start()
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    if prometheus:
        headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    wall: list[float] = []
    cpu: list[float] = []
    wall_repeat: list[float] = []
    cpu_repeat: list[float] = []
    size = wire = samples = 0
    try:
        for snap in snaps:
            current["snap"] = snap
            for replica in range(replicas):
                c0, t0 = time.process_time(), time.perf_counter()
                with urllib.request.urlopen(urllib.request.Request(where.url(), headers=headers), timeout=60) as r:
                    body = r.read()
                    zipped = r.headers.get("Content-Encoding") == "gzip"
                (wall if replica == 0 else wall_repeat).append(1000 * (time.perf_counter() - t0))
                (cpu if replica == 0 else cpu_repeat).append(1000 * (time.process_time() - c0))
            wire = len(body)
            text = gzip.decompress(body) if zipped else body
            size = len(text)
            samples = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    finally:
        server.stop()
    out: dict[str, object] = {
        "ranks": len(snaps[0].jobs[0].ranks), "series": "per rank" if len(snaps[0].jobs[0].ranks) <= max_ranks
        else "per node", "format": "prometheus 2.x (openmetrics, gzip)" if prometheus else
        "openmetrics" if openmetrics else "prometheus text", "samples": samples, "bytes": size, "wire_bytes": wire,
        "wall_ms_median": round(statistics.median(wall), 1), "wall_ms_max": round(max(wall), 1),
        "cpu_ms_median": round(statistics.median(cpu), 1),
    }
    if cpu_repeat:
        out.update(replicas=replicas, wall_ms_repeat_median=round(statistics.median(wall_repeat), 1),
                   cpu_ms_repeat_median=round(statistics.median(cpu_repeat), 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, action="append", default=None)
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=1, help="scrapes of each snapshot (Prometheus replicas)")
    args = ap.parse_args()
    out = []
    for ranks in args.ranks or [1024, 4096]:
        out.append(scrape_costs(ranks, 1 << 20, args.scrapes, replicas=args.replicas))  # every rank its series
        if ranks > 1024:
            out.append(scrape_costs(ranks, 1024, args.scrapes, replicas=args.replicas))  # the default cap: per node
    first = (args.ranks or [1024])[0]
    out.append(scrape_costs(first, 1 << 20, args.scrapes, openmetrics=True, replicas=args.replicas))
    out.append(scrape_costs(first, 1 << 20, args.scrapes, replicas=args.replicas, prometheus=True))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
