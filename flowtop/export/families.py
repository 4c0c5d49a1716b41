"""Every metric family the exporter writes, declared once: name, type, unit, help and label names.

A scrape builds its families from these declarations (:class:`Families`: the declared ones only,
filled from the snapshot) and the collectors' ``describe()`` lists the same declarations
(flowtop.export.exporter). prometheus_client's registry learns which names a collector yields from
``describe()`` alone, and its ``name[]`` filter (``/metrics?name[]=flowtop_job_mfu_ratio``:
``CollectorRegistry.restricted_registry``) asks only the collectors that declared the name, so a
family yielded but not described never passes a filter. Filling a family that is not declared here
fails (KeyError), so what is yielded and what is described cannot drift apart. No Textual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
)
from prometheus_client.metrics_core import Metric

from flowtop.export.exporter_metrics import JOB_GAUGES, JOB_QUANTILES, NODE_GAUGES, RANK_COUNTERS, RANK_GAUGES

#: The training job's label. Not ``job``: Prometheus gives every scraped series the scrape
#: config's ``job`` (and ``instance``) and renames an exported ``job`` to ``exported_job``, so
#: ``{job="..."}`` selectors and ``by (job)`` would see the scrape job, every training merged.
JOB_LABEL = "train_job"
#: Percentiles across ranks. Not ``quantile``: that label belongs to summaries (promtool's lint
#: rejects it on a gauge); these are not quantiles of observations over time.
QUANTILE_LABEL = "rank_quantile"
RANK_LABELS = (JOB_LABEL, "rank", "host", "local_rank", "relay")
NODE_LABELS = (JOB_LABEL, "host")
JOB_LABELS = (JOB_LABEL,)
HINT_LABELS = (JOB_LABEL, "id", "severity")
RELAY_LABELS = ("relay",)

Kind = Literal["gauge", "counter", "stateset", "info"]
M = TypeVar("M", bound=Metric)


@dataclass(frozen=True)
class Family:
    """One declared family. ``name`` as prometheus_client takes it: without the unit (appended),
    a counter's without ``_total``, an info's without ``_info``."""

    name: str
    kind: Kind
    doc: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    @property
    def key(self) -> str:
        """The family's name in a scrape (``# TYPE`` of the text format): the unit appended."""
        return family_key(self.name, self.unit)

    def empty(self) -> Metric:
        """The family without samples: what ``describe()`` lists and a scrape starts from."""
        labels = list(self.labels)
        if self.kind == "gauge":
            return GaugeMetricFamily(self.name, self.doc, labels=labels, unit=self.unit)
        if self.kind == "counter":
            return CounterMetricFamily(self.name, self.doc, labels=labels, unit=self.unit)
        if self.kind == "stateset":
            return StateSetMetricFamily(self.name, self.doc, labels=labels)
        return InfoMetricFamily(self.name, self.doc, labels=labels)


def family_key(name: str, unit: str) -> str:
    """A family's name in a scrape: the unit appended, as prometheus_client's ``Metric`` does."""
    return f"{name}_{unit}" if unit else name


def state_set(current: str, states: tuple[str, ...]) -> dict[str, bool]:
    """A state-set sample's value: ``current`` on, every other state off."""
    return {s: s == current for s in states}


def _gauges(rows: Iterable[tuple[str, str, str, object]], labels: tuple[str, ...], suffix: str = "") -> list[Family]:
    return [Family(name, "gauge", doc + suffix, labels, unit) for name, unit, doc, _ in rows]


#: Read at scrape time, never cached (flowtop.export.exporter.load_families).
LOAD_FAMILIES: tuple[Family, ...] = (
    # CPU seconds per second: 1 per core kept busy, above 1 with the ZeroMQ I/O thread or gzip
    # running beside the interpreter; a _ratio would promise 0-1 (README: once flowtop_monitor_cpu_ratio).
    Family("flowtop_monitor_cpu", "gauge", "Cores the monitor process kept busy (CPU seconds per second, "
           "every thread), last 5 s", unit="cores"),
    Family("flowtop_monitor_frames_per_second", "gauge", "Frames the monitor received per second, last 5 s"),
    Family("flowtop_monitor_snapshot_age", "gauge", "Seconds since the snapshot the values are from was built, "
           "on the process's clock (a pause of the monitor included)", unit="seconds"),
)

#: Everything that depends on the snapshot and the export policy alone, in the order a scrape
#: writes them (what flowtop.export.scrape_cache may keep).
SNAPSHOT_FAMILIES: tuple[Family, ...] = (
    Family("flowtop_monitor_snapshot_clock", "gauge", "Monitor clock of the snapshot the values are from "
           "(taken_at of the same snapshot's JSON)", unit="seconds"),
    Family("flowtop_monitor_jobs", "gauge", "Jobs exported"),
    Family("flowtop_monitor_frames_received", "counter", "Frames received"),
    Family("flowtop_monitor_frames_rejected", "counter", "Frames rejected (malformed, refused handshakes, caps)"),
    Family("flowtop_monitor_ranks_evicted_for_room", "counter", "Ended ranks forgotten early at the caps"),
    *_gauges(RANK_GAUGES, RANK_LABELS),
    Family("flowtop_rank_last_seen", "gauge", "Seconds since the monitor last heard from the rank", RANK_LABELS,
           "seconds"),
    *(Family(name, "counter", doc, RANK_LABELS) for name, doc, _ in RANK_COUNTERS),
    Family("flowtop_rank_status", "stateset", "Rank status: live, stalled (talks, no step), stale (silent), done, "
           "failed (ended of an uncaught exception), stopped (a signal ended it: SIGTERM, Ctrl-C), unheard (behind a "
           "silent or closed relay; may train on)",
           RANK_LABELS),
    *_gauges(JOB_GAUGES, JOB_LABELS),
    *_gauges(JOB_QUANTILES, (JOB_LABEL, QUANTILE_LABEL), " (rank_quantile 0, 0.5, 0.95, 1 across running heard ranks)"),
    Family("flowtop_job_status", "stateset", "Job status: running, stalled, stale, done, failed (every rank ended, "
           "the first to end crashed), stopped (every rank ended, the first to end by a signal; failures after it "
           "follow it), unheard (stale only behind silent or closed relays)", JOB_LABELS),
    Family("flowtop_job_peak", "info", "Where the peak of the job's MFU and HFU comes from: source table "
           "(datasheet), estimate (CPU cores x clock x FLOPs/cycle), override (--peak-tflops / FLOWTOP_PEAK_TFLOPS), "
           "none (no MFU), unknown (a probe before wire 1.4) or mixed (ranks differ); dtype the peak is of (the "
           "snapshot JSON's peak_source has the detail)", JOB_LABELS),
    Family("flowtop_job_ranks", "gauge", "Rank processes of the job by status (live, stalled, stale, done, failed, "
           "stopped, unheard: behind a silent or closed relay)", (JOB_LABEL, "status")),
    Family("flowtop_job_rank_series", "gauge", "1: per-rank series exported; 0: per-node aggregates instead "
           "(more ranks than --prometheus-max-ranks)", JOB_LABELS),
    Family("flowtop_job_hints", "gauge", "Active bottleneck hints by id and severity", HINT_LABELS),
    Family("flowtop_job_hint_impact", "gauge", "Largest estimated share of step time at stake among the "
           "active hints of that id", HINT_LABELS, "ratio"),
    Family("flowtop_job_lost_messages", "counter", "Lost messages summed over the job's ranks", JOB_LABELS),
    Family("flowtop_job_dropped_messages", "counter", "Dropped messages summed over the job's ranks", JOB_LABELS),
    Family("flowtop_job_commands_dropped", "counter", "Commands over the wire's bound dropped unread by the job's "
           "probes (a flood from whatever took the monitor's port)", JOB_LABELS),
    *_gauges(NODE_GAUGES, NODE_LABELS, " (jobs above the rank cap)"),
    Family("flowtop_node_status", "stateset", "Worst rank status on the node (jobs above the rank cap); "
           "unheard when all its ranks are",
           NODE_LABELS),
    Family("flowtop_node_lost_messages", "counter", "Lost messages summed over the node's ranks", NODE_LABELS),
    Family("flowtop_node_dropped_messages", "counter", "Dropped messages summed over the node's ranks", NODE_LABELS),
    Family("flowtop_relay_status", "stateset", "Node relay status: live, silent (3 s), closed", RELAY_LABELS),
    Family("flowtop_relay_ranks", "gauge", "Ranks whose latest frame came through the relay", RELAY_LABELS),
    Family("flowtop_relay_frames_in", "counter", "Frames the relay received from its ranks", RELAY_LABELS),
    Family("flowtop_relay_frames_out", "counter", "Frames the relay sent upstream", RELAY_LABELS),
    Family("flowtop_relay_drops", "counter", "Frames the relay dropped", RELAY_LABELS),
    Family("flowtop_relay_commands_dropped", "counter", "Commands from upstream over the wire's bound, dropped "
           "unread by the relay (a flood)", RELAY_LABELS),
    Family("flowtop_relay_link_lag", "gauge", "How much later than its fastest path the relay's latest batch "
           "arrived", RELAY_LABELS, "seconds"),
    Family("flowtop_monitor", "info", "The monitor: its listen address and version", ("listen", "version")),
)


def describe(declared: Iterable[Family]) -> list[Metric]:
    """The declared families without samples: a collector's ``describe()``."""
    return [f.empty() for f in declared]


class Families:
    """One scrape's families: every declared one, in declaration order, filled as the snapshot has
    samples (a family without samples is still written, with its help: the names stay visible to
    a dashboard before the first job). Only declared families can be filled."""

    def __init__(self, declared: Iterable[Family]) -> None:
        self._items: dict[str, Metric] = {f.key: f.empty() for f in declared}

    def gauge(self, key: str) -> GaugeMetricFamily:
        return self._get(key, GaugeMetricFamily)

    def counter(self, key: str) -> CounterMetricFamily:
        return self._get(key, CounterMetricFamily)

    def states(self, key: str) -> StateSetMetricFamily:
        return self._get(key, StateSetMetricFamily)

    def info(self, key: str) -> InfoMetricFamily:
        return self._get(key, InfoMetricFamily)

    def metrics(self) -> list[Metric]:
        return list(self._items.values())

    def _get(self, key: str, kind: type[M]) -> M:
        family = self._items[key]  # a KeyError here: a family that families.py does not declare
        if not isinstance(family, kind):
            raise TypeError(f"{key} is declared a {type(family).__name__}, filled as a {kind.__name__}")
        return family
