"""A job's per-rank series, or per-node aggregates above the rank cap, for the Prometheus exporter.

Called by flowtop.export.job_series for each exported job: :func:`add_ranks` writes one series per
rank row (``flowtop_rank_*``, labels ``train_job``, ``rank``, ``host``, ``local_rank``, ``relay``);
:func:`add_nodes` the node rows of the TUI's rank view (``flowtop_node_*``, labels ``train_job``,
``host``: flowtop.monitor.rankview.node_group, remembered per snapshot object). No figure is
computed here. No Textual.
"""

from __future__ import annotations

from typing import Mapping

from flowtop.export.exporter_metrics import NODE_GAUGES, RANK_COUNTERS, RANK_GAUGES
from flowtop.export.families import Families, family_key, state_set
from flowtop.export.relay_series import rank_relay_label
from flowtop.monitor.byjob import ByJob
from flowtop.monitor.claims import newest_per, rank_newness
from flowtop.monitor.rankview import NodeGroup, job_context, node_group
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot

#: A rank's exported state: its status, but "unheard" where a silent or closed relay cut it off. Such a
#: rank may still train: "stale" would fire alerts meant for dead or hung ranks, and a finished job
#: keeps its cut ranks' series until the linger ends (flowtop.export.exporter).
RANK_STATES = ("live", "stalled", "stale", "done", "failed", "stopped", "unheard")


def export_state(r: RankSnapshot) -> str:
    """The rank's state in ``flowtop_rank_status`` and ``flowtop_job_ranks`` (see RANK_STATES)."""
    return "unheard" if r.cut_off else r.status


#: A node's exported state when some of its ranks are unheard: the worst of its ranks' exported
#: states, "unheard" below every trouble the monitor sees itself (a heard rank's stale or stall).
#: A node with a failed or stopped rank reads its first ending's status (rankview.node_group), as
#: a job does: not this order's.
NODE_ORDER = ("failed", "stopped", "stale", "stalled", "unheard", "live", "done")


def node_state(group: NodeGroup, members: list[RankSnapshot]) -> str:
    """The node's state in ``flowtop_node_status``: its worst status, but never "stale" for ranks
    that are only unheard (a finished rank beside a cut one: "unheard", not "stale")."""
    if group.worst_status in ("failed", "stopped") or not any(r.cut_off for r in members):
        return group.worst_status
    return min((export_state(r) for r in members), key=NODE_ORDER.index)


def rank_rows(job: JobSnapshot) -> list[RankSnapshot]:
    """One rank row per label set: of two processes claiming one rank on one host (a conflict,
    counted in flowtop_job_rank_conflicts) the newest incarnation, then the latest heard."""
    best = newest_per(job.ranks, lambda r: (r.rank, r.host, r.local_rank), rank_newness)  # first of equals
    return sorted(best.values(), key=lambda r: (r.rank, r.host))


def add_ranks(fam: Families, job: JobSnapshot, snap: MonitorSnapshot, relays: Mapping[str, str]) -> None:
    """The job's ``flowtop_rank_*`` samples, one set per rank row (``relays``: each relay's label)."""
    gauges = [(fam.gauge(family_key(n, u)), get) for n, u, _, get in RANK_GAUGES]
    counters = [(fam.counter(n), count) for n, _, count in RANK_COUNTERS]
    seen = fam.gauge("flowtop_rank_last_seen_seconds")
    status = fam.states("flowtop_rank_status")
    for r in rank_rows(job):
        labels = [job.job, str(r.rank), r.host, str(r.local_rank), rank_relay_label(r.relay, relays)]
        for g, get in gauges:
            value = get(r)
            if value is not None:  # unknown is left out, never 0
                g.add_metric(labels, value)
        for c, count in counters:
            c.add_metric(labels, count(r))
        seen.add_metric(labels, r.age_s(snap.taken_at))
        status.add_metric(labels, state_set(export_state(r), RANK_STATES))


def _node_groups(job: JobSnapshot) -> list[tuple[NodeGroup, list[RankSnapshot]]]:
    """The job's node groups, by host, each with its ranks (remembered per snapshot object)."""
    ctx = job_context(job.ranks)
    by_host: dict[str, list[RankSnapshot]] = {}
    for r in job.ranks:
        by_host.setdefault(r.host, []).append(r)
    return [(node_group(host, by_host[host], ctx), by_host[host]) for host in sorted(by_host)]


_NODE_GROUPS: ByJob[list[tuple[NodeGroup, list[RankSnapshot]]]] = ByJob()


def add_nodes(fam: Families, job: JobSnapshot) -> None:
    """The job's ``flowtop_node_*`` samples, one set per host (a job above the rank cap)."""
    gauges = [(fam.gauge(family_key(n, u)), get) for n, u, _, get in NODE_GAUGES]
    status = fam.states("flowtop_node_status")
    lost = fam.counter("flowtop_node_lost_messages")
    dropped = fam.counter("flowtop_node_dropped_messages")
    for group, members in _NODE_GROUPS.get(job.job, job, lambda: _node_groups(job)):
        labels = [job.job, group.host]
        for g, get in gauges:
            value = get(group)
            if value is not None:
                g.add_metric(labels, value)
        status.add_metric(labels, state_set(node_state(group, members), RANK_STATES))
        lost.add_metric(labels, sum(r.lost_messages for r in members))
        dropped.add_metric(labels, sum(r.dropped_messages for r in members))
