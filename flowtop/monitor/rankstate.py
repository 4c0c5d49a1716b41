"""Per-rank state of the monitor's model and the clock rules over it. No Textual.

Liveness uses the monitor's receive clock (``now`` passed in), never the sender's clock.
"""

from __future__ import annotations

import math
import statistics
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from flowtop.monitor.compact import Column, PairSeq, Window
from flowtop.monitor.parallelism import coords_of
from flowtop.monitor.sanitize import printable
from flowtop.monitor.stepring import StepRing
from flowtop.monitor.snapshot import History, TelemetryView, ended_status
from probe.wire import FlopsReport, HelloStep, RankKey

if TYPE_CHECKING:  # built and added by flowtop.monitor.rankkernels
    from flowtop.monitor.kernels.aggregate import KernelWindowStats
    from flowtop.monitor.kernels.merge import CumulativeKernels

#: Steps kept per rank for step alignment (step numbers and receive times; the straggler rule
#: looks back 256 steps for "since when") ...
RING = 256
#: ... and of those the last RECENT with all their fields (medians: 32, history: HISTORY).
RECENT = 128
HISTORY = 120
#: The device telemetry a rank's sparkline series sample, in this order (then its MFU).
DEVICE_SERIES = ("tensor_active", "power_w", "sm_clock_mhz")
#: Samples kept per sparkline series (one per telemetry or FLOP refresh).
SERIES = 300
#: Probe overhead samples kept per rank.
PROBE_SAMPLES = 64
#: A rank is stale after this many seconds of silence (or 5 median steps, if longer),
#: and stalled after as long without a step.
STALE_AFTER_S = 5.0
#: ... the "5 median steps" of that limit.
STALE_AFTER_STEPS = 5.0
#: A job whose ranks have all been done or stale (and silent) this long is forgotten.
EVICT_AFTER_S = 600.0
#: Fastest plausible advance of a rank between two of its frames: a forged step or sequence
#: number far ahead would freeze the real rank's view (later, true values look like replays).
#: The allowance grows with the silence since the rank's last frame (a monitor that was away,
#: a probe queue that dropped): 10 k steps/s and 100 k frames/s, never under the floors.
MAX_STEPS_PER_S, MIN_STEP_JUMP = 10_000, 1_000
MAX_FRAMES_PER_S, MIN_SEQ_JUMP = 100_000, 20_000


@dataclass(frozen=True, slots=True)
class RankHello:
    """What the monitor reads of a rank's latest hello (the defaults: none heard yet). Its other
    fields (argv, probe version, where the rank number came from) are not shown."""

    local_rank: int = 0
    world_size: int = 0
    device: str = "unknown"
    #: Parallel coordinates, role ("dp", "tp", "pp", "cp", "ep") -> (rank, size); {}: not known.
    coords: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    coords_source: str = ""
    pp_stages: tuple[int, ...] = ()  # pipeline stage indices the rank runs


#: The hello fields a :class:`RankHello` is made of; not its step fields (``last_step``,
#: ``step_age_s``: they change at every hello, read by :func:`heard_step`) nor those not shown.
HELLO_SOURCE_FIELDS = ("local_rank", "world_size", "device", "coords", "coords_source", "pp_stages")


def heard_hello(st: RankState, fields: Mapping[str, Any]) -> None:
    """A hello's record kept as ``st.hello``. Re-sent every 2-10 s (1.6 k/s at 16 k ranks), nearly
    always the same: its raw source fields are compared with those the kept record was made of
    (``st.hello_source``) and the record is made again (printable text, coordinates, interning)
    only when they differ; an equal record still leaves the kept one, so that its views'
    coordinates stay the same objects."""
    source = tuple(map(fields.get, HELLO_SOURCE_FIELDS))
    if source == st.hello_source:
        return
    st.hello_source = source
    hello = hello_of(fields)
    if hello != st.hello:
        st.hello = hello


def hello_of(fields: Mapping[str, Any]) -> RankHello:
    """The record of a hello's (validated) fields: remote text made printable (it reaches
    terminals) and interned (thousands of ranks name the same device)."""
    return RankHello(
        local_rank=int(fields.get("local_rank", 0)),
        world_size=int(fields.get("world_size", 0)),
        device=sys.intern(printable(str(fields.get("device", "unknown")))),
        coords=coords_of(fields),
        coords_source=sys.intern(printable(str(fields.get("coords_source", "")))),
        pp_stages=tuple(int(s) for s in fields.get("pp_stages", ())),
    )


@dataclass(slots=True)
class MedianCache:
    """A rank's median step time and median tokens per step over its last 32 steps, as
    :func:`median_step` last computed them: valid while the rank's newest step and the count of
    steps held are still ``step`` and ``held`` (every status check needs the median, a sort of 32
    values, thousands of ranks twice a second). One per rank, brought up to date in place: a new
    frozen record at each new step cost 0.7 µs more than the tuple it replaced (8.2 against
    7.5 µs a recomputation)."""

    step: int = -1  # -1: matches no rank's newest step, so the first check computes it
    held: int = 0
    median_s: float | None = None
    #: Median tokens per step of the same steps; 0.0 when the newest step sent no tokens (its
    #: rate is then unknown).
    tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class Judged:
    """A rank's whole history and telemetry as its job's hints last read them, at its ``version``
    (RankState.version): the same while nothing new arrived."""

    version: int
    history: History
    telemetry: TelemetryView | None


@dataclass(slots=True)
class RankState:
    """Mutable per-rank state; only the model touches it. (Slots, not a dict each: every frame
    reads and writes a few of its fields, thousands of ranks apart in memory.)"""

    key: RankKey
    first_seen: float
    last_recv: float
    hello: RankHello = field(default_factory=RankHello)
    #: The raw HELLO_SOURCE_FIELDS values ``hello`` was made of, in that order: compared whole with
    #: the next hello's, never read by position (heard_hello); (): none heard yet.
    hello_source: tuple[object, ...] = ()
    step: int = 0
    steps: StepRing = field(default_factory=lambda: StepRing(RING, RECENT))
    device_s: float | None = None
    # Machine numbers, not deques of float objects (~2 KB a rank at 4,096 ranks); read only as
    # medians, so a Window (one array written round, ~0.5 KB a rank fewer than a Column's blocks).
    probe_s: Window = field(default_factory=lambda: Window("d", PROBE_SAMPLES))
    #: Compute time of the rank's pipeline stage(s) per step (the step records' ``stage_s``).
    stage_s: Window = field(default_factory=lambda: Window("d", 32))
    last_seq: int = -1
    lost: int = 0
    drops: int = 0
    flops: FlopsReport | None = None  # its latest FLOP count (None before any)
    #: Its latest telemetry, as received (its ``received_at``: monitor time); None before any.
    telemetry: TelemetryView | None = None
    series: dict[str, Column] = field(default_factory=dict)
    kernels: KernelWindowStats | None = None  # the latest window (flowtop.monitor.rankkernels)
    kernels_cumulative: CumulativeKernels | None = None
    bye: str | None = None
    #: When the rank said its bye, as its probe stamped the frame (the wire's ``t``) put on the
    #: monitor's clock by :attr:`clock_lead`: which of a job's endings came first
    #: (snapshot.first_ending). Not the receive time: a bye queued behind step frames, or one
    #: drain's frames sharing one ``now``, reorder those.
    ended_at: float | None = None
    #: The least (receive time - the frame's ``t``) over its frames: the rank's clock to the
    #: monitor's (its host's clock skew plus the shortest transit; step frames sampled too, so a
    #: crash early in a run, its few hellos received late in a start's burst, is not put late). A
    #: node whose clock is 2 s behind would otherwise have its endings taken as 2 s earlier.
    clock_lead: float = math.inf
    #: The latest send time (the wire's ``t``, the rank's clock) of its frames but hellos: a bye
    #: stamped before it is implausible (a broken or hostile probe's t=0) and is put at its receive
    #: time (:func:`bye_time`). The probe stamps a frame when it is queued, and frames leave in
    #: that order, except its hello: stamped at the sender's round and put first, it goes out before
    #: a bye queued just earlier (probe.transport.sender), and is left out.
    sent_max: float = -math.inf
    #: Monitor time of the rank's last step boundary as its newest hello reported it (receive time
    #: minus its ``step_age_s``), while that hello's ``last_step`` is at least the newest step
    #: record's: a monitor (re)started while the rank hangs in a collective sees none of its steps,
    #: only its hellos. None: no such hello (an old probe, before its first step, between a sweep's
    #: models, or steps arrived since).
    hello_step_at: float | None = None
    hello_step: int = -1  # the step whose boundary that is
    commands_refused: int = 0
    commands_dropped: int = 0  # commands over its probe's bound, dropped unread (a flood)
    #: Monitor time a kernel window was last asked of it (``k``): a refusal soon after is said.
    kernels_asked_at: float = -math.inf
    #: The relay its latest frame came through (None: heard directly); its views show it.
    via: str | None = None
    #: Bumped whenever anything above changes (a frame, a built kernel window): a view built
    #: from the same version shows the same data (flowtop.monitor.rankviews).
    version: int = 0
    med_cache: MedianCache = field(default_factory=MedianCache)  # see median_step
    #: A stale rank's whole history and telemetry as a large job's hints read them
    #: (Model._as_now): taken again only once something arrived.
    judged: Judged | None = None

    def push_series(self, name: str, value: object) -> None:
        """Append a numeric value to a sparkline series (anything else, None and bools included, is
        skipped: telemetry's maps are open-ended). A float or an int, as msgpack gives them, is
        told by its type before isinstance's two calls."""
        t = type(value)
        if t is float or t is int or (t is not bool and isinstance(value, (int, float))):
            column = self.series.get(name)
            if column is None:
                column = self.series[name] = Column("f", SERIES)  # sparklines: float32 is plenty
            column.append(float(value))  # type: ignore[arg-type]  # a number: tested above

    def push_telemetry(self, device: Mapping[str, object], mfu: float | None) -> None:
        """:meth:`push_series` of each of DEVICE_SERIES of a telemetry frame's ``device`` map, then
        of its ``mfu``."""
        for name in DEVICE_SERIES:
            self.push_series(name, device.get(name))
        self.push_series("mfu", mfu)

def implausible(st: RankState, seq: int, now: float, steps: array | None) -> str:
    """Why a message of sequence number ``seq`` and step numbers ``steps`` (its step records'
    column, step_columns(msg).step; None without records) cannot come from the rank ``st`` has
    heard so far ("" when it can). Every frame of a known rank
    is asked: ``a if a > b else b`` for max(b, a) (the same value, NaN included; builtin max parses
    keywords at each call, ~0.7 k instructions), and the ring's truth (a Python call) asked last."""
    silent = now - st.last_recv
    silent = silent if silent > 0.0 else 0.0
    last_seq = st.last_seq
    if last_seq >= 0:
        allowed = silent * MAX_FRAMES_PER_S
        if seq - last_seq > (allowed if allowed > MIN_SEQ_JUMP else MIN_SEQ_JUMP):
            return "implausible seq jump for a known rank (forged or corrupt frame)"
    if steps:
        allowed = silent * MAX_STEPS_PER_S
        if steps[-1] - st.step > (allowed if allowed > MIN_STEP_JUMP else MIN_STEP_JUMP) and st.steps:
            return "implausible step jump for a known rank (forged or corrupt frame)"
    return ""


def limit(med: float | None) -> float:
    """Seconds of silence (or without a step) after which a rank is stale (or stalled)."""
    return max(STALE_AFTER_S, STALE_AFTER_STEPS * (med or 0.0))


def heard_step(st: RankState, said: HelloStep | None, now: float) -> None:
    """A hello received at ``now`` said the rank's last step and the seconds since its boundary
    (None: it said no step, or an invalid one). Kept while it is at least as new as the step
    records; the first estimate of a step's boundary stays (later hellos of a hung rank differ by
    their transit time only: its views and hints read the same)."""
    if said is None or (st.steps and said.last_step < st.step):
        st.hello_step_at, st.hello_step = None, -1
        return
    if not st.steps and said.last_step > st.step:
        st.step = said.last_step  # known only by hellos: shown at the step it reached
    at = now - said.age_s
    if st.hello_step != said.last_step or st.hello_step_at is None or at < st.hello_step_at:
        st.hello_step_at, st.hello_step = at, said.last_step


def bye_time(st: RankState, sent_at: float, now: float) -> float:
    """When the rank whose bye stamped ``sent_at`` (its clock) and was received at ``now`` said
    it, on the monitor's clock (RankState.ended_at): its send time plus the rank's clock lead (at
    most ``now``: the lead is at most ``now - sent_at``). A stamp before one of the rank's own
    earlier frames (``sent_max``, which holds the bye's too: greater only by an earlier frame's),
    or one that puts it before the monitor first heard it, says nothing of when it ended (a
    broken or hostile probe's t=0 took its job's first ending): its receive time instead. Before
    first seen by up to BYE_HELD_S: a bye queued while nobody listened, sent after the hello its
    probe stamped as it connected (a crash at start-up)."""
    at = sent_at + st.clock_lead
    return at if sent_at >= st.sent_max and at >= st.first_seen - BYE_HELD_S else now


#: Seconds a probe may hold a frame before it leaves (its default max_age_s): how far before the
#: monitor first heard a rank its bye may have been stamped.
BYE_HELD_S = 2.0


def hello_step_at(st: RankState) -> float | None:
    """The hello's step boundary (RankState.hello_step_at) where it is newer than the newest step
    record's receive time, else None: what a rank's view carries for the hang rules."""
    at = st.hello_step_at
    if at is None or (st.steps and st.steps.last_recv() >= at):
        return None
    return at


def last_step_at(st: RankState) -> float | None:
    """Monitor time of the rank's last step: its newest step record's receive time, or the
    boundary its hello reported when newer (or the only one known); None before any."""
    at = hello_step_at(st)
    if at is not None:
        return at
    return st.steps.last_recv() if st.steps else None


def stalled_for(st: RankState, now: float, med: float | None) -> float | None:
    """Seconds since the rank's last step (monitor clock; see last_step_at) when beyond the
    limit, else None.

    A finished rank is never stalled; a rank with no step yet (warming up) neither, nor one whose
    hellos say no step (before its first, between a sweep's models).
    """
    if st.bye is not None:
        return None
    at = last_step_at(st)
    if at is None:
        return None
    since = now - at
    return since if since > limit(med) else None


def tokens_per_s(st: RankState, med: float | None, stalled: float | None) -> float | None:
    """Median tokens per step of recent steps ÷ median step time; 0 while stalled; None while
    its tokens are unknown (no embedding seen), stalled or not."""
    median_step(st)  # brings the cached median tokens up to date
    tokens = st.med_cache.tokens
    if stalled is not None:
        return 0.0 if tokens else None
    if tokens and med:
        return tokens / med
    return None


def running(st: RankState, now: float) -> bool:
    """Neither said bye nor silent past the stale limit (a stalled rank still runs)."""
    if st.bye is None and now - st.last_recv <= STALE_AFTER_S:
        return True  # the limit is at least that: no median needed (every rank, every tick)
    return st.bye is None and status(st, now, median_step(st), None) != "stale"  # a bye: ended (ENDED)


def gone(st: RankState, now: float) -> bool:
    """Done or stale, and silent for at least EVICT_AFTER_S."""
    silent = now - st.last_recv
    return silent > EVICT_AFTER_S and silent > limit(median_step(st))


#: Steps a rank's step time is the median of, the newest (README "FLOP conventions": step time).
MEDIAN_STEPS = 32


def median_step(st: RankState) -> float | None:
    """Median wall time of the last :data:`MEDIAN_STEPS` steps, step 1 (warm-up) left out."""
    # The ring changes only with a new step (duplicates are dropped): the newest step number and
    # the count say whether it did, whatever other frames (telemetry, hello) bumped the version.
    # The median tokens per step of the same steps (tokens_per_s) is kept beside it (MedianCache).
    cache, ring = st.med_cache, st.steps
    if cache.step == st.step and cache.held == len(ring):
        return cache.median_s
    # step 1 includes warm-up
    n = MEDIAN_STEPS
    recent = [w for s, w in zip(ring.values(ring.STEP, n), ring.values(ring.WALL, n)) if s > 1]
    med = statistics.median(recent) if recent else None
    tokens = ring.values(ring.TOKENS, n)
    cache.step, cache.held, cache.median_s = st.step, len(ring), med
    cache.tokens = float(statistics.median(tokens)) if tokens and tokens[-1] else 0.0
    return med


def status(st: RankState, now: float, med: float | None, stalled: float | None) -> str:
    """"done" (said bye), "failed" (said bye as its process ended of an uncaught exception),
    "stopped" (said bye as a signal ended it: snapshot.ended_status), "stale" (silent past the
    limit), "stalled" (talks, no step), "live"."""
    if st.bye is not None:
        return ended_status(st.bye)
    if now - st.last_recv > limit(med):
        return "stale"
    if stalled is not None:
        return "stalled"  # heartbeats, but no step: hung (in a collective, I/O, a deadlock)
    return "live"


def steady_until(st: RankState, status: str, med: float | None) -> float:
    """Until when :func:`status` (and whether the rank is stalled) reads ``status`` again if
    nothing new arrives: a live rank stalls (or, before its first step, goes stale) past the limit
    after its last step, a stalled one goes stale past the limit after its last frame."""
    if status == "live":
        at = last_step_at(st)
        return (at if at is not None else st.last_recv) + limit(med)
    if status == "stalled":
        return st.last_recv + limit(med)
    return math.inf


class Liveness(NamedTuple):
    """:func:`stalled_for`, :func:`status` and :func:`steady_until` of a rank at one instant."""

    stalled: float | None
    status: str
    until: float


def liveness(st: RankState, now: float, med: float | None) -> Liveness:
    """:func:`stalled_for`, :func:`status` and :func:`steady_until` at once, the rank's last step
    and limit looked up once instead of three times each (a large job's light views ask of every
    rank at every tick, RankViews._light). Keep it in step with those three."""
    if st.bye is not None:
        return Liveness(None, ended_status(st.bye), math.inf)
    lim = limit(med)
    at = last_step_at(st)
    stalled = now - at if at is not None and now - at > lim else None
    if now - st.last_recv > lim:
        return Liveness(stalled, "stale", math.inf)
    if stalled is not None:
        return Liveness(stalled, "stalled", st.last_recv + lim)
    return Liveness(None, "live", (at if at is not None else st.last_recv) + lim)


def telemetry_view(st: RankState) -> TelemetryView | None:
    """The rank's latest telemetry as an immutable view (None before any arrived): the record
    kept when it arrived, shared by every view of the rank until the next."""
    return st.telemetry


def history(st: RankState, shown_only: bool = False) -> History:
    """The last HISTORY steps, the sparkline series and the steps' receive times, oldest first:
    immutable views that share the rank's storage (flowtop.monitor.compact), not copies.

    ``shown_only``: what the UI shows (step times and the series), for the published view of a
    rank of a large job, whose hints read a history taken when they are measured
    (Model._as_now). A view is kept for up to a round (32 s at 4,096 ranks and spread 8) and
    shares blocks its ring has dropped since: a rank stepping every 10 ms kept ~10 KB of old
    steps, receive times, waits and leads alive for nobody (bench/ingest.py --memory)."""
    ring = st.steps
    n = min(HISTORY, ring.recent_len)
    series = st.series
    mfu = series["mfu"].view() if "mfu" in series else ()
    tensor_active = series["tensor_active"].view() if "tensor_active" in series else ()
    power_w = series["power_w"].view() if "power_w" in series else ()
    sm_clock_mhz = series["sm_clock_mhz"].view() if "sm_clock_mhz" in series else ()
    if shown_only:
        return History(step_time_s=ring.column(ring.WALL, n), mfu=mfu, tensor_active=tensor_active,
                       power_w=power_w, sm_clock_mhz=sm_clock_mhz)
    steps, walls, waits, leads, reached_steps, reached_at = ring.history_columns(n)
    return History(steps=steps, step_time_s=walls, input_wait_s=waits, lead_s=leads, mfu=mfu,
                   tensor_active=tensor_active, power_w=power_w, sm_clock_mhz=sm_clock_mhz,
                   reached=PairSeq(reached_steps, reached_at))
