"""The model's tick, hints and eviction for flowtop.monitor.model: what the clock drives. No Textual.

A base of :class:`flowtop.monitor.model.Model` (above :class:`~flowtop.monitor.model_views.ModelViews`),
not a separate object: the tick's hot path reaches these methods through ``self`` exactly as when
they were written in one class (no extra call layer). Its state is set by ``Model.__init__``.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import replace
from typing import Callable, Iterable, Protocol

from flowtop.monitor import rankstate as rs
from flowtop.monitor.claims import newest_per, superseded
from flowtop.monitor.limits import TokenBucket
from flowtop.monitor.model_views import ModelViews
from flowtop.monitor.notices import Notices
from flowtop.monitor.rankstate import Judged, RankState
from flowtop.monitor.rankviews import as_now, with_now
from flowtop.monitor.relayviews import RelayCut
from flowtop.monitor.rotation import SPREADS, Prepared, hint_share, prepares
from flowtop.monitor.snapshot import ENDED, Hint, JobSnapshot, MonitorSnapshot
from probe.wire import RankKey

_log = logging.getLogger("flowtop.model")  # the name it had in flowtop.monitor.model


#: A rank's bye makes the model evaluate its job's hints once more while the rank still runs
#: (its last look: what the job's final hints say, see HintEngine's ended hints), unless the
#: hints were evaluated since its last step arrived. Looks per job are rate-limited (per
#: second, burst): at the end of a thousand-rank job each look costs a job snapshot.
LAST_LOOKS_PER_S, LAST_LOOK_BURST = 4.0, 8


def _with_hints(snap: JobSnapshot, hints: tuple[Hint, ...]) -> JobSnapshot:
    """``snap`` with ``hints``: the same object when they are its own (the same records: a silent
    job's hang hints while its stall holds, so its kept snapshot serves on)."""
    return snap if hints == snap.hints else replace(snap, hints=hints)


class HintEvaluator(Protocol):
    """What the model asks of its hint engine (flowtop.monitor.hints.HintEngine; tests pass their
    own). An engine may also have ``report`` (set to the model's notices) and ``forget(job)``."""

    def evaluate(self, job: JobSnapshot, now: float, phase: tuple[int, int] | None = None) -> Iterable[Hint]:
        """``phase`` (k, n): measure only the rules of share k of n now, hold the others' hints."""
        ...


class ModelTicks(ModelViews):
    """Ticks, hint evaluation and the forgetting of ranks (see flowtop.monitor.model.Model)."""

    # Set by Model.__init__ (see there for what each holds).
    _job_sizes: collections.Counter[str]
    _hint_engine: HintEvaluator | None
    _hints_failed: bool
    _hints_seen: dict[str, list[float]]
    _hot_of: dict[str, tuple[tuple[Hint, ...], frozenset[int]]]
    _judged: Prepared[JobSnapshot]
    _looks: dict[str, TokenBucket]
    evicted_jobs: int
    _heard_since: float
    notices: Notices
    _now: float

    def _say_unsaid_rejects(self) -> None:  # ModelNotices' (model_notices): the refusals a flood left unsaid
        raise NotImplementedError

    def _say_failures(self, jobs: tuple[JobSnapshot, ...], now: float, force: bool = False) -> None:  # ModelNotices'
        raise NotImplementedError

    def tick(self, now: float, listen: str = "") -> MonitorSnapshot:
        """Advance what the clock drives, at monitor time ``now``: forget finished jobs, evaluate
        every job's hints (their hysteresis advances here and at a rank's bye, nowhere else) and
        return the snapshot of that instant. Called at a fixed cadence (flowtop.monitor.ticker)."""
        self._now = max(self._now, now)
        self.ticks += 1
        self._say_unsaid_rejects()
        self._evict(now)
        self.relays.prune(now)
        by_job = self._view(None, now, remember=True)
        jobs = []
        cut_of = self._cut_of(now)
        for job, shown in sorted(by_job.items()):
            spread = self.ticks_per_round(len(shown))
            held = self._ended_jobs.take(job, shown, spread, self._hints.get(job, ()), self.relays.lag_of, cut_of)
            if held is not None and held.status in ENDED:  # nothing changed since (flowtop.monitor.endedjobs)
                jobs.append(held)
                continue
            # A silent job that nothing changed since: its snapshot as kept, its hints evaluated
            # as they would be on a rebuilt one (the hang rules; hysteresis and shares as before).
            snap = held if held is not None else \
                self._job_snapshot(job, shown, now, rotation=(self.ticks, spread) if spread > 1 else None)
            if snap.status in ENDED:
                jobs.append(self._ended(snap, shown, spread, now))
                continue
            if spread == 1:
                out = self._evaluate(snap, now)
            elif (share := hint_share(self.ticks, spread)) is not None:
                out = self._evaluate(snap, now, share, [st for st, _ in shown])
            else:
                if self._hint_engine is not None and prepares(self.ticks, spread):
                    self._prepare(snap, now, [st for st, _ in shown])
                out = _with_hints(snap, self._hints.get(job, ()))
            if out.status == "stale" and not self._hints_failed:
                if out is not held:  # (re)built, or its hints changed: kept from this tick on
                    self._ended_jobs.keep(job, shown, spread, out)
            else:
                self._ended_jobs.forget(job)  # it runs again (a restart, a late frame)
            jobs.append(out)
        self._judged.expire(self.ticks)
        self._say_failures(tuple(jobs), now)
        return self._monitor_snapshot(now, listen, tuple(jobs))

    def _ended(self, snap: JobSnapshot, shown: list[tuple[RankState, tuple[RankKey, ...]]], spread: int,
               now: float) -> JobSnapshot:
        """An ended job's snapshot at this tick, kept for the next ones (flowtop.monitor.endedjobs).
        Its hints are evaluated at once, whatever a large job's share: an ended job's rules
        measure nothing (HintEngine.evaluate ends its hints and returns them), so they are final
        from this tick on and no history is taken for them. (A large job's hints ended at its next
        share's tick, up to 16 ticks later, and the tick before each share took every rank's
        history for rules that read none.)"""
        self._ended_jobs.forget(snap.job)
        out = self._evaluate(snap, now)
        if self._hints_failed:
            return out  # its hints are only held: evaluated again at every tick, as before
        if spread > 1 and self.kernels is not None:
            # A large job's ticks show the kernel merge taken once a round: kept, it would stay up
            # to a round old for good. Taken now, as it is (the merge is cached by its windows).
            merged = self._merge(snap.job, [st for st, _ in shown])
            self._merged_round[snap.job] = (merged, self.ticks)
            if merged is not out.kernels_merged:
                out = replace(out, kernels_merged=merged)
        self._ended_jobs.keep(snap.job, shown, spread, out)
        return out

    def _prepare(self, snap: JobSnapshot, now: float, states: list[RankState]) -> None:
        """Take the histories the next tick's share of ``snap``'s rules reads (see rotation.Prepared)."""
        try:
            self._judged.keep(snap.job, self.ticks, now, list(states), self._as_now(snap, states))
        except Exception:  # the share's tick takes them itself, and says what went wrong
            self._judged.void(snap.job)

    def largest_job(self) -> int:
        """Ranks of the largest job (0 with none)."""
        return max(self._job_sizes.values(), default=0)

    def set_spread(self, spread: int) -> None:
        """Spread large jobs' ticks ``spread`` times thinner (one of SPREADS): live, by the
        collector's load (flowtop.monitor.thinning); in a replay, where the recording says."""
        if spread not in SPREADS:
            raise ValueError(f"tick spread must be one of {SPREADS}, got {spread!r}")
        self.spread = spread

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
            if taken is not None:
                judged, seen_at = taken.value, taken.at
            else:
                judged, seen_at = self._as_now(snap, states) if states is not None else snap, now
            self._seen_by_hints(snap.job, seen_at, phase)  # as of the histories read
            hints = tuple(self._hint_engine.evaluate(judged, now, phase))
        except Exception as exc:  # a hints bug must not cost the user every snapshot
            if not self._hints_failed:
                self._hints_failed = True
                _log.exception("hint engine failed; snapshots go on without hints")
                self.notices.error(f"hints stopped: the hint engine raised {type(exc).__name__}: {exc}", now)
            return _with_hints(snap, self._hints.get(snap.job, ()))
        self._hints[snap.job] = hints
        return _with_hints(snap, hints)

    def _cut_of(self, now: float) -> Callable[[str | None], RelayCut | None]:
        """What marks a relay's ranks unreachable at ``now`` (a kept silent job's check)."""
        return lambda via: self.relays.cut_of(via, now)

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
                                                    or view.telemetry.received_at < st.telemetry.received_at)
            if stepped or sampled:
                # A stale rank (a silent job's, for its 600 s) has not moved since the last share:
                # its history and telemetry as then, not taken again (most of such a job's tick).
                held = st.judged
                if held is not None and stepped and held.version == st.version:
                    ranks[i] = with_now(view, held.history, held.telemetry)
                else:
                    ranks[i] = as_now(view, st, stepped)
                    st.judged = Judged(st.version, ranks[i].history, ranks[i].telemetry) \
                        if stepped and view.status == "stale" else None
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

    def _evict(self, now: float) -> None:
        """Forget finished or silent jobs (and superseded incarnations) after EVICT_AFTER_S."""
        # A rank heard within EVICT_AFTER_S is not gone, whatever its relay's lag (it only
        # moves the judged time back): most ticks find none of thousands of ranks silent that
        # long, without a lag lookup or a job's list each. Nor a pass over them until the
        # oldest last_recv found at the last pass is that old: a rank's last_recv only grows,
        # and a rank that came since was heard at a frame's time, after it (a relayed frame's
        # time may be dated back by its queueing, a second or so: such a rank is evicted that
        # much late at most). A monitor that keeps only ended jobs passed over every rank at
        # every tick for their 10 minutes (~40 ns a rank, bench/ended_idle.py).
        if now - self._heard_since <= rs.EVICT_AFTER_S:
            return
        self._heard_since = min((st.last_recv for st in self.ranks.values()), default=now)
        if now - self._heard_since <= rs.EVICT_AFTER_S:
            return
        for states in self._by_job().values():
            gone = [st for st in states if rs.gone(st, self._judged_at(st, now))]
            if len(gone) == len(states):
                self.evicted_jobs += 1  # its per-job state goes with its last rank (_forget)
            elif gone:
                # Only processes the view no longer shows: old incarnations (a newer one of the
                # rank exists), and those an earlier run of the job left (claims.superseded).
                newest = newest_per(states, lambda st: st.key.rank, lambda st: st.key.inc)
                left = superseded(self._seen(states, now))
                gone = [st for st in gone if st.key.inc < newest[st.key.rank].key.inc or st.key in left]
            for st in gone:
                self._forget(st)

    def _by_job(self) -> dict[str, list[RankState]]:
        by_job: dict[str, list[RankState]] = collections.defaultdict(list)
        for st in self.ranks.values():
            by_job[st.key.job].append(st)
        return by_job

    def _forget(self, st: RankState) -> None:
        del self.ranks[st.key]
        self._keys_version += 1
        self._order.clear()
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
            self._hot_of.pop(job, None)
            self._ended_jobs.forget(job)
            self._claims.forget_job(job)
            forget = getattr(self._hint_engine, "forget", None)
            if forget is not None:
                forget(job)
