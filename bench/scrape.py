"""Cost of a Prometheus scrape of the exporter at thousands of ranks, over real HTTP.

A real MetricsServer (flowtop.metrics_http) serves synthetic snapshots of one job
(flowtop.synthetic_cluster: nodes of 8, one rank hung, a silent rack, a slow node ...) and a client
scrapes /metrics; per scrape: wall time (request to last byte), the exporter's CPU time in this
process (generating the text happens on the monitor's HTTP thread: CPU the data thread then
shares), the bytes and the samples. Per rank (the cap raised above the job) and per node (the
default cap of 1,024 below it). The synthetic job holds one rank claimed twice: N + 1 rank rows.
Prints JSON. Usage::

    python bench/scrape.py [--ranks 1024 --ranks 4096] [--scrapes 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

from flowtop.exporter import ExportPolicy
from flowtop.metrics_http import HostPort, MetricsServer
from flowtop.synthetic_cluster import cluster_snapshot


def scrape_costs(ranks: int, max_ranks: int, scrapes: int, openmetrics: bool = False) -> dict[str, object]:
    snaps = [cluster_snapshot(t, n_ranks=ranks) for t in range(scrapes)]
    current = {"snap": snaps[0]}
    server = MetricsServer(HostPort("127.0.0.1", 0), lambda: current["snap"], ExportPolicy(max_ranks=max_ranks))
    where = server.start()
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    wall, cpu, size, samples = [], [], 0, 0
    try:
        for snap in snaps:
            current["snap"] = snap
            c0, t0 = time.process_time(), time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(where.url(), headers=headers), timeout=60) as r:
                body = r.read()
            wall.append(1000 * (time.perf_counter() - t0))
            cpu.append(1000 * (time.process_time() - c0))
            size = len(body)
            samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    finally:
        server.stop()
    return {
        "ranks": len(snaps[0].jobs[0].ranks), "series": "per rank" if len(snaps[0].jobs[0].ranks) <= max_ranks
        else "per node", "format":
        "openmetrics" if openmetrics else "prometheus text", "samples": samples, "bytes": size,
        "wall_ms_median": round(statistics.median(wall), 1), "wall_ms_max": round(max(wall), 1),
        "cpu_ms_median": round(statistics.median(cpu), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, action="append", default=None)
    ap.add_argument("--scrapes", type=int, default=10)
    args = ap.parse_args()
    out = []
    for ranks in args.ranks or [1024, 4096]:
        out.append(scrape_costs(ranks, 1 << 20, args.scrapes))  # every rank its series
        if ranks > 1024:
            out.append(scrape_costs(ranks, 1024, args.scrapes))  # the default cap: per node
    out.append(scrape_costs((args.ranks or [1024])[0], 1 << 20, args.scrapes, openmetrics=True))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
