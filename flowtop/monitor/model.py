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
"""

from __future__ import annotations

import bisect
import collections
import logging
from dataclasses import replace
from typing import Any, Iterable, Protocol

from flowtop.monitor import accounting, parallelism
from flowtop.monitor import rankstate as rs
from flowtop.monitor.claims import Claims, Rows, Seen, SoleRows, newest_per
from flowtop.monitor.clock import TICK_S
from flowtop.monitor.kernels.aggregate import KernelWindowStats
from flowtop.monitor.kernels.merge import JobKernelStats
from flowtop.monitor.limits import Limits, TokenBucket
from flowtop.monitor.relays import Relays
from flowtop.monitor.notices import Notices
from flowtop.monitor.rankstate import EVICT_AFTER_S, RING, STALE_AFTER_S, STALE_AFTER_STEPS, RankState  # noqa: F401 (re-exported)
from flowtop.monitor.rankkernels import KernelTables, Submit, add_window, build_window
from flowtop.monitor.rankviews import RankViews, as_now
from flowtop.monitor.rotation import (  # noqa: F401 (RANKS_PER_TICK re-exported)
    RANKS_PER_TICK, SPREADS, Prepared, hint_share, prepares, ticks_per_round)
from flowtop.monitor.sanitize import clean, interned
from flowtop.monitor.snapshot import Hint, JobSnapshot, MonitorSnapshot
from probe import wire
from probe.wire import Message, RankKey, StepColumns, step_columns

_log = logging.getLogger("flowtop.model")

def _newest_step_s(ranks: tuple[Any, ...], states: list[RankState], now: float) -> float | None:
    """Seconds since the newest step of a job none of whose ranks steps (each stalled, or stale:
    the usual hang is one rank dead and the others stuck in a collective), else None."""
    if not ranks or any(r.status == "live" for r in ranks):
        return None
    since = [now - r.behind_s - st.steps.last_recv() for r, st in zip(ranks, states) if r.status != "done" and st.steps]
    return min(since) if since else None


#: A rank's bye makes the model evaluate its job's hints once more while the rank still runs
#: (its last look: what the job's final hints say, see HintEngine's ended hints), unless the
#: hints were evaluated since its last step arrived. Looks per job are rate-limited (per
#: second, burst): at the end of a thousand-rank job each look costs a job snapshot.
LAST_LOOKS_PER_S, LAST_LOOK_BURST = 4.0, 8


class HintEvaluator(Protocol):
    """What the model asks of its hint engine (flowtop.monitor.hints.HintEngine; tests pass their
    own). An engine may also have ``report`` (set to the model's notices) and ``forget(job)``."""

    def evaluate(self, job: JobSnapshot, now: float, phase: tuple[int, int] | None = None) -> Iterable[Hint]:
        """``phase`` (k, n): measure only the rules of share k of n now, hold the others' hints."""
        ...


class Model:
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
        self._keys_version = 0  # changes whenever a rank key comes or goes (self._sole's cache)
        #: Jobs dropped after :data:`EVICT_AFTER_S` of being finished or silent.
        self.evicted_jobs = 0
        #: Ticks run (the turn of a large job's ranks and hints, see RANKS_PER_TICK).
        self.ticks = 0
        #: Node relays heard of, and which relay each rank's frames come through (flowtop.monitor.relays).
        self.relays = Relays()
        self.views = RankViews(peak_override_flops)
        #: A tick rebuilds RANKS_PER_TICK ÷ spread ranks of a large job (one of SPREADS).
        self.spread = 1
        self._hints: dict[str, tuple[Hint, ...]] = {}  # job -> hints of its last evaluation
        #: Monitor-side errors for the user (the UI shows them as notifications).
        self.notices = Notices()
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

    def reject(self, reason: str) -> None:
        """Count a frame that failed validation (reasons are bucketed by prefix)."""
        self.rejected += 1
        bucket = reason[:100]
        if len(self.rejected_reasons) < 100 or bucket in self.rejected_reasons:
            self.rejected_reasons[bucket] += 1

    def ingest(self, msg: Message, now: float, via: str | None = None) -> None:
        """Apply one validated message received at monitor time ``now`` (through relay ``via``)."""
        if msg.kind == "relay":  # a relay's own figures: no rank
            self.received += 1
            self.relays.report(msg, now)
            return
        st = self.ranks.get(msg.key)
        if st is not None:
            why = rs.implausible(st, msg, now)
            if why:
                self.reject(why)
                return
        elif not self._admit(msg.key, now):
            return
        self.received += 1
        self._now = max(self._now, now)
        if st is None:
            st = self.ranks[msg.key] = RankState(key=msg.key, first_seen=now, last_recv=now)
            self._keys_version += 1
            self._job_sizes[msg.key.job] += 1
        st.last_recv = now
        self.relays.saw(msg.key, via)
        st.via = via
        st.version += 1
        if st.last_seq >= 0 and msg.seq > st.last_seq + 1:
            st.lost += msg.seq - st.last_seq - 1
        st.last_seq = max(st.last_seq, msg.seq)
        f = msg.fields
        if msg.kind in ("bye", "flops", "telemetry"):
            f = clean(f)  # remote text is shown in terminals: no control sequences
        if msg.kind == "hello":
            # Re-sent every 2-10 s, nearly always the same: one equal to the one kept (cleaned
            # when it came) is clean too, and is not walked again.
            if f != st.hello:
                st.hello = interned(clean(f))
        elif (cols := step_columns(msg)) is not None:  # "step", "steps" (MINOR 2), "stepcols" (MINOR 3)
            self._on_steps(st, cols, now)
        elif msg.kind == "flops":
            st.flops = interned(f)
        elif msg.kind == "telemetry":
            st.telemetry = dict(f)  # not interned: replaced every second, the CPU would cost more (bench --costs)
            st.telemetry_at = now
            dev = f.get("gpu", {})
            st.push_series("tensor_active", dev.get("tensor_active"))
            st.push_series("power_w", dev.get("power_w"))
            st.push_series("sm_clock_mhz", dev.get("sm_clock_mhz"))
            st.push_series("mfu", self._rank_mfu(st, now))
        elif msg.kind == "kernels" and self.kernels is not None:
            window = msg.frame if msg.frame is not None else dict(f)  # the frame: its envelope alone was read
            if self.kernels.submit is not None:
                self.kernels.submit(msg.key, window)
            else:
                try:
                    stats = build_window(window)
                except wire.WireError as exc:  # a frame whose envelope alone was read: bad fields
                    self.reject(str(exc))
                    return
                self.apply_kernels(msg.key, stats)
        elif msg.kind == "bye":
            self._judged.void(st.key.job)  # histories taken with the rank running
            self._last_look(st, now)
            st.bye = str(f.get("reason", "exit"))
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

    def _by_job(self) -> dict[str, list[RankState]]:
        by_job: dict[str, list[RankState]] = collections.defaultdict(list)
        for st in self.ranks.values():
            by_job[st.key.job].append(st)
        return by_job

    def _forget(self, st: RankState) -> None:
        del self.ranks[st.key]
        self._keys_version += 1
        self.relays.forget(st.key)
        self.views.forget(st.key)
        job = st.key.job
        self._job_sizes[job] -= 1
        if self._job_sizes[job] <= 0:
            del self._job_sizes[job]
            self._merged.pop(job, None)
            self._merged_round.pop(job, None)
            self._hints_seen.pop(job, None)
            self._judged.void(job)
            self._looks.pop(job, None)
            self._hints.pop(job, None)
            self._claims.forget_job(job)
            forget = getattr(self._hint_engine, "forget", None)
            if forget is not None:
                forget(job)

    def _on_steps(self, st: RankState, cols: StepColumns, now: float) -> None:
        """Append a frame's step records (columns, oldest first) received at ``now``; records at
        or before the rank's newest step are duplicates or reordered: steps stay monotonic."""
        steps = cols.step
        first = bisect.bisect_right(steps, st.step) if st.steps else 0
        if first >= len(steps):
            return  # every record seen already: a stale frame's totals and device time are old too
        st.steps.extend(steps, cols.wall_s, cols.tokens, cols.input_wait_s, cols.lead_s, now, first, cols.finite)
        st.step = steps[-1]
        for column, into in ((cols.probe_s, st.probe_s), (cols.stage_s, st.stage_s)):
            if column is not None:
                part = column[first:] if first else column
                if cols.finite or (total := sum(part)) == total:
                    into.extend(part)
                else:
                    into.extend([x for x in part if x == x])  # NaN: not sent
        st.drops = max(st.drops, cols.drops)
        st.commands_refused = max(st.commands_refused, cols.commands_refused)
        if cols.device_s is not None:
            st.device_s = cols.device_s

    # --- ticks and snapshots -----------------------------------------------------------

    def _rank_mfu(self, st: RankState, now: float) -> float | None:
        """The rank's MFU now, as its view would show it (the sparkline's sample)."""
        if st.flops is None:
            return None
        med = rs.median_step(st)
        stalled = rs.stalled_for(st, now, med)
        return accounting.rank_mfu(st.flops, med, self.peak_override_flops, rs.tokens_per_s(st, med, stalled), stalled)

    def tick(self, now: float, listen: str = "") -> MonitorSnapshot:
        """Advance what the clock drives, at monitor time ``now``: forget finished jobs, evaluate
        every job's hints (their hysteresis advances here and at a rank's bye, nowhere else) and
        return the snapshot of that instant. Called at a fixed cadence (flowtop.monitor.ticker)."""
        self._now = max(self._now, now)
        self.ticks += 1
        self._evict(now)
        by_job = self._view(None, now, remember=True)
        jobs = []
        for job, shown in sorted(by_job.items()):
            spread = self.ticks_per_round(len(shown))
            snap = self._job_snapshot(job, shown, now, rotation=(self.ticks, spread) if spread > 1 else None)
            if spread == 1:
                jobs.append(self._evaluate(snap, now))
            elif (share := hint_share(self.ticks, spread)) is not None:
                jobs.append(self._evaluate(snap, now, share, [st for st, _ in shown]))
            else:
                if self._hint_engine is not None and prepares(self.ticks, spread):
                    self._prepare(snap, now, [st for st, _ in shown])
                jobs.append(replace(snap, hints=self._hints.get(job, ())))
        self._judged.expire(self.ticks)
        return self._monitor_snapshot(now, listen, tuple(jobs))

    def _prepare(self, snap: JobSnapshot, now: float, states: list[RankState]) -> None:
        """Take the histories the next tick's share of ``snap``'s rules reads (see rotation.Prepared)."""
        try:
            self._judged.keep(snap.job, self.ticks, now, list(states), self._as_now(snap, states))
        except Exception:  # the share's tick takes them itself, and says what went wrong
            self._judged.void(snap.job)

    def ticks_per_round(self, ranks: int) -> int:
        """Ticks a job of ``ranks`` ranks takes to rebuild every view and measure every rule."""
        return ticks_per_round(ranks, self.spread)

    def largest_job(self) -> int:
        """Ranks of the largest job (0 with none)."""
        return max(self._job_sizes.values(), default=0)

    def set_spread(self, spread: int) -> None:
        """Spread large jobs' ticks ``spread`` times thinner (one of SPREADS): live, by the
        collector's load (flowtop.monitor.thinning); in a replay, where the recording says."""
        if spread not in SPREADS:
            raise ValueError(f"tick spread must be one of {SPREADS}, got {spread!r}")
        self.spread = spread

    def snapshot(self, now: float, listen: str = "", light: bool = False) -> MonitorSnapshot:
        """An immutable view of everything at monitor time ``now``, with the hints of the last
        tick. A pure read: nothing is evicted, no hint advances, taking it changes nothing.

        ``light``: a glance between two ticks (flowtop.monitor.collector): each rank's step and liveness
        now, its figures from its last full view (a rank never shown gets one)."""
        by_job = self._view(None, now, remember=False)
        jobs = tuple(self._job_snapshot(job, shown, now, self._hints.get(job, ()), rotation=(0, 0) if light else None)
                     for job, shown in sorted(by_job.items()))
        return self._monitor_snapshot(now, listen, jobs)

    def _monitor_snapshot(self, now: float, listen: str, jobs: tuple[JobSnapshot, ...]) -> MonitorSnapshot:
        return MonitorSnapshot(
            taken_at=now,
            listen=listen,
            jobs=jobs,
            received=self.received,
            rejected=self.rejected,
            rejected_reasons=dict(self.rejected_reasons),
            ranks_evicted_for_room=self.ranks_evicted_for_room,
            relays=self.relays.snapshot(now),
        )

    def _view(self, states: Any, now: float, remember: bool) -> Rows[RankState]:
        """Per job, the rank processes it shows (by rank, host, pid), each with the other
        processes that claim its rank number (see flowtop.monitor.claims; ``remember``: a tick's view,
        which updates the conflicts remembered). ``states`` None: every rank (read-only rows)."""
        if states is None:
            sole = self._sole.get(self.ranks, self._keys_version, self._claims)
            if sole is not None:
                return sole
            states = self.ranks.values()
        states = list(states)
        at = self._judged_at
        seen = [Seen(st.key, rs.running(st, at(st, now)), bool(st.steps), st.last_recv) for st in states]
        shown = self._claims.shown(seen, remember)
        by_job: dict[str, list[tuple[RankState, tuple[RankKey, ...]]]] = collections.defaultdict(list)
        for st in sorted(states, key=lambda st: (st.key.job, st.key.rank, st.key.host, st.key.pid, st.key.inc)):
            if st.key in shown:
                by_job[st.key.job].append((st, shown[st.key]))
        return by_job

    def _last_look(self, leaving: RankState, now: float) -> None:
        """Evaluate the hints of the job of ``leaving`` once more before it ends (LAST_LOOKS_PER_S)."""
        job = leaving.key.job
        if self._hint_engine is None or not leaving.steps:
            return
        if leaving.steps.last_recv() <= min(self._hints_seen.get(job, (float("-inf"),))):
            return  # the hints have seen its last step already
        if not self._looks.setdefault(job, TokenBucket(LAST_LOOKS_PER_S, LAST_LOOK_BURST)).take(now):
            return
        shown = self._view((st for st in self.ranks.values() if st.key.job == job), now, remember=True).get(job)
        if shown:
            spread = self.ticks_per_round(len(shown))  # a large job's look rebuilds only this tick's share
            self._evaluate(self._job_snapshot(job, shown, now, rotation=(self.ticks, spread) if spread > 1 else None),
                           now, states=[st for st, _ in shown] if spread > 1 else None)

    def _job_snapshot(self, job: str, shown: list[tuple[RankState, tuple[RankKey, ...]]], now: float,
                      hints: tuple[Hint, ...] = (), rotation: tuple[int, int] | None = None) -> JobSnapshot:
        """``rotation`` (tick number, ticks per full refresh): only the ranks whose turn it is get
        a full view (see RANKS_PER_TICK); ticks per full refresh 0: none (a glance)."""
        states = [st for st, _ in shown]
        # A large job's hints read histories taken when they are measured (_as_now): its views
        # keep what the UI shows (rankstate.history).
        slim = self.ticks_per_round(len(shown)) > 1
        # Each rank as of its relay's latest report (behind a backlog its frames arrive late). In
        # turns, the turn follows the rank number, not the row: a rank's turn comes every `spread`
        # ticks whoever joins or leaves the job meanwhile; a glance is nobody's turn.
        ranks = self.views.views(shown, now, self.relays.lag_of, turn=rotation if rotation and rotation[1] else None,
                                 glance=rotation is not None and rotation[1] == 0, shown_only=slim)
        ranks = self.relays.mark(ranks, states, now, self.peak_override_flops)  # relay, silent relay
        live = [r for r in ranks if r.status == "live"] or list(ranks)
        world = max([int(st.hello.get("world_size", 0)) for st in states] + [len(ranks)])
        times = [r.step_time_s for r in live if r.step_time_s]
        if all(r.status == "done" for r in ranks):
            status = "done"
        elif any(r.status == "live" for r in ranks):
            status = "running"
        elif any(r.status == "stalled" for r in ranks):
            status = "stalled"
        else:
            status = "stale"
        # While running, ranks that finished no longer add throughput; once the job is
        # done, the totals describe its last steady state. Stalled and stale ranks add 0.
        counted = [r for r in ranks if r.status != "done" or status == "done"]
        # Once per data-parallel replica where every rank's coordinates are known (flowtop.monitor.parallelism).
        tokens_per_s, tokens_basis = parallelism.job_tokens(counted)
        merged = self._merged_kernels(job, states, rotation) if self.kernels is not None else None
        return JobSnapshot(
            job=job,
            world_size=world,
            ranks=ranks,
            step=min(r.step for r in live),
            step_time_s=max(times) if times else None,
            tokens_per_s=tokens_per_s,
            flops=parallelism.job_flops_per_token(
                accounting.job_flops([r.flops for r in counted], _newest_step_s(ranks, states, now)),
                counted, tokens_basis),
            status=status,
            kernels_merged=merged,
            rank_conflicts=len({r.rank for r in ranks if r.conflict}),
            hints=hints,
            tokens_basis=tokens_basis,
            stages=parallelism.pipeline_stages(counted),
        )

    def _merged_kernels(self, job: str, states: list[RankState],
                        rotation: tuple[int, int] | None) -> JobKernelStats | None:
        """The job's kernel tables merged. Merging only changes when some rank gets a new window:
        reused between windows instead of recomputed for every 2 Hz snapshot. A job too large to
        rebuild every view at a tick (``rotation``: tick, ticks a round) shows at its ticks the
        merge taken once a round, like its ranks' figures (some of its thousands of ranks bring a
        window nearly every tick, and a merge of 4,096 tables took ~5 % of the interpreter live);
        only ticks take it, so a glance or a snapshot between ticks changes nothing a replay of
        the ticks would not see."""
        if rotation is None or rotation[1] <= 1:
            return self._merge(job, states)
        held = self._merged_round.get(job)
        if held is not None and self.ticks - held[1] < rotation[1]:
            return held[0]
        merged = self._merge(job, states)
        self._merged_round[job] = (merged, self.ticks)
        return merged

    def _merge(self, job: str, states: list[RankState]) -> JobKernelStats | None:
        """The merge of the job's tables as they are (cached by the windows they hold)."""
        assert self.kernels is not None
        tables = {st.key.rank: st.kernels_cumulative for st in states if st.kernels_cumulative is not None}
        version = tuple(sorted((r, id(t), t.windows) for r, t in tables.items()))
        cached = self._merged.get(job)
        if cached is not None and cached[0] == version:
            return cached[1]
        merged = self.kernels.merge(tables) if len(tables) > 1 else None
        self._merged[job] = (version, merged)
        return merged

    def _evaluate(self, snap: JobSnapshot, now: float, phase: tuple[int, int] | None = None,
                  states: list[RankState] | None = None) -> JobSnapshot:
        """Evaluate the job's hints at ``now`` (advancing their hysteresis; ``phase``: a share of
        the rules, see HintEvaluator) and keep them for the snapshots until the next evaluation.
        ``states``: the ranks' states, in the order of ``snap``'s, for a large job whose views are
        rebuilt in turns: its hints read every rank's history as it is now (see _as_now)."""
        if self._hint_engine is None:
            return snap
        try:
            taken = self._judged.take(snap.job, self.ticks, now, states) if phase is not None and states else None
            judged = taken[1] if taken else self._as_now(snap, states) if states is not None else snap
            self._seen_by_hints(snap.job, taken[0] if taken else now, phase)  # as of the histories read
            hints = tuple(self._hint_engine.evaluate(judged, now, phase))
        except Exception as exc:  # a hints bug must not cost the user every snapshot
            if not self._hints_failed:
                self._hints_failed = True
                _log.exception("hint engine failed; snapshots go on without hints")
                self.notices.error(f"hints stopped: the hint engine raised {type(exc).__name__}: {exc}", now)
            return replace(snap, hints=self._hints.get(snap.job, ()))
        self._hints[snap.job] = hints
        return replace(snap, hints=hints)

    @staticmethod
    def _as_now(snap: JobSnapshot, states: list[RankState]) -> JobSnapshot:
        """``snap`` with each rank's history and telemetry as they are now, where its view (a
        large job's, between two of its turns) holds them as of its last turn, up to a round old.
        The cross-rank rules align ranks by step: histories taken up to 32 s apart (spread 8) had
        no step in common at a 200 ms step, and a straggler went unseen; the hang and input-wait
        rules read time from them (measures_time._current). A large job's views hold only the
        history the UI shows (rankstate.history), so every rank that has steps gets its whole
        history here (~30 µs a rank in a 4,096-rank model, ~120 ms, once per share of the rules,
        at the tick before the share's: rotation.Prepared; a rank that had not stepped since its
        turn was skipped before, but its view kept its ring's dropped blocks alive for a round),
        and its telemetry where it sampled again since its view."""
        ranks, renewed = list(snap.ranks), False
        for i, (view, st) in enumerate(zip(snap.ranks, states, strict=True)):
            reached = view.history.reached  # empty in a view that holds only what is shown
            stepped = bool(st.steps) and (not reached or reached[-1][0] < st.step)
            # A rank with a slow step (10 s and more) has not stepped since its turn, but its
            # telemetry went on: read as of now, a round-old reading looked like a dead NVML's.
            sampled = st.telemetry is not None and (view.telemetry is None
                                                    or view.telemetry.received_at < st.telemetry_at)
            if stepped or sampled:
                ranks[i] = as_now(view, st, stepped)
                renewed = True
        return replace(snap, ranks=tuple(ranks)) if renewed else snap

    def _seen_by_hints(self, job: str, now: float, phase: tuple[int, int] | None) -> None:
        """Note when each share of ``job``'s rules last measured it (a rank's bye asks whether all
        saw its last step, see _last_look); a change of shares starts from the oldest."""
        share, n = phase or (0, 1)
        seen = self._hints_seen.get(job)
        if seen is None or len(seen) != n:
            seen = self._hints_seen[job] = [min(seen) if seen else float("-inf")] * n
        seen[share] = now

    def _hint_failed(self, text: str) -> None:
        """The hint engine's report of a rule that raised (its hints are held)."""
        self.notices.warning(text, self._now)

    def _judged_at(self, st: RankState, now: float) -> float:
        """The monitor time as of which ``st`` is judged live, stalled or gone: its relay's latest
        report, ``now`` less that batch's queueing lag (``now`` for a rank heard directly)."""
        return now - self.relays.lag_of(st.via)

    def _evict(self, now: float) -> None:
        """Forget finished or silent jobs (and superseded incarnations) after EVICT_AFTER_S."""
        # A rank heard within EVICT_AFTER_S is not gone, whatever its relay's lag (it only
        # moves the judged time back): most ticks find none of thousands of ranks silent that
        # long, without a lag lookup or a job's list each.
        if all(now - st.last_recv <= rs.EVICT_AFTER_S for st in self.ranks.values()):
            return
        for states in self._by_job().values():
            gone = [st for st in states if rs.gone(st, self._judged_at(st, now))]
            if len(gone) == len(states):
                self.evicted_jobs += 1  # its per-job state goes with its last rank (_forget)
            else:
                # Only old incarnations the view no longer shows (a newer one of the rank exists).
                newest = newest_per(states, lambda st: st.key.rank, lambda st: st.key.inc)
                gone = [st for st in gone if st.key.inc < newest[st.key.rank].key.inc]
            for st in gone:
                self._forget(st)
