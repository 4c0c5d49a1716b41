"""Immutable snapshots of the monitor's model: what the UI renders and JSON prints.

The collector/model build a :class:`MonitorSnapshot` about twice a second and
hand it to the UI; nothing in it changes afterwards. flowtop.monitor.snapshot_json gives the
documented, versioned JSON form (see README "Snapshot JSON").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from itertools import islice
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

from flowtop.monitor.records import Slotted, fast_init
# Hint, SEVERITIES and RelaySnapshot: here as before, for their readers
from flowtop.monitor.hintrecord import SEVERITIES as SEVERITIES
from flowtop.monitor.hintrecord import Hint as Hint
from flowtop.monitor.relayviews import RelayCut, RelaySnapshot, no_count_reason, over_phrase
from probe.wire import BYE_ERROR_PREFIX

if TYPE_CHECKING:  # the kernel records' types; their modules load only where windows are built
    from flowtop.monitor.kernels.aggregate import KernelWindowStats
    from flowtop.monitor.kernels.merge import CumulativeRow, JobKernelStats
    from flowtop.monitor.moe_load import ExpertLoad
    from flowtop.monitor.precision import DtypeMix


#: Statuses of a rank (and of a job) that ended: it said bye ("done"), said bye from a process
#: ending of an exception nobody caught ("failed": a crash, a collective that failed when a peer
#: died; probe.wire.BYE_ERROR_PREFIX), or said bye as a signal ended it ("stopped": scancel, a
#: preemption, a timeout's kill, torchrun stopping the survivors of a crash, Ctrl-C; its bye names
#: the signal, :func:`ended_status`). None is running: none is late, stuck or counted.
ENDED = frozenset({"done", "failed", "stopped"})
#: How a signal's bye reason starts (probe.transport.sigterm says "SIGTERM").
SIGNAL_PREFIX = "SIG"
#: The bye of a process Ctrl-C ended (probe.ending: KeyboardInterrupt, i.e. SIGINT).
INTERRUPTED = "interrupted"


def ended_status(bye: str) -> str:
    """The status of a rank that said ``bye``: "failed" (probe.wire.BYE_ERROR_PREFIX), "stopped"
    (a signal ended it mid-run: "SIGTERM", "interrupted"), else "done" (its process exited
    normally: the training loop finished). The one place a bye's reason becomes a status."""
    if bye.startswith(BYE_ERROR_PREFIX):
        return "failed"
    if bye.startswith(SIGNAL_PREFIX) or bye == INTERRUPTED:
        return "stopped"
    return "done"


def first_ending(ranks: Iterable[RankSnapshot]) -> RankSnapshot | None:
    """The rank whose ending is its job's cause: of those that failed or were stopped, the first
    to say bye by its own send time (RankSnapshot.ended_at: the probe's stamp put on the monitor's
    clock by the rank's least transit, so a node's clock skew cancels; the gap between a cause and
    its consequence is a process's teardown), a crash on a tie; None where none did. The others
    follow it: torchrun stops a crashed rank's peers with SIGTERM, and a node that scancel or a
    preemption stopped breaks its peers' collectives ("Connection closed by peer"). Not the
    receive time (heard_at): one drain's ranks share it, and a bye queued behind step frames
    arrives after its peer's error. The one place that order is decided: the job's status,
    --until-done's exit and lines, the hang hint, the rank table, node rows and the TUI's notice
    (model_notices) read it."""
    return min((r for r in ranks if r.status == "failed" or r.status == "stopped"), key=ending_order, default=None)


def ending_time(r: RankSnapshot) -> float:
    """When an ended rank ended: its bye's send time (heard_at where none was kept)."""
    return r.ended_at if r.ended_at is not None else r.heard_at


def ending_order(r: RankSnapshot) -> tuple[float, int, int]:
    """Sort key of an ended rank by :func:`ending_time`, a crash before a stop at the same
    instant, then by rank number."""
    return (ending_time(r), 0 if r.status == "failed" else 1, r.rank)


def job_end_status(heard: Iterable[RankSnapshot]) -> str:
    """The status of a job whose heard ranks all ended: that of its :func:`first_ending`
    ("failed" or "stopped"), else "done"."""
    first = first_ending(heard)
    return "done" if first is None else first.status


#: Most rank numbers JobSnapshot.never_heard lists.
NEVER_HEARD_MAX = 1024

#: Conventions printed beside every FLOP figure.
MODEL_FLOPS_NOTE = ("model FLOPs: forward + backward as the math requires (attention backward = 2x forward), "
                    "no recomputation")
EXECUTED_FLOPS_NOTE = ("executed FLOPs: what ran, incl. activation-checkpoint recompute and flash-attention backward "
                       "(2.5x forward); a fused is_causal call counts half the square whatever the attention "
                       "convention (so HFU can read below MFU under 'full')")
FLOPS_PER_S_NOTE = (
    "FLOP/s: FLOPs per token of the counted step x tokens/s (else FLOPs per step / median step time); "
    "0 while a rank is stalled or stale; n/a for a rank unheard behind a silent relay, which the job's "
    "figures leave out"
)


#: ``mfu_reason`` of a stalled rank or job (seconds since its last step): see :func:`stalled_reason`.
STALLED_REASON = "no step for {:.0f} s"


def stalled_reason(stalled_s: float) -> str:
    """The ``mfu_reason`` of a rank (or job) that made no step for ``stalled_s`` seconds: the one
    place the text is made from the number (FlopsView.reason_at)."""
    return STALLED_REASON.format(stalled_s)


#: Where a rank's or job's peak comes from, in one word: the probe's (probe.wire.flops.PeakKind),
#: "override" for the monitor's own, "unknown" from a probe that did not say (before wire 1.4),
#: "mixed" for a job whose ranks differ or a rank whose precision mix takes peaks of several kinds
#: (the probe's ``peak_by_dtype_kind``).
ShownPeakKind = Literal["table", "estimate", "override", "none", "unknown", "mixed"]


@fast_init  # made per rank at every tick (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class FlopsView(Slotted):
    """FLOP accounting of one rank (or a job aggregate), conventions included."""

    model_flops_per_step: float | None
    executed_flops_per_step: float | None
    estimated_flops_per_step: float | None
    estimate_source: str | None
    flops_per_s: float | None  # model FLOP/s
    executed_flops_per_s: float | None
    mfu: float | None  # model FLOP/s / peak (0..1)
    hfu: float | None  # executed FLOP/s / peak
    peak_flops: float | None  # dense peak of the dtype in use, FLOP/s
    peak_source: str
    dtype: str
    attention_convention: str  # "full" | "causal"
    flops_per_token: float | None  # model FLOPs per token
    uncounted_ops: Mapping[str, int] = field(default_factory=dict)
    counted_at_step: int | None = None
    #: Why mfu is None, when it is (a rank cut off: "unheard behind relay HOST (silent)"; a job
    #: with such ranks adds what its figures are over, JobSnapshot.over_phrase); "" for a stalled
    #: rank or job (its mfu is 0, never None), whose reason ("no step for N s") grows with the
    #: clock: :meth:`reason_at` says it at a snapshot's ``taken_at`` (the JSON's ``mfu_reason``).
    mfu_reason: str = ""
    #: Monitor time of the rank's last step while it counts as stalled (its FLOP/s, MFU and HFU
    #: are then 0), its relay's lag added (the snapshot's clock: stalled for ``taken_at`` minus
    #: this); for a job, its newest step's when every rank is stalled. None otherwise. An
    #: instant, not seconds: the view of a rank that stays stalled stays the same object (a
    #: silent job's snapshot is kept, flowtop.monitor.endedjobs). Not in the JSON (``mfu_reason``).
    stalled_since: float | None = None
    counted: bool = True  # False: the FLOPs are the 6N+12LdT estimate (counting impossible there)
    model_note: str = ""  # how model FLOPs were derived where they are not a plain count
    #: FLOP-like size per uncounted op in the counted step (probe.flops.uncounted: a rough bound)
    uncounted_size: Mapping[str, int] = field(default_factory=dict)
    parallel: str = ""  # mesh and placements under DTensor parallelism (the figures are local)
    peak_kind: ShownPeakKind = "unknown"  # peak_source in one word (the JSON's, Prometheus' label)
    #: FLOPs per operand dtype and their peaks (flowtop.monitor.precision.DtypeMix); MFU/HFU are then
    #: against each dtype's own peak and ``peak_flops`` is the mix peak. None from older probes.
    precision: DtypeMix | None = None
    mfu_bf16: float | None = None  # bf16-equivalent MFU: model FLOP/s / the bf16 dense peak
    expert_load: ExpertLoad | None = None  # MoE: tokens per expert summarised (flowtop.monitor.moe_load)
    nonpad_tokens: int | None = None  # non-padding tokens of the counted step (attention_mask)
    nonpad_frac: float | None = None  # ... ÷ its tokens (which count padding)
    #: The counted step's attention calls: "causal", "bidirectional" (none causal: a ViT, BERT) or
    #: "mixed"; None where not read (no attention op seen, flex block masks, an older probe).
    attention_masking: str | None = None

    def stalled_s(self, now: float) -> float | None:
        """Seconds without a step at monitor time ``now`` (a snapshot's ``taken_at``), or None
        when not stalled."""
        return None if self.stalled_since is None else max(0.0, now - self.stalled_since)

    def reason_at(self, now: float) -> str:
        """``mfu_reason`` at monitor time ``now`` (a snapshot's ``taken_at``): "no step for N s"
        while stalled. What the UI and the JSON show."""
        if self.stalled_since is None:
            return self.mfu_reason
        # A stalled view's own reason is "" but a job's over phrase (accounting.job_flops): kept.
        stalled = stalled_reason(max(0.0, now - self.stalled_since))
        return f"{stalled}; {self.mfu_reason}" if self.mfu_reason else stalled

    @property
    def estimate_ratio(self) -> float | None:
        """Counted model FLOPs ÷ transformer estimate (1.0 means they agree)."""
        if self.model_flops_per_step and self.estimated_flops_per_step:
            return self.model_flops_per_step / self.estimated_flops_per_step
        return None


@fast_init  # made per rank at every tick (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class TelemetryView(Slotted):
    """Latest device and host telemetry of one rank; None values are n/a."""

    device: Mapping[str, Any]
    host: Mapping[str, Any]
    reasons: Mapping[str, Any]
    #: Monitor time the telemetry arrived (its age is ``taken_at`` of the snapshot minus this:
    #: a time-invariant view can be reused by the next snapshot while nothing new arrives).
    received_at: float

    def age_s(self, now: float) -> float:
        """Seconds since it arrived, at monitor time ``now`` (a snapshot's ``taken_at``)."""
        return max(0.0, now - self.received_at)


@fast_init  # made per rank at every tick (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class History(Slotted):
    """Recent per-step series for sparklines and hints (oldest first)."""

    steps: Sequence[int] = ()
    step_time_s: Sequence[float] = ()
    input_wait_s: Sequence[float] = ()
    #: Step boundary → end of the step's last forward (0.0 where unknown).
    lead_s: Sequence[float] = ()
    mfu: Sequence[float] = ()  # one value per telemetry/flops refresh
    tensor_active: Sequence[float] = ()
    power_w: Sequence[float] = ()
    sm_clock_mhz: Sequence[float] = ()
    #: (step, monitor receive time) pairs, to align ranks by step index.
    reached: Sequence[tuple[int, float]] = ()


@fast_init  # made per rank at every tick (flowtop.monitor.records)
@dataclass(frozen=True, slots=True)
class RankSnapshot(Slotted):
    """One rank as the monitor sees it now."""

    rank: int
    host: str
    pid: int
    local_rank: int
    incarnation: int
    device: str
    status: str  # "live" | "stalled" (talks, no step) | "stale" (silent) | "done" | "failed" | "stopped" (see ENDED)
    step: int
    step_time_s: float | None  # median wall time of recent steps
    device_time_s: float | None  # latest device (CUDA event) time of a step
    tokens_per_step: int | None  # None: unknown (no embedding seen: tokens are not guessed)
    tokens_per_s: float | None  # 0 while stalled or stale
    input_wait_frac: float | None  # share of the step spent waiting for input
    #: Monitor time the rank was last heard from: its age is the snapshot's ``taken_at`` minus
    #: this (see :meth:`age_s`), so the view of a rank that sent nothing new stays the same object.
    heard_at: float
    lost_messages: int  # gaps in sequence numbers
    dropped_messages: int  # dropped by the probe's bounded queue
    probe_overhead_frac: float | None  # probe's own training-thread time / step
    flops: FlopsView | None = None
    telemetry: TelemetryView | None = None
    kernels: KernelWindowStats | None = None  # the latest kernel window
    #: The rank's cumulative kernel table (CumulativeKernels.rows(): largest total first; a
    #: CumulativeTable, the rank's own until its next window, or a tuple of rows made by hand).
    kernels_cumulative: Sequence[CumulativeRow] | None = None
    history: History = field(default_factory=History)
    bye_reason: str | None = None
    commands_refused: int = 0  # monitor commands the probe refused (its rate limit)
    commands_dropped: int = 0  # commands over the probe's bound, dropped unread (a flood from a port squatter)
    #: Other live processes that claimed the same (job, rank, incarnation): shown as rows of
    #: their own, never merged (a launcher that set no RANK makes every process "rank 0").
    conflict: tuple["Claimant", ...] = ()
    #: The relay (its id) this rank's frames last came through; None when it connects directly.
    relay: str | None = None
    #: Why it counts as stale though it may still run: its relay is silent, or closed without
    #: handing it on (flowtop.monitor.relays sets it), not itself silent; None otherwise. Held as
    #: an instant (flowtop.monitor.relayviews), said at display (:meth:`status_reason_at`: the
    #: JSON's ``status_reason``). The hang rules leave such a rank out.
    cut: RelayCut | None = None
    #: Parallel coordinates from its hello, role ("dp", "tp", "pp", "cp", "ep") -> (rank, size);
    #: empty when the probe could not tell the layout (``coords_source`` says why).
    coords: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    coords_source: str = ""
    pp_stages: tuple[int, ...] = ()  # pipeline stage indices the rank runs
    #: Median compute time of its pipeline stage(s) per step (forward and backward chunks,
    #: neighbour waits excluded; probe.steps.pipeline); None outside a pipeline.
    stage_time_s: float | None = None
    #: Seconds its relay's latest batch had waited in queues when this view was made (0 when heard
    #: directly): the rank was judged as of that much earlier, when its relay had last reported
    #: (flowtop.monitor.relays). Behind a backlog its frames arrive late, not its training.
    behind_s: float = 0.0
    #: Monitor time of its last step boundary as its hello reported it, where that is newer than
    #: its step records (a monitor started while it hung heard none of them; rankstate.
    #: hello_step_at): the hang rules count its stall from there. None otherwise.
    hello_step_at: float | None = None
    #: When it said bye: its probe's send time on the monitor's clock (rankstate.RankState.ended_at);
    #: None until its bye came. Orders a job's endings (:func:`first_ending`).
    ended_at: float | None = None
    #: Monitor time it was first heard from (rankstate.RankState.first_seen): beside
    #: JobSnapshot.claimed_at, whether a process took its rank number after it ended (history,
    #: flowtop.monitor.rankview). None in a view made by hand (never history).
    first_seen: float | None = None

    def age_s(self, now: float) -> float:
        """Seconds since the monitor last heard from the rank, at monitor time ``now`` (the
        ``taken_at`` of the snapshot holding it), as of its relay's latest report."""
        return max(0.0, now - self.behind_s - self.heard_at)

    @property
    def cut_off(self) -> bool:
        """Whether its relay cut it off (:attr:`cut`): stale though it may still run."""
        return self.cut is not None

    def status_reason_at(self, now: float) -> str:
        """Why it is stale though it may still run, at monitor time ``now`` (a snapshot's
        ``taken_at``): "relay HOST silent for N s", "relay HOST closed"; "" when it is not."""
        return self.cut.text(now) if self.cut is not None else ""

    @property
    def mfu(self) -> float | None:
        """The rank's MFU as flowtop.monitor.accounting computed it (None without a FLOP count): the one
        reader the table's order and sort, the map, the percentiles and the hints share."""
        return self.flops.mfu if self.flops is not None else None


@dataclass(frozen=True, slots=True)
class Claimant(Slotted):
    """One process (host, pid) claiming a rank number another process claims too."""

    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class StageView(Slotted):
    """One pipeline stage (the ranks at one pp rank) of a job, per data-parallel replica.

    ``model_flops_per_step``: Σ over the stage's ranks of their local model FLOPs per step ÷ the
    data-parallel replicas (so, with tensor or context parallelism inside the stage, Σ over its
    tp × cp ranks of one replica); ``flops_share``: of the summed stages. ``stage_time_s`` and
    ``step_time_s``: medians over its ranks (compute time of the stage per step; step wall time)."""

    pp_rank: int
    stages: tuple[int, ...]  # pipeline stage indices run at this pp rank
    ranks: tuple[int, ...]
    model_flops_per_step: float | None
    flops_share: float | None
    stage_time_s: float | None
    step_time_s: float | None


@dataclass(frozen=True)
class JobSnapshot:
    """One job (all ranks with the same job id) and its aggregates."""

    job: str
    world_size: int
    ranks: tuple[RankSnapshot, ...]
    step: int  # lowest among live heard ranks (the job moves at its slowest); all unheard: last heard
    step_time_s: float | None  # slowest heard rank's median step time; None with every rank unheard
    tokens_per_s: float | None  # once per data-parallel replica where known, else Σ ranks (tokens_basis)
    flops: FlopsView | None  # Σ FLOPs ÷ Σ peaks over the same time
    status: str  # "running" | "stalled" | "stale" | "done" | "failed" | "stopped" (every rank ended: job_end_status)
    hints: tuple[Hint, ...] = ()
    kernels_merged: JobKernelStats | None = None  # the ranks' cumulative tables compared
    #: Rank numbers claimed by more than one live process (see RankSnapshot.conflict).
    rank_conflicts: int = 0
    #: How ``tokens_per_s`` counts (flowtop.monitor.parallelism): once per data-parallel replica, or
    #: summed over all ranks where the layout is not known.
    tokens_basis: str = ""
    #: Pipeline stages in pp-rank order (empty outside pipeline parallelism).
    stages: tuple[StageView, ...] = ()
    #: Heard ranks left out of its figures with their data-parallel replica, which has an unheard rank.
    left_out: int = 0
    #: Rank number -> monitor time the newest of its processes claiming it was first seen, for the
    #: rank numbers two or more of its processes hold, shown or not (flowtop.monitor.claims.ClaimedAt):
    #: a rank process that ended before then is history, sorted below the current ranks
    #: (flowtop.monitor.rankview). Not in the JSON.
    claimed_at: Mapping[int, float] = field(default_factory=dict, hash=False)

    @property
    def ranks_seen(self) -> int:
        """Distinct ranks that said hello."""
        return len({r.rank for r in self.ranks})

    @cached_property
    def never_heard(self) -> tuple[int, ...]:
        """Rank numbers of its world no process of it was heard as (a monitor started after they
        stopped, or they never reached it), at most NEVER_HEARD_MAX, found in as many looks more
        than the ranks heard (a world of 2²⁴): the hang hint and --until-done's lines name them."""
        heard = {r.rank for r in self.ranks}
        if len(heard) >= self.world_size:
            return ()
        return tuple(islice((n for n in range(self.world_size) if n not in heard), NEVER_HEARD_MAX))

    @cached_property
    def unheard(self) -> tuple[RankSnapshot, ...]:
        """Its rank processes cut off behind a silent or closed relay (RankSnapshot.cut): they may
        train on, unheard, so the job's figures (FLOP/s, MFU, tokens/s, percentiles, lag) are over
        the others; the one place they are told apart."""
        return tuple(r for r in self.ranks if r.cut is not None)

    @cached_property
    def over_phrase(self) -> str:
        """What its figures are over when some ranks are unheard (relayviews.over_phrase)."""
        return over_phrase([r.cut for r in self.ranks], self.left_out)

    @cached_property
    def stopped_by(self) -> tuple[str, ...]:
        """What ended its stopped ranks (their byes: "SIGTERM", "interrupted"), each once, sorted."""
        return tuple(sorted({r.bye_reason for r in self.ranks if r.status == "stopped" and r.bye_reason}))

    @property
    def status_text(self) -> str:
        """Its status as the TUI and text report say it: "stopped (SIGTERM)" names the signal."""
        if self.status == "stopped" and self.stopped_by:
            return f"stopped ({', '.join(self.stopped_by)})"
        return self.status

    @property
    def no_count_reason(self) -> str:
        """Its ``mfu_reason`` when ``flops`` is None (relayviews.no_count_reason)."""
        return no_count_reason([r.cut for r in self.ranks], self.left_out)


@dataclass(frozen=True)
class MonitorSnapshot:
    """Everything the monitor knows at ``taken_at`` (monitor clock)."""

    taken_at: float
    listen: str
    jobs: tuple[JobSnapshot, ...]
    received: int
    rejected: int
    rejected_reasons: Mapping[str, int] = field(default_factory=dict)
    #: Ended ranks forgotten early to admit new ones at the monitor's caps (flowtop.monitor.limits).
    ranks_evicted_for_room: int = 0
    #: Node relays (RelaySnapshot: flowtop.monitor.relayviews; flowtop.monitor.relays tracks them), by host.
    relays: tuple[RelaySnapshot, ...] = ()
    #: When it was built on the process's own monotonic clock, which (unlike ``taken_at``'s
    #: monitor clock) runs on while the monitor is stopped: what a reader on another thread (a
    #: scrape) tells the snapshot's real age by (flowtop.export.metrics_http). Not compared: the
    #: same state built twice is the same snapshot.
    built_at: float = field(default_factory=time.monotonic, compare=False, repr=False)


def all_done(snap: Any) -> bool:
    """Whether every rank of every job said bye and every job has all its ranks' rows (rows, not
    rank numbers: two processes claiming one rank are two rows, a conflict). A rank unheard
    behind a dead relay (RankSnapshot.cut) cannot say bye: its job ended when its heard ranks
    did (the job's status, flowtop.monitor.model_views), else ``--until-done`` waited for good."""
    return any(j.ranks for j in snap.jobs) and all(job_done(j) for j in snap.jobs)


def job_done(j: JobSnapshot) -> bool:
    """Whether every rank of ``j`` said bye, but those unheard behind a dead relay once the job
    ended, and it has every rank's row (:func:`all_done`, per job)."""
    return all(r.status in ENDED or (r.cut is not None and j.status in ENDED) for r in j.ranks) \
        and len(j.ranks) >= j.world_size
