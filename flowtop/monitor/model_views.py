"""Job-view assembly for flowtop.monitor.model: the rank processes each job shows and the job
snapshots built from them. No Textual.

A base of :class:`flowtop.monitor.model.Model`, not a separate object: the snapshot's and the tick's
hot paths reach these methods through ``self`` exactly as when they were written in one class (no
extra call layer). It holds no state of its own; the attributes declared below are set by
``Model.__init__`` (declared here so that the type checker knows what these methods read).
"""

from __future__ import annotations

import collections
from typing import Any, Iterable, Mapping

from flowtop.monitor import accounting, parallelism
from flowtop.monitor import rankstate as rs
from flowtop.monitor.claims import NONE_CLAIMED, ClaimedAt, Claims, Rows, Seen, SoleRows, ViewOrder, view_order
from flowtop.monitor.endedjobs import EndedJobs
from flowtop.monitor.kernels.merge import JobKernelStats
from flowtop.monitor.rankfilter import hinted_ranks
from flowtop.monitor.rankkernels import KernelTables
from flowtop.monitor.rankstate import RankState
from flowtop.monitor.rankviews import RankViews
from flowtop.monitor.relays import Relays
from flowtop.monitor.relayviews import over_phrase
from flowtop.monitor.rotation import ticks_per_round
from flowtop.monitor.snapshot import ENDED, Hint, JobSnapshot, MonitorSnapshot, job_end_status
from probe.wire import RankKey


#: Most ranks of a large job whose views every tick rebuilds because its hints name them (see
#: ModelViews._hot): a tick's views of 32 more ranks cost ~10 ms at most (~0.3 ms a rank).
HOT_RANKS = 32


def _newest_step_at(ranks: tuple[Any, ...], states: list[RankState]) -> float | None:
    """Monitor time of the newest step (its rank's relay lag added: the snapshot's clock) of a
    job none of whose ranks steps (each stalled, or stale: the usual hang is one rank dead and
    the others stuck in a collective), else None."""
    if not ranks or any(r.status == "live" for r in ranks):
        return None
    # Not a cut rank's: its last step heard is not the job's (model_views: the job is over its heard ranks).
    at = [r.behind_s + st.steps.last_recv() for r, st in zip(ranks, states)
          if r.status not in ENDED and r.cut is None and st.steps]
    return max(at) if at else None


class ModelViews:
    """Snapshots and job views of the model's ranks (see flowtop.monitor.model.Model)."""

    # Set by Model.__init__ (see there for what each holds).
    ranks: dict[RankKey, RankState]
    received: int
    rejected: int
    rejected_reasons: collections.Counter[str]
    ranks_evicted_for_room: int
    peak_override_flops: float | None
    kernels: KernelTables | None
    relays: Relays
    views: RankViews
    spread: int
    ticks: int
    _hints: dict[str, tuple[Hint, ...]]
    _hot_of: dict[str, tuple[tuple[Hint, ...], frozenset[int]]]  # job -> (its hints, _hot's answer)
    _merged: dict[str, tuple[tuple[tuple[int, int, int], ...], JobKernelStats | None]]
    _merged_round: dict[str, tuple[JobKernelStats | None, int]]
    _claims: Claims
    _ended_jobs: EndedJobs
    _sole: SoleRows[RankState]
    _order: ViewOrder[RankState]
    _claimed_at: ClaimedAt
    _keys_version: int

    def ticks_per_round(self, ranks: int) -> int:
        """Ticks a job of ``ranks`` ranks takes to rebuild every view and measure every rule."""
        return ticks_per_round(ranks, self.spread)

    def snapshot(self, now: float, listen: str = "", light: bool = False) -> MonitorSnapshot:
        """An immutable view of everything at monitor time ``now``, with the hints of the last
        tick. A pure read: nothing is evicted, no hint advances, taking it changes nothing.

        ``light``: a glance between two ticks (flowtop.monitor.collector): each rank's step and liveness
        now, its figures from its last full view (a rank never shown gets one)."""
        by_job = self._view(None, now, remember=False)
        jobs = []
        for job, shown in sorted(by_job.items()):
            hints = self._hints.get(job, ())
            # An ended or silent job's snapshot of the last tick, while it holds (flowtop.monitor.endedjobs).
            held = self._ended_jobs.take(job, shown, self.ticks_per_round(len(shown)), hints, self.relays.lag_of,
                                         lambda via: self.relays.cut_of(via, now))
            if held is not None and held.claimed_at != self._claimed(job):
                held = None  # a process took a rank number of it since (a hidden one: the rows are the same)
            jobs.append(held if held is not None else
                        self._job_snapshot(job, shown, now, hints, rotation=(0, 0) if light else None))
        return self._monitor_snapshot(now, listen, tuple(jobs))

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
            states, ordered = self.ranks.values(), self._order.get(self.ranks, self._keys_version)
        else:
            states = list(states)
            ordered = sorted(states, key=lambda st: view_order(st.key))
        # The claims read the processes as they came (of two equally new, the first heard of is shown).
        shown = self._claims.shown(self._seen(states, now), remember)
        by_job: dict[str, list[tuple[RankState, tuple[RankKey, ...]]]] = collections.defaultdict(list)
        for st in ordered:
            others = shown.get(st.key)
            if others is not None:
                by_job[st.key.job].append((st, others))
        return by_job

    def _seen(self, states: Iterable[RankState], now: float) -> list[Seen]:
        """What the claims read of each of ``states`` at monitor time ``now`` (its relay's lag off)."""
        states = list(states)
        # Judged as of its relay's latest report (_judged_at): a node's ranks share their relay,
        # its lag looked up once.
        at = {via: now - self.relays.lag_of(via) for via in {st.via for st in states}}
        running = rs.running
        return [Seen(st.key, running(st, at[st.via]), bool(st.steps), st.last_recv, st.first_seen) for st in states]

    def _claimed(self, job: str) -> Mapping[int, float]:
        """JobSnapshot.claimed_at of ``job`` now (flowtop.monitor.claims.ClaimedAt): none while each
        rank number has one process (the sole rows, kept by the view: no walk of every process)."""
        if self._sole.get(self.ranks, self._keys_version, self._claims) is not None:
            return NONE_CLAIMED
        return self._claimed_at.of(job, self.ranks, self._keys_version)

    def _hot(self, job: str) -> frozenset[int]:
        """The ranks a large job's active rank hints name, whose views every tick rebuilds (at
        most HOT_RANKS, the most impact first): in turns, a straggler's row read its figures of
        up to a round before (8 s at 1,024 ranks, 16 s at 4,096) beside the hint about them."""
        hints = self._hints.get(job, ())
        held = self._hot_of.get(job)
        if held is not None and held[0] is hints:
            return held[1]
        ranked = sorted(hinted_ranks(hints).items(), key=lambda kv: -kv[1])
        hot = frozenset(rank for rank, _ in ranked[:HOT_RANKS])
        self._hot_of[job] = (hints, hot)
        return hot

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
        glance = rotation is not None and rotation[1] == 0
        hot = self._hot(job) if slim and not glance else frozenset()  # a glance (a pure read) rebuilds none
        ranks = self.views.views(shown, now, self.relays.lag_of, turn=rotation if rotation and rotation[1] else None,
                                 glance=glance, shown_only=slim, hot=hot)
        ranks = self.relays.mark(ranks, states, now)  # relay, silent relay
        world = max([st.hello.world_size for st in states] + [len(ranks)])
        # A rank cut off behind a silent or closed relay may train on, unheard: the job's figures
        # are over the heard ranks (accounting's conventions), and its bye may be lost with the
        # relay, so the job ends when its heard ranks have ended (else it stayed stale for good).
        # The ranks' cuts read once (over_phrase reads them too): with none cut, the heard ranks are
        # all of them, no second pass.
        cuts = [r.cut for r in ranks]
        heard = [r for r in ranks if r.cut is None] if cuts.count(None) != len(cuts) else list(ranks)
        # The job's step and step time: of its live heard ranks, else its heard ones (a cut
        # rank's last values are not the job's now). A job with every rank unheard shows the
        # lowest step last heard and no step time (None: none is measured now).
        live = [r for r in heard if r.status == "live"] or heard or list(ranks)
        times = [r.step_time_s for r in live if r.step_time_s and r.cut is None]
        if heard and all(r.status in ENDED for r in heard):  # failed: one or more ended of an exception
            status = job_end_status(heard)
        elif any(r.status == "live" for r in ranks):
            status = "running"
        elif any(r.status == "stalled" for r in ranks):
            status = "stalled"
        else:
            status = "stale"
        # While running, ranks that finished no longer add throughput; once the job is
        # done, the totals describe its last steady state. Stalled and stale ranks add 0.
        # Whole data-parallel replicas only (parallelism.whole_replicas): FLOPs per token, tokens/s
        # and FLOP/s over the same replicas.
        whole, left_out = parallelism.whole_replicas(ranks)
        counted = [r for r in whole if r.status not in ENDED or status in ENDED]
        # Once per data-parallel replica where every rank's coordinates are known (flowtop.monitor.parallelism).
        tokens_per_s, tokens_basis = parallelism.job_tokens(counted)
        merged = self._merged_kernels(job, states, rotation) if self.kernels is not None else None
        return JobSnapshot(
            job=job,
            world_size=world,
            ranks=ranks,
            step=min([r.step for r in live]),  # a list: a generator cost ~2x a rank
            step_time_s=max(times) if times else None,
            tokens_per_s=tokens_per_s,
            # Over the heard ranks; the figures say so (over_phrase: which ranks are unheard).
            flops=parallelism.job_flops_per_token(
                accounting.job_flops([r.flops for r in counted], _newest_step_at(ranks, states),
                                     over_phrase(cuts, left_out)), counted, tokens_basis),
            status=status,
            kernels_merged=merged,
            rank_conflicts=len({r.rank for r in ranks if r.conflict}),
            hints=hints,
            tokens_basis=tokens_basis + (f"; {parallelism.REPLICAS_LEFT_OUT}" if left_out else ""),
            stages=parallelism.pipeline_stages(counted),
            left_out=left_out,
            claimed_at=self._claimed(job),
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

    def _judged_at(self, st: RankState, now: float) -> float:
        """The monitor time as of which ``st`` is judged live, stalled or gone: its relay's latest
        report, ``now`` less that batch's queueing lag (``now`` for a rank heard directly)."""
        return now - self.relays.lag_of(st.via)
