"""The Prometheus exporter: the latest snapshot as metric families, at scrape time. No Textual.

:class:`SnapshotCollector` is a ``prometheus_client`` custom collector. At each scrape it reads
the newest snapshot the data thread published (a reference to an immutable object) and turns its
fields into samples; it computes no figure of its own — MFU, FLOP/s, step times, node aggregates
(flowtop.monitor.rankview.node_group) and percentiles across ranks (flowtop.monitor.rankstats) all come from
where the TUI gets them — and nothing runs between scrapes.

Base units, ratios 0-1. Labels: ``train_job``, ``rank``, ``host``, ``local_rank``, ``relay`` (the
host of the node relay the rank's frames came through, "" when direct), ``rank_quantile``, hints'
``id`` and ``severity``, relays' ``relay``, the job peak's ``source`` (one word of five:
flowtop.monitor.accounting.PeakKind) and ``dtype``; never a step, a pid or any other value without a
bound, and never a label Prometheus owns (``job``, ``instance``: it renames an exported one to
``exported_job``) or reserves for a type (``quantile``, ``le``). Two bounds on the series:

* A job of more than ``max_ranks`` rank rows gets per-node aggregates (``flowtop_node_*``,
  labels ``job``, ``host``) instead of per-rank series.
* A finished job (every rank said bye) is exported for ``linger_s`` seconds after its last bye,
  then its series end; a job the model drops (done or silent for 10 minutes) ends at once.

Every family is declared once, in flowtop.export.families: a scrape fills those declarations and the
collectors' ``describe()`` lists them, which prometheus_client's ``name[]`` filter needs.

The metric list is in the README ("Prometheus"; a test holds it to a real scrape).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from flowtop.monitor.claims import newest_per, rank_newness
from flowtop.monitor.rankstats import job_percentiles
from flowtop.monitor.byjob import ByJob
from flowtop.monitor.rankview import NodeGroup, job_context, node_group
from flowtop.export.exporter_metrics import JOB_GAUGES, JOB_QUANTILES, NODE_GAUGES, RANK_COUNTERS, RANK_GAUGES
from flowtop.export.families import LOAD_FAMILIES, SNAPSHOT_FAMILIES, Families, Family, describe
from flowtop.monitor.selfload import METER, LoadMeter
from flowtop.monitor.snapshot import ENDED, JobSnapshot, MonitorSnapshot, RankSnapshot, RelaySnapshot

#: Jobs with more rank rows than this get per-node series instead of per-rank ones.
DEFAULT_MAX_RANKS = 1024
#: Seconds a finished job's series stay after its last bye.
DEFAULT_LINGER_S = 60.0

RANK_STATES = ("live", "stalled", "stale", "done", "failed")
JOB_STATES = ("running", "stalled", "stale", "done", "failed")
RELAY_STATES = ("live", "silent", "closed")
#: Percentiles across ranks (flowtop.monitor.rankstats.PERCENTILES) as ``rank_quantile`` label values.
QUANTILES = ("0", "0.5", "0.95", "1")


@dataclass(frozen=True)
class ExportPolicy:
    """What the exporter bounds: per-rank series up to ``max_ranks`` rank rows, a finished job
    for ``linger_s`` seconds after its last bye."""

    max_ranks: int = DEFAULT_MAX_RANKS
    linger_s: float = DEFAULT_LINGER_S


def _full(name: str, unit: str) -> str:
    """A table row's family key (flowtop.export.families.Family.key)."""
    return Family(name, "gauge", "", unit=unit).key


def relay_host(relay_id: str | None, snap: MonitorSnapshot) -> str:
    """The host of a rank's relay ("" when it connects directly): relays serve their own node."""
    if not relay_id:
        return ""
    for rel in snap.relays:
        if rel.relay == relay_id:
            return str(rel.host)
    host = relay_id.rpartition(":")[0].rpartition(":")[0]  # id is host:pid:nonce
    return host or relay_id


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


def _rank_rows(job: JobSnapshot) -> list[RankSnapshot]:
    """One rank row per label set: of two processes claiming one rank on one host (a conflict,
    counted in flowtop_job_rank_conflicts) the newest incarnation, then the latest heard."""
    best = newest_per(job.ranks, lambda r: (r.rank, r.host, r.local_rank), rank_newness)  # first of equals
    return sorted(best.values(), key=lambda r: (r.rank, r.host))


def _states(current: str, states: tuple[str, ...]) -> dict[str, bool]:
    return {s: s == current for s in states}


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
    for job in jobs:
        _job(fam, job, snap, policy)
    _relays(fam, snap)
    return fam.metrics()


def _job(fam: Families, job: JobSnapshot, snap: MonitorSnapshot, policy: ExportPolicy) -> None:
    name = job.job
    for metric, unit, _, get in JOB_GAUGES:
        value = get(job)
        if value is not None:
            fam.gauge(_full(metric, unit)).add_metric([name], value)
    fam.states("flowtop_job_status").add_metric([name], _states(job.status, JOB_STATES))
    if job.flops is not None:
        fam.info("flowtop_job_peak").add_metric([name], {"source": job.flops.peak_kind, "dtype": job.flops.dtype})
    by_status = dict.fromkeys(RANK_STATES, 0)
    for r in job.ranks:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    ranks = fam.gauge("flowtop_job_ranks")
    for status, n in by_status.items():
        ranks.add_metric([name, status], n)
    pct = job_percentiles(job)
    for metric, unit, _, attr in JOB_QUANTILES:
        values = getattr(pct, attr)
        if values is not None:
            g = fam.gauge(_full(metric, unit))
            for q, v in zip(QUANTILES, values):
                g.add_metric([name, q], v)
    _hints(fam, job)
    fam.counter("flowtop_job_lost_messages").add_metric([name], sum(r.lost_messages for r in job.ranks))
    fam.counter("flowtop_job_dropped_messages").add_metric([name], sum(r.dropped_messages for r in job.ranks))
    fam.counter("flowtop_job_commands_dropped").add_metric([name], sum(r.commands_dropped for r in job.ranks))
    per_rank = len(job.ranks) <= policy.max_ranks
    fam.gauge("flowtop_job_rank_series").add_metric([name], 1 if per_rank else 0)
    if per_rank:
        _ranks(fam, job, snap)
    else:
        _nodes(fam, job)


def _hints(fam: Families, job: JobSnapshot) -> None:
    counts: dict[tuple[str, str], int] = {}
    impact: dict[tuple[str, str], float] = {}
    for h in job.hints:
        if h.ended:
            continue
        key = (h.id, h.severity)
        counts[key] = counts.get(key, 0) + 1
        impact[key] = max(impact.get(key, 0.0), float(h.impact))
    hints = fam.gauge("flowtop_job_hints")
    share = fam.gauge("flowtop_job_hint_impact_ratio")
    for (hid, severity), n in sorted(counts.items()):
        hints.add_metric([job.job, hid, severity], n)
        share.add_metric([job.job, hid, severity], impact[(hid, severity)])


def _ranks(fam: Families, job: JobSnapshot, snap: MonitorSnapshot) -> None:
    gauges = [(fam.gauge(_full(n, u)), get) for n, u, _, get in RANK_GAUGES]
    counters = [(fam.counter(n), get) for n, _, get in RANK_COUNTERS]
    seen = fam.gauge("flowtop_rank_last_seen_seconds")
    status = fam.states("flowtop_rank_status")
    for r in _rank_rows(job):
        labels = [job.job, str(r.rank), r.host, str(r.local_rank), relay_host(r.relay, snap)]
        for g, get in gauges:
            value = get(r)
            if value is not None:
                g.add_metric(labels, value)
        for c, count in counters:
            c.add_metric(labels, count(r))
        seen.add_metric(labels, r.age_s(snap.taken_at))
        status.add_metric(labels, _states(r.status, RANK_STATES))


def _node_groups(job: JobSnapshot) -> list[tuple[NodeGroup, list[RankSnapshot]]]:
    """The job's node groups, by host, each with its ranks (remembered per snapshot object)."""
    ctx = job_context(job.ranks)
    by_host: dict[str, list[RankSnapshot]] = {}
    for r in job.ranks:
        by_host.setdefault(r.host, []).append(r)
    return [(node_group(host, by_host[host], ctx), by_host[host]) for host in sorted(by_host)]


_NODE_GROUPS: ByJob[list[tuple[NodeGroup, list[RankSnapshot]]]] = ByJob()


def _nodes(fam: Families, job: JobSnapshot) -> None:
    gauges = [(fam.gauge(_full(n, u)), get) for n, u, _, get in NODE_GAUGES]
    status = fam.states("flowtop_node_status")
    lost = fam.counter("flowtop_node_lost_messages")
    dropped = fam.counter("flowtop_node_dropped_messages")
    for group, members in _NODE_GROUPS.get(job.job, job, lambda: _node_groups(job)):
        labels = [job.job, group.host]
        for g, get in gauges:
            value = get(group)
            if value is not None:
                g.add_metric(labels, value)
        status.add_metric(labels, _states(group.worst_status, RANK_STATES))
        lost.add_metric(labels, sum(r.lost_messages for r in members))
        dropped.add_metric(labels, sum(r.dropped_messages for r in members))


def _relays(fam: Families, snap: MonitorSnapshot) -> None:
    newest: dict[str, RelaySnapshot] = {}  # one series per relay host: the most recently heard relay there
    for rel in snap.relays:
        old = newest.get(rel.host)
        if old is None or rel.age_s < old.age_s:
            newest[rel.host] = rel
    for host in sorted(newest):
        rel = newest[host]
        fam.states("flowtop_relay_status").add_metric([host], _states(rel.status, RELAY_STATES))
        fam.gauge("flowtop_relay_ranks").add_metric([host], rel.ranks)
        fam.counter("flowtop_relay_frames_in").add_metric([host], rel.frames_in)
        fam.counter("flowtop_relay_frames_out").add_metric([host], rel.frames_out)
        fam.counter("flowtop_relay_drops").add_metric([host], rel.drops)
        fam.counter("flowtop_relay_commands_dropped").add_metric([host], rel.commands_dropped)
        fam.gauge("flowtop_relay_link_lag_seconds").add_metric([host], rel.link_lag_s)


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
