"""The job/rank model: validated messages in, immutable snapshots out. No Textual.

Ranks are keyed by (job, host, pid, rank, incarnation) as the wire sends them;
a job's view shows the newest incarnation of each rank number, or every process of a
rank number that several running processes claim (a conflict, see flowtop.monitor.claims).
Liveness uses the monitor's receive clock (``now`` passed in), never the sender's clock.

Rank status: ``done`` (said bye), ``stale`` (silent for max(5 s, 5 median steps)),
``stalled`` (still talking — the probe's sender thread heartbeats while training is
stuck, e.g. in a collective — but no step for as long), else ``live``. A stale or
stalled rank reports tokens/s, FLOP/s, MFU and HFU of 0: the medians of its past steps
would keep showing full speed. Job status: ``done`` when every rank is, ``running``
while any rank is live, ``stalled`` while any is stalled, else ``stale``. A job whose
ranks have all been done or stale for :data:`EVICT_AFTER_S` is dropped.

Reading and advancing are apart: :meth:`snapshot` is a pure read (the same state gives the
same snapshot, whenever and however often it is taken), while :meth:`tick`, called at a fixed
cadence on the monitor clock (flowtop.monitor.ticker), evicts and advances the hints' hysteresis —
live and in replay alike, so a replay reproduces the hints without taking snapshots.

:class:`Model` is one class written in four modules, by responsibility: here its state and what
comes in (ingest, admission at the caps); what it says of that (refused frames, a failed rank, a
flood of commands, a refused kernel window) in flowtop.monitor.model_notices; the tick, the hints
and eviction in flowtop.monitor.model_tick; the job views and snapshots in
flowtop.monitor.model_views. They are its bases, not objects it calls: the per-frame and per-tick
paths reach every method through ``self`` as before (no extra call layer), and a method patched on
Model still replaces the one its callers use.
"""

from __future__ import annotations

import bisect
import collections
import math
from array import array

from flowtop.monitor import accounting
from flowtop.monitor import rankstate as rs
from flowtop.monitor.claims import ClaimedAt, Claims, SoleRows, ViewOrder
from flowtop.monitor.compact import Window
from flowtop.monitor.endedjobs import EndedJobs
from flowtop.monitor.hello_asks import HelloAsks
from flowtop.monitor.clock import TICK_S
from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.kernels.merge import JobKernelStats
from flowtop.monitor.limits import Limits, TokenBucket
from flowtop.monitor.relays import Relays, flooded_text
from flowtop.monitor.notices import Notices
# Its notices (model_notices), the tick, the hints and eviction (model_tick) and the job views
# (model_views) are Model's bases: one class split by responsibility, whose names stay importable
# from here.
from flowtop.monitor.model_tick import LAST_LOOK_BURST as LAST_LOOK_BURST
from flowtop.monitor.model_tick import LAST_LOOKS_PER_S as LAST_LOOKS_PER_S
from flowtop.monitor.model_tick import HintEvaluator as HintEvaluator
from flowtop.monitor.model_tick import ModelTicks as ModelTicks
from flowtop.monitor.model_tick import _log as _log
from flowtop.monitor.model_views import ModelViews as ModelViews
from flowtop.monitor.model_notices import MAX_FAILED_JOBS as MAX_FAILED_JOBS
from flowtop.monitor.model_notices import MAX_REASONS as MAX_REASONS
from flowtop.monitor.model_notices import OTHER_REASONS as OTHER_REASONS
from flowtop.monitor.model_notices import REFUSAL_NOTICE_S as REFUSAL_NOTICE_S
from flowtop.monitor.model_notices import REJECT_NOTICE_S as REJECT_NOTICE_S
from flowtop.monitor.model_notices import ModelNotices, _Failing, _first_of
from flowtop.monitor.rankstate import EVICT_AFTER_S, RING, STALE_AFTER_S, STALE_AFTER_STEPS, RankState  # noqa: F401 (re-exported)
from flowtop.monitor.rankkernels import KernelTables, Submit, add_window, build_window
from flowtop.monitor.rankviews import RankViews
from flowtop.monitor.rotation import RANKS_PER_TICK as RANKS_PER_TICK
from flowtop.monitor.rotation import Prepared
from flowtop.monitor.sanitize import clean, clean_maps
from flowtop.monitor.snapshot import Hint, JobSnapshot, TelemetryView
from probe import wire
from probe.wire import Message, RankKey, StepColumns, step_columns



class Model(ModelNotices):
    """All jobs and ranks the monitor has heard of."""

    def __init__(
        self,
        peak_override_flops: float | None = None,
        kernels: KernelTables | None = None,
        hint_engine: HintEvaluator | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.ranks: dict[RankKey, RankState] = {}
        self.limits = limits or Limits()
        self._new_ranks = TokenBucket(self.limits.new_ranks_per_s, self.limits.new_ranks_burst)
        self._room_scans = TokenBucket(10.0, 10)
        self._job_sizes: collections.Counter[str] = collections.Counter()
        #: Ranks forgotten early to make room for new ones at a cap (the longest silent first).
        self.ranks_evicted_for_room = 0
        self.received = 0
        self.rejected = 0
        self.rejected_reasons: collections.Counter[str] = collections.Counter()
        self._rejects_said = 0  # self.rejected when the last refusal notice was raised
        self._rejects_said_at: float | None = None  # and when (monitor time)
        self._last_reject = ""  # the latest refusal's reason
        self.peak_override_flops = peak_override_flops
        #: How kernel windows become tables (flowtop.monitor.rankkernels); None: they are ignored.
        self.kernels = kernels
        self._hint_engine = hint_engine
        # job -> (windows seen, their merge)
        self._merged: dict[str, tuple[tuple[tuple[int, int, int], ...], JobKernelStats | None]] = {}
        # job -> (the merge a large job's ticks show, the tick it was taken at): see _merged_kernels
        self._merged_round: dict[str, tuple[JobKernelStats | None, int]] = {}
        self._hints_failed = False
        #: job -> per share of its rules, when it was last measured (one entry: all rules at once)
        self._hints_seen: dict[str, list[float]] = {}
        #: job -> the histories a large job's next share of rules reads, taken a tick before (_as_now)
        self._judged: Prepared[JobSnapshot] = Prepared(within_s=1.5 * TICK_S)
        self._looks: dict[str, TokenBucket] = {}  # job -> budget of last looks
        self._claims = Claims()
        self._sole: SoleRows[RankState] = SoleRows()
        self._order: ViewOrder[RankState] = ViewOrder()  # every rank in the view's order (a restart's ticks)
        self._claimed_at = ClaimedAt()  # rank numbers two processes hold: when the newest was first seen
        self._keys_version = 0  # changes whenever a rank key comes or goes (self._sole's and _order's caches)
        #: Jobs dropped after :data:`EVICT_AFTER_S` of being finished or silent.
        self.evicted_jobs = 0
        self._heard_since = -math.inf  # no rank was last heard before this (see ModelTicks._evict)
        #: Ticks run (the turn of a large job's ranks and hints, see RANKS_PER_TICK).
        self.ticks = 0
        #: Node relays heard of, and which relay each rank's frames come through (flowtop.monitor.relays).
        self.relays = Relays()
        #: Ranks the live monitor may ask for their hello and count (flowtop.monitor.hello_asks).
        self.hello_asks: HelloAsks | None = None
        self.views = RankViews(peak_override_flops)
        #: A tick rebuilds RANKS_PER_TICK ÷ spread ranks of a large job (one of SPREADS).
        self.spread = 1
        self._hints: dict[str, tuple[Hint, ...]] = {}  # job -> hints of its last evaluation
        self._hot_of: dict[str, tuple[tuple[Hint, ...], frozenset[int]]] = {}  # see ModelViews._hot
        self._ended_jobs = EndedJobs()  # ended jobs' snapshots, reused while nothing of theirs changes
        #: Monitor-side errors for the user (the UI shows them as notifications).
        self.notices = Notices()
        self._failed_jobs: set[tuple[str, int]] = set()  # (job, incarnation) whose failure was said (_say_failures)
        self._failing: dict[tuple[str, int], _Failing] = {}  # (job, incarnation) whose failure is to be said (_failed)
        self._flooded_jobs: set[str] = set()  # jobs whose first flooded rank was said (_flooded)
        self._flooded_relays: set[str] = set()  # relays whose dropped commands were said
        self._now = 0.0  # latest monitor time seen (a frame's or a tick's), to date notices
        if hint_engine is not None and hasattr(hint_engine, "report"):
            hint_engine.report = self._hint_failed

    # --- ingest ---------------------------------------------------------------------

    @property
    def builds_kernels(self) -> bool:
        """Whether this model turns kernel windows into tables (it was given KernelTables)."""
        return self.kernels is not None

    def offload_kernels(self, submit: Submit) -> None:
        """Send kernel windows to ``submit``, which builds them elsewhere and hands them back
        through :meth:`apply_kernels` (flowtop.monitor.kernel_worker)."""
        if self.kernels is not None:
            self.kernels = self.kernels.offloaded(submit)

    def apply_kernels(self, key: RankKey, stats: KernelWindowStats) -> None:
        """A built window: into the rank's tables, unless the rank is gone."""
        st = self.ranks.get(key)
        if st is not None and self.kernels is not None:
            add_window(st, stats)
            st.version += 1

    def build_kernels_here(self) -> None:
        """Build kernel windows inline again (the collector that built them elsewhere stopped)."""
        if self.kernels is not None:
            self.kernels = self.kernels.inline()

    @property
    def now(self) -> float:
        """The latest monitor time the model has seen (a frame's or a tick's): what dates a notice
        raised between the two."""
        return self._now

    def knows(self, key: RankKey) -> bool:
        """Whether the model holds the rank ``key``."""
        return key in self.ranks

    def ingest(self, msg: Message, now: float, via: str | None = None) -> None:
        """Apply one validated message received at monitor time ``now`` (through relay ``via``)."""
        # One unpack of the message: a NamedTuple's field is a descriptor the interpreter does not
        # specialize (~280 instructions a read, callgrind), an unpack is one C pass.
        kind, key, seq, sent_at, f, cols, frame, said = msg
        if kind == "relay":  # a relay's own figures: no rank
            self.received += 1
            dropped = self.relays.report(msg, now)
            if dropped and _first_of(self._flooded_relays, str(f["relay"])):  # as a job's (_flooded)
                self.notices.warning(flooded_text(key.host, dropped), now)
            return
        # Every frame comes through here (~9 k step frames a second at 4,096 ranks): max(a, b) is
        # written ``b if b > a else a`` (the same value; the builtin parses keywords at each call,
        # ~0.7 k instructions).
        # "step", "steps" (MINOR 2), "stepcols" (MINOR 3): their records as columns
        # A "step"/"steps" message built by hand (tests, tools) gets its columns here; any other
        # kind's are its own ``steps`` (no call: ~2 k instructions of a telemetry frame, callgrind).
        if cols is None and (kind == "step" or kind == "steps"):
            cols = step_columns(msg)
        st = self.ranks.get(key)
        if st is not None:
            why = rs.implausible(st, seq, now, cols.step if cols is not None else None)
            if why:
                self.reject(why)
                return
        elif not self._admit(key, now):
            return
        self.received += 1
        if now > self._now:
            self._now = now
        if st is None:
            st = self.ranks[key] = RankState(key=key, first_seen=now, last_recv=now)
            self._keys_version += 1
            self._job_sizes[key.job] += 1
            if self.hello_asks is not None:  # one that ran before: maybe a rank this monitor forgot
                self.hello_asks.first_heard(msg, now)
        st.last_recv = now
        self.relays.saw(key, via)
        st.via = via
        st.version += 1
        last_seq = st.last_seq
        if last_seq >= 0 and seq > last_seq + 1:
            st.lost += seq - last_seq - 1
        if seq > last_seq:
            st.last_seq = seq
        if now - sent_at < st.clock_lead:  # the rank's clock to the monitor's: its least transit (RankState)
            st.clock_lead = now - sent_at
        # Frames the training thread queues, in order: a hello is stamped at the sender's round and
        # sent first, telemetry when its sampling ends and put ahead of the queue (a bye queued
        # meanwhile leaves after it, stamped earlier: a reviewer's crash read as a stop)
        if sent_at > st.sent_max and kind != "hello" and kind != "telemetry":
            st.sent_max = sent_at
        if cols is not None and kind != "hello":  # as the kinds' order below had it
            self._on_steps(st, cols, now)
            return
        if kind in ("bye", "flops"):
            f = clean(f)  # remote text is shown in terminals: no control sequences
        if kind == "hello":
            # Its step and that step's age change at every hello: kept apart (rankstate.heard_step).
            rs.heard_step(st, said, now)
            # Re-sent every 2-10 s, nearly always the same: its record is made again only when
            # the fields it is made of differ from the kept one's (rankstate.heard_hello).
            rs.heard_hello(st, f)
        elif kind == "flops":
            st.flops = wire.flops_report(f)  # its text interned: every rank names the same
        elif kind == "telemetry":
            # Cleaned as bye and flops are, its maps equal to the rank's last ones not walked again
            # (sanitize.clean_maps). Not interned: replaced every second, the CPU would cost more
            # (bench --costs).
            last = st.telemetry
            f = clean_maps(f, (last.device, last.host, last.reasons) if last is not None else ())
            dev = f["gpu"]
            st.telemetry = TelemetryView(device=dev, host=f["proc"], reasons=f.get("reasons", {}), received_at=now)
            st.push_telemetry(dev, self._rank_mfu(st, now))
        elif kind == "kernels" and self.kernels is not None:
            window = frame if frame is not None else dict(f)  # the frame: its envelope alone was read
            if self.kernels.submit is not None:
                self.kernels.submit(key, window)
            else:
                try:
                    stats = build_window(window)
                except wire.WireError as exc:  # a frame whose envelope alone was read: bad fields
                    self.reject(str(exc))
                    return
                self.apply_kernels(key, stats)
        elif kind == "bye":
            self._judged.void(st.key.job)  # histories taken with the rank running
            self._last_look(st, now)
            st.bye = str(f.get("reason", "exit"))
            st.ended_at = rs.bye_time(st, sent_at, now)
            if st.bye.startswith(wire.BYE_ERROR_PREFIX):
                self._failed(st, now)
            st.version += 1  # the last look's view was of a running rank
            st.drops = max(st.drops, int(f.get("drops", 0)))

    def _admit(self, key: RankKey, now: float) -> bool:
        """Whether a frame of a rank key never seen may create it (see flowtop.monitor.limits)."""
        lim = self.limits
        if not self._new_ranks.take(now):
            self.reject("new rank refused: more new ranks per second than the monitor admits")
            return False
        if key.job not in self._job_sizes and len(self._job_sizes) >= lim.max_jobs:
            if not self._make_room(now, whole_job=True):
                self.reject("new rank refused: the monitor's job limit is reached")
                return False
        if self._job_sizes[key.job] >= lim.max_ranks_per_job:
            if not self._make_room(now, job=key.job):
                self.reject("new rank refused: the job's rank limit is reached")
                return False
        elif len(self.ranks) >= lim.max_ranks and not self._make_room(now):
            self.reject("new rank refused: the monitor's rank limit is reached")
            return False
        return True

    def _make_room(self, now: float, job: str | None = None, whole_job: bool = False) -> bool:
        """Forget the longest-silent ended rank (of ``job`` when given), or with ``whole_job`` the
        longest-silent job whose ranks have all ended; False when there is none.

        A scan of every rank costs ~60 ms at 65 k ranks: scans are rate-limited too, so a flood
        at a cap is refused without one."""
        if not self._room_scans.take(now):
            return False
        def ended(st: RankState) -> bool:
            return st.bye is not None or now - st.last_recv > rs.limit(rs.median_step(st))

        if whole_job:
            done = [states for states in self._by_job().values() if all(ended(st) for st in states)]
            if not done:
                return False
            for st in max(done, key=lambda states: now - max(st.last_recv for st in states)):
                self._forget(st)
                self.ranks_evicted_for_room += 1
            return True
        candidates = [st for st in self.ranks.values() if (job is None or st.key.job == job) and ended(st)]
        if not candidates:
            return False
        self._forget(min(candidates, key=lambda st: st.last_recv))
        self.ranks_evicted_for_room += 1
        return True

    def _on_steps(self, st: RankState, cols: StepColumns, now: float) -> None:
        """Append a frame's step records (columns, oldest first) received at ``now``; records at
        or before the rank's newest step are duplicates or reordered: steps stay monotonic."""
        # every field in one unpack (a StepColumns field read by name: ~280 instructions each)
        steps, wall, tokens, wait, lead, probe, stage, device, drops, refused, dropped, finite = cols
        ring = st.steps
        # The common case first: the frame's oldest record is past the rank's newest step (what
        # bisect_right says then, ~1.5 k instructions); a ring without steps takes them all.
        first = 0 if (steps and steps[0] > st.step) or not ring else bisect.bisect_right(steps, st.step)
        if first >= len(steps):
            return  # every record seen already: a stale frame's totals and device time are old too
        ring.extend(steps, wall, tokens, wait, lead, now, first, finite)
        st.step = steps[-1]
        if probe is not None:  # _extend_sent's common case without its call
            if finite and not first:
                st.probe_s.extend(probe)
            else:
                _extend_sent(st.probe_s, probe, first, finite)
        if stage is not None:
            _extend_sent(st.stage_s, stage, first, finite)
        if drops > st.drops:
            st.drops = drops
        if refused > st.commands_refused:
            if now - st.kernels_asked_at < REFUSAL_NOTICE_S:
                self._refused(st, now)
            st.commands_refused = refused
        if dropped > st.commands_dropped:
            if not st.commands_dropped:
                self._flooded(st, dropped, now)
            st.commands_dropped = dropped
        if device is not None:
            st.device_s = device

    def _rank_mfu(self, st: RankState, now: float) -> float | None:
        """The rank's MFU now, as its view would show it (the sparkline's sample)."""
        if st.flops is None:
            return None
        med = rs.median_step(st)
        stalled = rs.stalled_for(st, now, med)
        return accounting.rank_mfu(st.flops, med, self.peak_override_flops, rs.tokens_per_s(st, med, stalled), stalled)


def _extend_sent(into: Window, column: array, first: int, finite: bool) -> None:
    """Append a step column's values from record ``first`` on to ``into``, but NaN (not sent);
    ``finite``: the frame's decode found none."""
    part = column[first:] if first else column
    if finite or (total := sum(part)) == total:
        into.extend(part)
    else:
        into.extend([x for x in part if x == x])  # NaN: not sent

