"""The rank view's rows: rank keys, step lag, worst-first order, column sorts, node groups.

Pure data (no Textual): :func:`build_view` turns one :class:`JobSnapshot` and a
:class:`ViewSpec` (sort, grouping, filter, which nodes are open) into an immutable
:class:`RankView` that the table only has to draw. It runs on every snapshot (2 Hz) for up to
thousands of ranks, so it does one sort and one pass and keeps per-rank work to a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

from flowtop.monitor.claims import is_history
from flowtop.monitor.format import COORD_ROLES
from flowtop.monitor.rankfilter import RankFilter, hinted_ranks
from flowtop.monitor.rankorder import LazyRows, node_order
from flowtop.monitor.snapshot import ENDED, JobSnapshot, RankSnapshot, ending_order, ending_time, first_ending

#: (job, host, pid, rank, incarnation): one rank process. Rows, selection and map cells are
#: keyed by it, never by a row index, so a selection survives rows moving.
RankKey = tuple[str, str, int, int, int]
#: ("node", job, host): one node's aggregate row.
NodeKey = tuple[str, str, str]
RowKey = Union[RankKey, NodeKey]

#: Worst-first tiers of a status. A rank whose process died of an uncaught exception comes first
#: (a crash is what a job's failure starts from), then a silent one, then one that talks but
#: makes no step (hung in a collective), then two processes claiming one rank, then the rest.
#: Silent before hung: when a node dies the other ranks hang in their collectives waiting for
#: it, and the dead node is the one to look at (it read last of 128 nodes, below the 1,016 ranks
#: hung waiting for it; a new user's trial).
#: A rank a signal ended (``stopped``, its bye "SIGTERM": scancel, a preemption, a node's
#: launcher killed) comes before the crashes that followed it: when its peers then fail (a
#: collective broken by the rank that left) it is where the failure started (a new user's trial:
#: the SIGTERMed node sorted last, below its peers' gloo errors). One stopped after a crash is
#: its consequence (torchrun stops a crashed rank's peers with SIGTERM): it sorts after the
#: crashes (:func:`worst_first`, JobContext.first_failure_at). "Before" and "after" are the byes'
#: send times with a crash first on a tie (snapshot.ending_order), as the job's status
#: (snapshot.job_end_status) and a node row's (:func:`node_group`) are its first ending's.
STATUS_TIER = {"stopped": -1, "failed": 0, "stale": 1, "stalled": 2, "live": 4, "done": 5}
STOPPED_TIER = STATUS_TIER["stopped"]
FAILED_TIER = STATUS_TIER["failed"]
STALE_TIER = STATUS_TIER["stale"]  # an unknown status sorts as silent
CONFLICT_TIER = 3
LIVE_TIER = STATUS_TIER["live"]
#: A rank process not heard since another process took its rank number (claims.is_history: an
#: elastic restart's old crash and stops sorted above the current ranks gone silent): below every
#: current rank, done included; among its kind by snapshot.ending_order (the crash first).
HISTORY_TIER = 6
#: Worst status of a node: the lowest tier among its ranks.
_TIER_STATUS = {-1: "stopped", 0: "failed", 1: "stale", 2: "stalled", 3: "live", 4: "live", 5: "done"}
#: A live rank is a straggler this many steps behind the job's lead rank. One step apart is
#: ordinary: ranks are sampled at slightly different moments of the same step.
STRAGGLER_LAG = 2
#: ... or when its median step time is this many times the job's median.
STRAGGLER_RATIO = 1.10
#: Groups start open while the ranks shown are this few (every row fits a screen or two);
#: beyond it nodes start closed, so 4,096 ranks show as 512 node rows, worst first.
OPEN_UP_TO = 64

_INF = float("inf")


def rank_key(job: str, r: RankSnapshot) -> RankKey:
    """The key of one rank process (a restart is a new incarnation, hence a new key)."""
    return (job, r.host, r.pid, r.rank, r.incarnation)


def node_key(job: str, host: str) -> NodeKey:
    """The key of one node's aggregate row."""
    return ("node", job, host)


def is_node_key(key: RowKey | None) -> bool:
    """Whether ``key`` names a node row (else a rank row, or nothing)."""
    return key is not None and key[0] == "node" and len(key) == 3


@dataclass(frozen=True)
class JobContext:
    """Job-wide figures the per-rank order and lag are measured against."""

    lead_step: int  # highest step of a running rank (heard: not cut off behind a silent relay)
    median_step_s: float | None  # median of the live ranks' median step times
    #: Rank number -> impact of the job's active straggler hints: stragglers first among the live
    #: (a late forward, the usual DDP straggler, shows no step lag nor a slower step time).
    stragglers: Mapping[int, float] = field(default_factory=dict)
    #: When the job's first failed rank sent its bye (snapshot.ending_order's time), None without
    #: one: a stopped rank that said bye then or after was stopped because of the crash, not the
    #: cause of it.
    first_failure_at: float | None = None
    #: JobSnapshot.claimed_at: rank number -> when the newest process claiming it was first seen.
    claimed_at: Mapping[int, float] = field(default_factory=dict)

    def history(self, r: RankSnapshot) -> bool:
        """:func:`is_history` of ``r`` in this job."""
        return is_history(r, self.claimed_at)

    def lag(self, r: RankSnapshot) -> int | None:
        """Steps behind the lead rank (0 for a finished rank: it is not late, it is done; None for
        one unheard behind a silent relay: its step is as last heard, not known to lag)."""
        if r.cut is not None:
            return None
        return 0 if r.status in ENDED else max(0, self.lead_step - r.step)


_LAST_CONTEXT: list[tuple[JobSnapshot, JobContext]] = []


def job_context_of(job: JobSnapshot) -> JobContext:
    """:func:`job_context` of ``job``'s ranks, remembered for the last job asked about: the
    table, the map and the summary all measure against one snapshot's job."""
    if _LAST_CONTEXT and _LAST_CONTEXT[0][0] is job:
        return _LAST_CONTEXT[0][1]
    ctx = job_context(job.ranks, hinted_ranks(job.hints, "straggler"), job.claimed_at)
    _LAST_CONTEXT[:] = [(job, ctx)]
    return ctx


def job_context(ranks: Iterable[RankSnapshot], stragglers: Mapping[int, float] | None = None,
                claimed_at: Mapping[int, float] | None = None) -> JobContext:
    """Lead step and median step time over the running ranks, those unheard behind a silent
    relay left out (``stragglers``: the ranks the job's straggler hints name, with their impact;
    ``claimed_at``: JobSnapshot.claimed_at, which ranks are history). The first failure is the
    current run's: a crash that is history (the one a restart followed) says nothing of why a
    current rank was stopped."""
    ranks = list(ranks)
    running = [r for r in ranks if r.status not in ENDED and r.cut is None] or ranks
    times = sorted(r.step_time_s for r in running if r.status == "live" and r.step_time_s is not None)
    claimed = claimed_at or {}
    failures = [ending_time(r) for r in ranks if r.status == "failed" and not (claimed and is_history(r, claimed))]
    return JobContext(lead_step=max((r.step for r in running), default=0), median_step_s=median_sorted(times),
                      stragglers=stragglers or {}, first_failure_at=min(failures, default=None), claimed_at=claimed)


def median_sorted(xs: list[float]) -> float | None:
    """Median of an already sorted list (statistics.median costs a sort and type checks: this
    runs for every node of a 4,096-rank job twice a second)."""
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def worst_first(ctx: JobContext) -> Callable[[RankSnapshot], tuple]:
    """Sort key: stopped (ended by a signal) before any crash, failed, stopped after a crash (their
    byes' send times, snapshot.ending_time; a tie: the crash first),
    silent, hung, then stragglers (those a straggler hint names, then the most steps behind and
    slowest step), then the lowest MFU, then done; history last (:data:`HISTORY_TIER`); rank
    number and incarnation break ties so the order is deterministic."""
    limit = ctx.median_step_s * STRAGGLER_RATIO if ctx.median_step_s else _INF
    crash_at = ctx.first_failure_at
    history = ctx.history if ctx.claimed_at else None  # no rank number held twice: none is history

    def key(r: RankSnapshot) -> tuple:
        if history is not None and history(r):
            return (HISTORY_TIER, ending_order(r), r.incarnation)
        tier = CONFLICT_TIER if r.conflict and r.status == "live" else STATUS_TIER.get(r.status, STALE_TIER)
        step_s = r.step_time_s if r.step_time_s is not None else 0.0
        if tier == STOPPED_TIER and crash_at is not None and ending_time(r) >= crash_at:  # a tie: the crash
            return (FAILED_TIER, 1, r.step, 0.0, r.rank, r.incarnation)  # after the crashes it followed
        if tier < LIVE_TIER:  # among the stuck, the one stuck at the lowest step has been stuck longest
            return (tier, 0, r.step, 0.0, r.rank, r.incarnation)
        if tier == LIVE_TIER:
            lag = ctx.lead_step - r.step
            impact = ctx.stragglers.get(r.rank)
            if impact is not None:  # named by a straggler hint: first, the most at stake first
                return (tier, -1, -impact, -step_s, r.rank, r.incarnation)
            if lag >= STRAGGLER_LAG or step_s >= limit:
                return (tier, 0, -lag, -step_s, r.rank, r.incarnation)
            mfu = r.mfu
            return (tier, 1, _INF if mfu is None else mfu, -step_s, r.rank, r.incarnation)
        return (tier, 0, 0.0, 0.0, r.rank, r.incarnation)

    return key


def _value_getters(ctx: JobContext) -> dict[str, Callable[[RankSnapshot], object]]:
    """Per column: the value a column sort compares (None: no value, sorted last)."""
    tel = lambda r: r.telemetry.device.get("tensor_active") if r.telemetry else None  # noqa: E731
    return {
        "rank": lambda r: r.rank,
        "host": lambda r: r.host,
        "step": lambda r: r.step,
        "lag": ctx.lag,
        "step_time": lambda r: r.step_time_s,
        "input_wait": lambda r: r.input_wait_frac,
        "tokens": lambda r: r.tokens_per_s,
        "flops": lambda r: r.flops.flops_per_s if r.flops else None,
        "mfu": lambda r: r.mfu,
        "tensor": lambda r: tel(r) if isinstance(tel(r), (int, float)) else None,
        "status": lambda r: STATUS_TIER.get(r.status, STALE_TIER),
        "mfu_bf16": lambda r: r.flops.mfu_bf16 if r.flops is not None else None,
        # parallel coordinates in their label's order (dp, tp, pp, cp, ep ranks)
        "coords": lambda r: tuple(r.coords.get(role, (0, 1))[0] for role in COORD_ROLES) if r.coords else None,
    }


#: Columns a sort can use, in table order, and whether their worst values are the high ones:
#: a column sort puts the worst first (slowest step, most lag, lowest MFU); ``r`` reverses.
SORT_COLUMNS: dict[str, bool] = {
    "rank": False, "host": False, "step": False, "lag": True, "step_time": True,
    "input_wait": True, "tokens": False, "flops": False, "mfu": False, "tensor": False,
    "status": False,
}  # fmt: skip
#: Columns the table shows only for jobs that have them (bf16-equivalent MFU, coordinates):
#: sorted by a click on their header, left out of the ``s`` cycle (they may be absent).
OPTIONAL_SORTS: dict[str, bool] = {"mfu_bf16": False, "coords": False}
ALL_SORTS: dict[str, bool] = {**SORT_COLUMNS, **OPTIONAL_SORTS}
WORST = "worst"


def sort_ranks(ranks: Iterable[RankSnapshot], ctx: JobContext, column: str = WORST,
               reverse: bool = False) -> list[RankSnapshot]:
    """``ranks`` in display order: worst first, or by ``column`` (missing values always last)."""
    if column == WORST:
        return sorted(ranks, key=worst_first(ctx), reverse=reverse)
    get = _value_getters(ctx)[column]
    desc = ALL_SORTS[column] != reverse
    present: list[tuple[Any, int, int, RankSnapshot]] = []  # (value, rank, incarnation, snapshot)
    missing: list[tuple[Any, int, int, RankSnapshot]] = []
    for r in ranks:
        v = get(r)
        (missing if v is None else present).append((v, r.rank, r.incarnation, r))
    if desc:  # ties still by ascending rank, so equal values keep a stable, readable order
        present.sort(key=lambda t: (t[1], t[2]))
        present.sort(key=lambda t: t[0], reverse=True)
    else:
        present.sort(key=lambda t: t[:3])
    missing.sort(key=lambda t: t[1:3])
    return [t[3] for t in present] + [t[3] for t in missing]


@dataclass(frozen=True)
class NodeGroup:
    """One node's ranks (in display order) and their aggregate figures."""

    host: str
    ranks: tuple[RankSnapshot, ...]
    worst_status: str
    mfu_min: float | None
    mfu_median: float | None
    max_lag: int | None  # None: no rank's lag is known (all unheard behind a silent relay)
    step_min: int
    step_time_max: float | None
    input_wait_max: float | None
    tokens_per_s: float | None  # sum over the node's ranks
    flops_per_s: float | None  # sum
    #: Some rank of the node is claimed by another process too (its row's rank reads "N!"): the
    #: node row says so, its worst status being "live" all the same.
    conflict: bool = False


def node_group(host: str, ranks: list[RankSnapshot], ctx: JobContext) -> NodeGroup:
    """Aggregate the ranks of one node (already in display order), in one pass. A rank unheard
    behind a silent relay (``cut``) counts in the node's ranks and status, not in its step time,
    input wait or lowest step: those are as last heard, as the rank map leaves them out."""
    tier = 9
    step: int | None = None
    lag: int | None = None
    mfus: list[float] = []
    t_max = w_max = tokens = flops = None
    conflict = False
    for r in ranks:
        conflict = conflict or bool(r.conflict)
        t = CONFLICT_TIER if r.conflict and r.status == "live" else STATUS_TIER.get(r.status, STALE_TIER)
        tier = min(tier, t)
        behind = ctx.lag(r)
        if behind is not None and (lag is None or behind > lag):
            lag = behind
        f = r.flops
        if f is not None and f.mfu is not None:
            mfus.append(f.mfu)
        if f is not None and f.flops_per_s is not None:
            flops = (flops or 0.0) + f.flops_per_s
        if r.tokens_per_s is not None:
            tokens = (tokens or 0.0) + r.tokens_per_s
        if r.cut is not None:
            continue
        if step is None or r.step < step:
            step = r.step
        if r.step_time_s is not None and (t_max is None or r.step_time_s > t_max):
            t_max = r.step_time_s
        if r.input_wait_frac is not None and (w_max is None or r.input_wait_frac > w_max):
            w_max = r.input_wait_frac
    mfus.sort()
    if step is None:  # every rank unheard: the lowest step last heard (as the job's step)
        step = min(r.step for r in ranks)
    # a crash or a signal's stop on the node: its first ending's, as a job's (snapshot.job_end_status)
    first = first_ending(ranks) if tier <= FAILED_TIER else None
    worst = first.status if first is not None else _TIER_STATUS.get(tier, "stale")
    return NodeGroup(host, tuple(ranks), worst, mfus[0] if mfus else None,
                     median_sorted(mfus), lag, step, t_max, w_max, tokens, flops, conflict)


@dataclass(frozen=True)
class RankRow:
    """A table row showing one rank process."""

    key: RankKey
    rank: RankSnapshot
    lag: int | None  # None: unknown (unheard behind a silent relay, JobContext.lag)
    nested: bool  # under a node row (grouped view)


@dataclass(frozen=True)
class NodeRow:
    """A table row aggregating one node; ``open`` rows are followed by their ranks."""

    key: NodeKey
    host: str
    ranks: tuple[RankSnapshot, ...]  # in display order: the first is the node's worst
    open: bool
    ctx: JobContext

    @cached_property
    def group(self) -> NodeGroup:
        """The node's aggregates, computed when first drawn: of 512 node rows, the few on
        screen pay for them."""
        return node_group(self.host, list(self.ranks), self.ctx)


Row = Union[RankRow, NodeRow]


@dataclass(frozen=True)
class ViewSpec:
    """What the user chose: order, grouping, filter, and the nodes opened or closed by hand."""

    sort: str = WORST
    reverse: bool = False
    grouped: bool = True
    filter: RankFilter = field(default_factory=RankFilter)
    opened: frozenset[str] = frozenset()  # hosts opened by hand
    closed: frozenset[str] = frozenset()  # hosts closed by hand

    def is_open(self, host: str, default: bool) -> bool:
        """Whether ``host``'s node row is open (by hand, else ``default``)."""
        if host in self.opened:
            return True
        return False if host in self.closed else default

    def toggled(self, host: str, default: bool) -> "ViewSpec":
        """This spec with ``host`` opened if it was closed, closed if it was open."""
        if self.is_open(host, default):
            return ViewSpec(self.sort, self.reverse, self.grouped, self.filter,
                            self.opened - {host}, self.closed | {host})
        return ViewSpec(self.sort, self.reverse, self.grouped, self.filter,
                        self.opened | {host}, self.closed - {host})


@dataclass(frozen=True)
class RankView:
    """The rows to draw for one job under one spec, and the counts its title states."""

    rows: Sequence[Row] = ()  # a flat view's: LazyRows
    total: int = 0  # rank processes in the job
    shown: int = 0  # of them, those the filter keeps
    nodes: int = 0  # hosts among the shown ranks
    grouped: bool = False  # node rows in effect (grouping on and more than one host)
    open_default: bool = True  # whether a node row not toggled by hand is open

    def index(self) -> dict[RowKey, int]:
        """Row key -> row index."""
        if isinstance(self.rows, LazyRows):
            return self.rows.row_index()
        return {row.key: i for i, row in enumerate(self.rows)}


_LAST_VIEW: list[tuple[JobSnapshot, ViewSpec, RankView]] = []


def build_view(job: JobSnapshot | None, spec: ViewSpec) -> RankView:
    """The rows of ``job``: filtered, sorted, and (grouped, more than one host) under node rows.

    Nodes are ordered by their first rank in the chosen order, so with worst-first the node
    holding the worst rank comes first and each node's own ranks follow in the same order.
    The last one built is returned again for the same snapshot object and an equal spec (a kept
    job's snapshot, flowtop.monitor.endedjobs): its node rows keep the groups they computed."""
    if job is None:
        return RankView()
    if _LAST_VIEW and _LAST_VIEW[0][0] is job and _LAST_VIEW[0][1] == spec:
        return _LAST_VIEW[0][2]
    view = _build_view(job, spec)
    _LAST_VIEW[:] = [(job, spec, view)]
    return view


def _build_view(job: JobSnapshot, spec: ViewSpec) -> RankView:
    ctx = job_context_of(job)
    keep = spec.filter.matcher(job)
    ranks = [r for r in job.ranks if keep(r)] if spec.filter.active else list(job.ranks)
    name = job.job
    groups = node_order(ranks, worst_first(ctx), spec.reverse) if spec.grouped and spec.sort == WORST else None
    if groups is None:
        ordered = sort_ranks(ranks, ctx, spec.sort, spec.reverse)
        if not spec.grouped:  # the hosts counted only (the title's), not grouped
            return RankView(_flat_rows(name, ordered, ctx), len(job.ranks), len(ranks), len({r.host for r in ranks}),
                            False, True)
        by_host: dict[str, list[RankSnapshot]] = {}
        for r in ordered:
            by_host.setdefault(r.host, []).append(r)
        groups = list(by_host.values())  # dicts keep insertion order: first-seen = worst
    if len(groups) <= 1:
        return RankView(_flat_rows(name, groups[0] if groups else [], ctx), len(job.ranks), len(ranks),
                        len(groups), False, True)
    default = len(ranks) <= OPEN_UP_TO
    rows: list[Row] = []
    for members in groups:
        host = members[0].host
        is_open = spec.is_open(host, default)
        rows.append(NodeRow(node_key(name, host), host, tuple(members), is_open, ctx))
        if is_open:
            rows.extend(RankRow(rank_key(name, r), r, ctx.lag(r), True) for r in members)
    return RankView(tuple(rows), len(job.ranks), len(ranks), len(groups), True, default)


def _flat_rows(job: str, ordered: list[RankSnapshot], ctx: JobContext) -> LazyRows[Row, RowKey]:
    """A flat view's rows, each made when read (a refresh reads the few on screen)."""
    return LazyRows(ordered, lambda r: RankRow(rank_key(job, r), r, ctx.lag(r), False), lambda r: rank_key(job, r))
