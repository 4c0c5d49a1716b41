"""The Prometheus exporter: the latest snapshot as metric families, at scrape time. No Textual.

:class:`SnapshotCollector` is a ``prometheus_client`` custom collector. At each scrape it reads
the newest snapshot the data thread published (a reference to an immutable object) and turns its
fields into samples; it computes no figure of its own — MFU, FLOP/s, step times, node aggregates
(flowtop.monitor.rankview.node_group) and percentiles across ranks (flowtop.monitor.rankstats) all come from
where the TUI gets them — and nothing runs between scrapes.

Base units, ratios 0-1. Labels: ``train_job``, ``rank``, ``host``, ``local_rank``, ``relay`` (the
node relay the rank's frames came through as the relay's own series name it: its host, with its
address where the host has relays on several, flowtop.export.relay_series; "" when direct),
``rank_quantile``, hints' ``id`` and ``severity``, relays' ``relay``, the job peak's ``source``
(one word of five: flowtop.monitor.accounting.PeakKind) and ``dtype``; never a step, a pid or any
other value without a bound, and never a label Prometheus owns (``job``, ``instance``: it renames
an exported one to ``exported_job``) or reserves for a type (``quantile``, ``le``). Two bounds on
the series:

* A job of more than ``max_ranks`` rank rows gets per-node aggregates (``flowtop_node_*``,
  labels ``train_job``, ``host``) instead of per-rank series.
* A finished job (every rank said bye) is exported for ``linger_s`` seconds after its last bye,
  then its series end; a job the model drops (done or silent for 10 minutes) ends at once.

Here: the collectors, the monitor's own families (its load, frames) and which jobs are exported.
Every family is declared once, in flowtop.export.families: a scrape fills those declarations and
the collectors' ``describe()`` lists them, which prometheus_client's ``name[]`` filter needs. A
job's series are flowtop.export.job_series', its ranks' or nodes' flowtop.export.rank_series',
the relays' flowtop.export.relay_series'.

The metric list is in the README ("Prometheus"; a test holds it to a real scrape).
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from flowtop.export.families import LOAD_FAMILIES, SNAPSHOT_FAMILIES, Families, describe
from flowtop.export.job_series import DEFAULT_LINGER_S, DEFAULT_MAX_RANKS, ExportPolicy, add_job
from flowtop.export.relay_series import add_relays, relay_labels
from flowtop.monitor.selfload import METER, LoadMeter
from flowtop.monitor.snapshot import ENDED, JobSnapshot, MonitorSnapshot

#: Re-exported: the CLI and the tests take the policy from here, the exporter's entry point.
__all__ = ["DEFAULT_LINGER_S", "DEFAULT_MAX_RANKS", "ExportPolicy", "LoadCollector", "SnapshotCollector",
           "exported_jobs", "families", "load_families", "snapshot_families"]


def exported_jobs(snap: MonitorSnapshot, policy: ExportPolicy) -> list[JobSnapshot]:
    """The jobs that have series: all but those finished more than ``linger_s`` ago."""
    out = []
    for j in snap.jobs:
        if j.status in ENDED and j.ranks:
            since_bye = min(r.age_s(snap.taken_at) for r in j.ranks)
            if since_bye >= policy.linger_s:
                continue
        out.append(j)
    return out


def families(snap: MonitorSnapshot | None, policy: ExportPolicy = ExportPolicy(),
             meter: LoadMeter | None = METER) -> list[Metric]:
    """The metric families of ``snap`` (the monitor's own figures only, before the first)."""
    return load_families(snap, meter) + snapshot_families(snap, policy)


def load_families(snap: MonitorSnapshot | None, meter: LoadMeter | None = METER,
                  clock: Callable[[], float] = time.monotonic) -> list[Metric]:
    """The monitor's own CPU and frame rate (flowtop.monitor.selfload) and the served snapshot's real
    age, read at scrape time: the part of a scrape that is never cached (a wedged data thread must
    still show its CPU, and a snapshot served after a pause of the monitor its age)."""
    fam = Families(LOAD_FAMILIES)
    load = meter.read(snap.taken_at if snap else None, snap.received if snap else None) if meter else None
    if load is not None and load.cpu_ratio is not None:
        fam.gauge("flowtop_monitor_cpu_cores").add_metric([], load.cpu_ratio)
    if load is not None and load.frames_per_s is not None:
        fam.gauge("flowtop_monitor_frames_per_second").add_metric([], load.frames_per_s)
    # The monitor clock (taken_at) leaves the monitor's own pauses out; a scrape that came while it
    # was stopped (SIGSTOP) is answered at once on resume, before its next tick, with the snapshot
    # from before the pause: this says how old it really is.
    if snap is not None:
        fam.gauge("flowtop_monitor_snapshot_age_seconds").add_metric([], max(0.0, clock() - snap.built_at))
    return fam.metrics()


def snapshot_families(snap: MonitorSnapshot | None, policy: ExportPolicy = ExportPolicy()) -> list[Metric]:
    """Every family that depends on ``snap`` and ``policy`` alone (what a scrape cache may keep)."""
    fam = Families(SNAPSHOT_FAMILIES)
    if snap is None:
        return fam.metrics()
    fam.info("flowtop_monitor").add_metric([], {"listen": snap.listen, "version": _version()})
    fam.counter("flowtop_monitor_frames_received").add_metric([], snap.received)
    fam.counter("flowtop_monitor_frames_rejected").add_metric([], snap.rejected)
    fam.counter("flowtop_monitor_ranks_evicted_for_room").add_metric([], snap.ranks_evicted_for_room)
    fam.gauge("flowtop_monitor_snapshot_clock_seconds").add_metric([], snap.taken_at)
    jobs = exported_jobs(snap, policy)
    fam.gauge("flowtop_monitor_jobs").add_metric([], len(jobs))
    relays = relay_labels(snap.relays)  # once a snapshot: the ranks' relay label is their relay's
    for job in jobs:
        add_job(fam, job, snap, policy, relays)
    add_relays(fam, snap.relays, relays)
    return fam.metrics()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("flowtop")
    except Exception:  # a source tree that was never installed
        return "unknown"


class SnapshotCollector(Collector):
    """A ``prometheus_client`` collector of the latest snapshot: ``latest()`` is called at each
    scrape (on the HTTP server's thread) and must only return a reference. With ``meter`` it
    also writes the monitor's own load (:func:`load_families`); without, the snapshot's
    families alone (flowtop.export.metrics_http caches those and adds :class:`LoadCollector`'s)."""

    def __init__(self, latest: Callable[[], MonitorSnapshot | None], policy: ExportPolicy = ExportPolicy(),
                 meter: LoadMeter | None = METER, clock: Callable[[], float] = time.monotonic) -> None:
        self._latest = latest
        self.policy = policy
        self._meter = meter
        self._clock = clock

    def describe(self) -> list[Metric]:
        """The families :meth:`collect` yields, from their declarations (no scrape: the registry
        calls this at registration). prometheus_client's ``name[]`` filter asks only the
        collectors whose ``describe()`` names a requested series."""
        return describe((LOAD_FAMILIES if self._meter is not None else ()) + SNAPSHOT_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        snap = self._latest()
        if self._meter is not None:
            yield from load_families(snap, self._meter, self._clock)
        yield from snapshot_families(snap, self.policy)


class LoadCollector(Collector):
    """The monitor's own CPU and frames/s and the snapshot's age (:func:`load_families`) at each scrape."""

    def __init__(self, latest: Callable[[], MonitorSnapshot | None], meter: LoadMeter = METER,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._latest = latest
        self._meter = meter
        self._clock = clock

    def describe(self) -> list[Metric]:
        """The families :meth:`collect` yields, from their declarations."""
        return describe(LOAD_FAMILIES)

    def collect(self) -> Iterator[Metric]:
        yield from load_families(self._latest(), self._meter, self._clock)
