"""One exported job's series for the Prometheus exporter, and the bounds on them (:class:`ExportPolicy`).

:func:`add_job` writes the job's own families (``flowtop_job_*``, label ``train_job``: sums, MFU,
status, the peak's source and dtype, ranks by status, percentiles across ranks, hints, message
counts), then its ranks' series, or per-node aggregates when it has more rank rows than the
policy's ``max_ranks`` (flowtop.export.rank_series). The figures are the snapshot's and
flowtop.monitor.rankstats' (the TUI's summary line); none is computed here. No Textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from flowtop.export.exporter_metrics import JOB_GAUGES, JOB_QUANTILES
from flowtop.export.families import Families, family_key, state_set
from flowtop.export.rank_series import RANK_STATES, add_nodes, add_ranks, export_state
from flowtop.monitor.rankstats import job_percentiles
from flowtop.monitor.snapshot import ENDED, JobSnapshot, MonitorSnapshot

#: Jobs with more rank rows than this get per-node series instead of per-rank ones.
DEFAULT_MAX_RANKS = 1024
#: Seconds a finished job's series stay after its last bye.
DEFAULT_LINGER_S = 60.0

#: "unheard": stale, but only for ranks behind silent or closed relays (they may train on).
JOB_STATES = ("running", "stalled", "stale", "done", "failed", "stopped", "unheard")

#: Percentiles across ranks (flowtop.monitor.rankstats.PERCENTILES) as ``rank_quantile`` label values.
QUANTILES = ("0", "0.5", "0.95", "1")


def job_state(job: JobSnapshot) -> str:
    """The job's state in ``flowtop_job_status``: its status, but "unheard" where it is stale only
    because every rank that has not ended is cut off behind a relay (see rank_series.RANK_STATES)."""
    if job.status == "stale" and job.unheard and all(r.cut_off or r.status in ENDED for r in job.ranks):
        return "unheard"
    return job.status


@dataclass(frozen=True)
class ExportPolicy:
    """What the exporter bounds: per-rank series up to ``max_ranks`` rank rows, a finished job
    for ``linger_s`` seconds after its last bye."""

    max_ranks: int = DEFAULT_MAX_RANKS
    linger_s: float = DEFAULT_LINGER_S


def add_job(fam: Families, job: JobSnapshot, snap: MonitorSnapshot, policy: ExportPolicy,
            relays: Mapping[str, str]) -> None:
    """Every sample of ``job``: its own families, then its ranks' (or nodes'; ``relays``: each relay's
    label, flowtop.export.relay_series.relay_labels)."""
    name = job.job
    for metric, unit, _, get in JOB_GAUGES:
        value = get(job)
        if value is not None:  # unknown is left out, never 0
            fam.gauge(family_key(metric, unit)).add_metric([name], value)
    fam.states("flowtop_job_status").add_metric([name], state_set(job_state(job), JOB_STATES))
    if job.flops is not None:
        fam.info("flowtop_job_peak").add_metric([name], {"source": job.flops.peak_kind, "dtype": job.flops.dtype})
    by_status = dict.fromkeys(RANK_STATES, 0)
    for r in job.ranks:
        state = export_state(r)
        by_status[state] = by_status.get(state, 0) + 1
    ranks = fam.gauge("flowtop_job_ranks")
    for status, n in by_status.items():
        ranks.add_metric([name, status], n)
    pct = job_percentiles(job)
    for metric, unit, _, attr in JOB_QUANTILES:
        values = getattr(pct, attr)
        if values is not None:
            g = fam.gauge(family_key(metric, unit))
            for q, v in zip(QUANTILES, values):
                g.add_metric([name, q], v)
    _hints(fam, job)
    fam.counter("flowtop_job_lost_messages").add_metric([name], sum(r.lost_messages for r in job.ranks))
    fam.counter("flowtop_job_dropped_messages").add_metric([name], sum(r.dropped_messages for r in job.ranks))
    fam.counter("flowtop_job_commands_dropped").add_metric([name], sum(r.commands_dropped for r in job.ranks))
    per_rank = len(job.ranks) <= policy.max_ranks
    fam.gauge("flowtop_job_rank_series").add_metric([name], 1 if per_rank else 0)
    if per_rank:
        add_ranks(fam, job, snap, relays)
    else:
        add_nodes(fam, job)


def _hints(fam: Families, job: JobSnapshot) -> None:
    """Active hints per (id, severity): how many, and the largest impact among them."""
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
