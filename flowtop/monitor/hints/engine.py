"""Hint evaluation with hysteresis: measures in, ordered :class:`Hint` records out.

The engine is the only stateful part of the hints package. It keeps, per (job, rule id, target),
whether the hint is active and since when its measure has been beyond the threshold, so that a
hint needs its full evidence window to appear and the looser clear value to disappear: a measure
that wobbles around the threshold does not make the hint flicker. Whether a measurement is
beyond its rule's threshold or clear value, and the hint record made of it, are pure functions
of flowtop.monitor.hints.making; the state and the order of the hints are here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any, Callable, Mapping, Sequence

from flowtop.monitor.hints import (measures_device, measures_identity, measures_kernels, measures_parallel,
                                   measures_relay, measures_spikes, measures_straggler, measures_time)
from flowtop.monitor.hints.base import Measurement, MeasureFn, latest_ranks, rank_target
from flowtop.monitor.hints.making import beyond, make_hint, reusable
from flowtop.monitor.hints.rules import GROUPS, RULES, SEVERITIES, Rule, apply_overrides, validate
from flowtop.monitor.records import Fields
from flowtop.monitor.snapshot import ENDED, Hint, JobSnapshot

_log = logging.getLogger("flowtop.hints")

#: Rule id -> measure function. Every rule in the table needs one.
MEASURES: Mapping[str, MeasureFn] = {
    "hang_all": measures_time.hang_all,
    "hang_rank": measures_time.hang_rank,
    "rank_conflict": measures_identity.rank_conflict,
    "relay_silent": measures_relay.relay_silent,
    "input_wait": measures_time.input_wait,
    "straggler": measures_straggler.straggler,
    "step_spikes": measures_spikes.step_spikes,
    "comm_exposed": measures_kernels.comm_exposed,
    "launch_bound": measures_kernels.launch_bound,
    "memory_bound": measures_kernels.memory_bound,
    "fp32_matmul": measures_kernels.fp32_matmul,
    "attention_unfused": measures_kernels.attention_unfused,
    "optimizer_unfused": measures_kernels.optimizer_unfused,
    "uneven_kernel": measures_kernels.uneven_kernel,
    "throttling": measures_device.throttling,
    "util_vs_mfu": measures_device.util_vs_mfu,
    "memory_full": measures_device.memory_full,
    "uncounted_ops": measures_device.uncounted_ops,
    "estimate_mismatch": measures_device.estimate_mismatch,
    "pipeline_imbalance": measures_parallel.pipeline_imbalance,
    "attention_flops_note": measures_kernels.attention_flops_note,
}


#: The rules measured on a job none of whose ranks is heard (see HintEngine.evaluate): a hang
#: is what a job's silence says.
SILENCE_RULES = frozenset(GROUPS["hang"]) | {"relay_silent"}  # every rank unheard: why, since when

#: Seconds an active hint stays shown after its measure last held (no blinking).
HOLD_S = 10.0


@dataclass(slots=True)  # one per (rule, rank) a hint names: thousands in a large job
class _State:
    """Hysteresis state of one (job, rule, target)."""

    active: bool = False
    pending_step: int | None = None  # step index when the measure first crossed the threshold
    pending_t: float | None = None  # monitor time of that crossing
    since_step: int | None = None
    hint: Hint | None = None
    beyond_t: float = 0.0  # monitor time the measure was last beyond the clear value
    first_step: int | None = None  # first step the evidence covers (Hint.first_step)
    order: tuple[Any, ...] = ()  # the hint's sort key, kept with it (held hints are not keyed again)
    holding: bool = False  # last measured back past the clear value: shown for HOLD_S only
    #: The measurement ``hint`` was made from, where its figures grow with the clock (a hang's):
    #: an equal one but for its value makes no new hint (see making.reusable).
    measured: Measurement | None = None
    #: What ``hint`` was made from, with the state's since_step and first_step then, where a
    #: measure hands out the same figures again (a rank's kernel window: see _restep).
    made: tuple[Measurement, int | None, int | None] | None = None


class HintEngine:
    """Evaluates the rules table against job snapshots, with per-hint hysteresis.

    ``rules`` defaults to :data:`flowtop.monitor.hints.rules.RULES`; pass a modified copy (e.g. with
    ``dataclasses.replace``) to tune thresholds, or ``overrides`` — rule id or group name (see
    :data:`flowtop.monitor.hints.rules.GROUPS`) -> {field or param: value}, e.g.
    ``HintEngine(overrides={"hang": {"floor_s": 5.0}})``; unknown names raise ValueError.
    One engine serves any number of jobs.
    """

    def __init__(
        self,
        rules: Sequence[Rule] = RULES,
        measures: Mapping[str, MeasureFn] | None = None,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.rules: tuple[Rule, ...] = apply_overrides(rules, overrides, GROUPS) if overrides else tuple(rules)
        validate(self.rules)
        self._measures = dict(MEASURES if measures is None else measures)
        missing = [r.id for r in self.rules if r.id not in self._measures]
        if missing:
            raise ValueError(f"no measure for rules {missing}")
        #: (job, rule id) -> target -> state: a rule's states are found without a scan of every
        #: job's (a 4,096-rank job with one kernel profile holds ~8,200 active states).
        self._state: dict[tuple[str, str], dict[str, _State]] = {}
        #: job -> (rule id, target) -> the hint as last shown, marked ended (see _end_hints).
        self._ended: dict[str, dict[tuple[str, str], Hint]] = {}
        self._scope = {r.id: r.scope for r in self.rules}
        #: Rules whose targets are measured against each other (see _drop_held).
        self._relative = frozenset(r.id for r in self.rules if r.params.get("relative"))
        index = {r.id: i for i, r in enumerate(self.rules)}
        self._order = _order_key(index)
        #: Per rule, the table index of its group for the shares (see :meth:`plan`): a rule's own,
        #: or that of the rule hiding it (hang_rank is measured with hang_all, or a hang would show
        #: every rank's hint until hang_all's share came round).
        self._anchor = [_anchor(r, index, self.rules) for r in self.rules]
        self._plans: dict[int, tuple[int, ...]] = {}
        self._failed: set[str] = set()
        #: Told (once per rule) when a rule raised, so the user hears of it (the model sets it
        #: to its notices: the TUI owns stderr).
        self.report: Callable[[str], None] | None = None

    def evaluate(self, job: JobSnapshot, now: float, phase: tuple[int, int] | None = None) -> tuple[Hint, ...]:
        """Hints of ``job`` at monitor time ``now``: the active ones, most severe first, then by
        impact; after them the ended ones (their rank or job finished while they were shown).

        ``phase`` (k, n): only the rules of share k of n (:meth:`plan`) are measured now, the
        others' hints are held as they are (the model measures a large job's rules in shares at
        different ticks, see flowtop.monitor.rotation.HINT_SHARES)."""
        self._end_hints(job)
        if job.status in ENDED:
            return self._ended_hints(job.job, ())  # nothing runs: the diagnosis stands as it was
        out: list[tuple[Rule, _State]] = []
        shown: set[str] = set()  # rules with a hint now (a rule may hide another's)
        plan = self.plan(phase[1]) if phase is not None else ()
        # A job none of whose ranks is heard (each silent past its stale limit, or ended) brings
        # no new evidence: only the rules about that silence (SILENCE_RULES) measure it, the
        # others' hints are held as they were when it fell silent, as between two shares. Else
        # every rule measured the same frozen histories and windows at every tick for the
        # EVICT_AFTER_S it is kept (15 silent jobs of 64 ranks: ~230 ms a tick,
        # bench/ended_idle.py --silent), the windows of shown hints growing with no data in them.
        silent = job.status == "stale"
        # Ranks unheard behind a silent or closed relay: their rank hints are not active (the
        # job's relay_silent says why they are unheard), whatever their evidence from before the
        # cut read; a shown one is kept marked ended as last measured (a finished run's final
        # snapshot states what was found while the rank was heard), and they start over from the
        # rank's data once it is heard again. rank_conflict is about every process claiming the
        # rank, one of them perhaps heard: not the cut's.
        cut = _cut_targets(job)
        for i, rule in enumerate(self.rules):
            states = self._state.get((job.job, rule.id))
            unheard = cut if cut and self._scope[rule.id] == "rank" and rule.id not in CLAIMANT_RULES else None
            if unheard and states:
                for target in unheard & states.keys():
                    self._freeze(job.job, rule.id, target, states.pop(target))
            results = None
            if (phase is None or plan[i] == phase[0] % phase[1]) and (not silent or rule.id in SILENCE_RULES):
                results = self._measure(rule, job, now)
            n = len(out)
            if results is None:  # not measured now, or it raised: hold every state of this rule as it is
                if states:
                    out.extend([(rule, s) for s in states.values() if s.active and s.hint])  # a list: ~2x cheaper
            else:
                if states:
                    for target in [t for t in states if t not in results]:
                        del states[target]  # the target went away (rank gone, kernel no longer listed)
                else:
                    states = self._state.setdefault((job.job, rule.id), {})
                named: float | None = None  # the latest start of a hint standing on its measurement now
                for target, m in results.items():
                    # Most targets have no state and are not beyond the threshold: nothing to
                    # start (what _update would find, without its call: thousands a round at scale);
                    # nor has an unheard rank (its states went above).
                    if target in states or (m is not None and beyond(rule, m, keep=False)
                                            and not (unheard and target in unheard)):
                        st = self._update(rule, job.job, target, m, now)
                        if st is not None:
                            out.append((rule, st))
                            if m is not None and not st.holding:
                                named = max(named or 0.0, st.pending_t or 0.0)
                if named is not None and rule.id in self._relative:
                    _drop_held(states, out, n, named)
            if len(out) > n:
                shown.add(rule.id)
        hidden = {r.id for r in self.rules if r.params.get("hidden_by") in shown}
        # A hidden rule's hint only held (its measure back past the clear value) does not surface
        # when the rule hiding it ends: a node resumed after a freeze showed hang_rank "has not
        # finished a step for 30 s" for a tick after hang_all's hold, its ranks stepping again.
        kept = [st for r, st in out if r.id not in hidden and not (st.holding and r.params.get("hidden_by"))]
        kept.sort(key=attrgetter("order"))
        hints = tuple([st.hint for st in kept if st.hint is not None])  # a list first: ~2x cheaper than a generator
        return hints + self._ended_hints(job.job, hints)

    def plan(self, shares: int) -> tuple[int, ...]:
        """Per rule (table order), which of ``shares`` shares measures it: a rule with the rule
        hiding it as one group, the groups by cost (Rule.cost), the costliest first, each to the
        share that costs least so far (the lowest-numbered of equals), so that no tick of a large
        job measures much more than another. At 4,096 ranks (2026-12-06) two shares by table
        index cost ~100 and ~270 ms of CPU; four by cost ~115 ms at most. The same in every
        process: a replay measures each rule when the live monitor did."""
        plan = self._plans.get(shares)
        if plan is None:
            groups: dict[int, list[int]] = {}
            for i, anchor in enumerate(self._anchor):
                groups.setdefault(anchor, []).append(i)
            costed = sorted((-sum(self.rules[i].cost for i in members), anchor, members)
                            for anchor, members in groups.items())  # costliest first, then table order
            load = [0.0] * max(1, shares)
            out = [0] * len(self.rules)
            for minus_cost, _, members in costed:
                k = min(range(len(load)), key=lambda s: (load[s], s))
                load[k] -= minus_cost
                for i in members:
                    out[i] = k
            plan = self._plans[shares] = tuple(out)
        return plan

    def _measure(self, rule: Rule, job: JobSnapshot, now: float) -> Mapping[str, Measurement | None] | None:
        """The rule's measurements (target -> measurement), or None when its measure raised."""
        try:
            return self._measures[rule.id](rule, job, now)
        except Exception as exc:  # a bug in one measure must not take the monitor down
            if rule.id not in self._failed:
                self._failed.add(rule.id)
                _log.exception("hint rule %s failed; its hints are held", rule.id)
                if self.report is not None:
                    self.report(f"hint rule {rule.id} raised {type(exc).__name__}: {exc}; its hints are held")
            return None

    def reset(self) -> None:
        """Forget all hysteresis state and ended hints."""
        self._state.clear()
        self._ended.clear()

    def forget(self, job: str) -> None:
        """Drop the state of a job the monitor no longer shows (it was evicted): a monitor that
        runs for weeks across many jobs must not keep every job's hint state."""
        for key in [k for k in self._state if k[0] == job]:
            del self._state[key]
        self._ended.pop(job, None)

    def _end_hints(self, job: JobSnapshot) -> None:
        """Freeze, marked ended, the shown hints whose subject finished: every hint of a done job,
        and the rank hints of a rank whose every process said bye. Left to the measures, they
        would vanish with their rank (a finished rank is measured no more), and the final
        snapshot that a script reads would say nothing about the run."""
        if job.status not in ENDED and not [r for r in job.ranks if r.status in ENDED]:
            return  # nothing finished (every tick of a large job asks; a list: a generator cost ~2x a rank)
        running = {rank_target(r) for r in job.ranks if r.status not in ENDED}  # a rank number may have 2 rows
        done = {rank_target(r) for r in job.ranks} - running
        for (name, rule_id), states in self._state.items():
            if name != job.job or not (job.status in ENDED or self._scope.get(rule_id) == "rank"):
                continue
            for target in [t for t in states if job.status in ENDED or t in done]:
                self._freeze(job.job, rule_id, target, states.pop(target))

    def _freeze(self, job: str, rule_id: str, target: str, st: _State) -> None:
        """Keep ``st``'s hint, if shown, marked ended as it last measured (an ended hang's seconds
        stop growing there)."""
        if st.active and st.hint is not None:
            self._ended.setdefault(job, {})[(rule_id, target)] = replace(st.hint.frozen(st.beyond_t), ended=True)

    def _ended_hints(self, job: str, live: tuple[Hint, ...]) -> tuple[Hint, ...]:
        """The ended hints of ``job`` not superseded by one of the ``live`` ones (a restarted rank's)."""
        ended = self._ended.get(job)
        if not ended:
            return ()
        for key in {(h.id, h.target) for h in live} & ended.keys():
            del ended[key]
        return tuple(sorted(ended.values(), key=self._order))

    def _update(self, rule: Rule, job: str, target: str, m: Measurement | None, now: float) -> _State | None:
        """The target's state when its hint is shown now (``m`` None: no data, held), else None."""
        states = self._state.setdefault((job, rule.id), {})
        st = states.get(target)
        if m is None:  # no data for this target now: keep what was shown
            return st if st is not None and st.active else None
        if st is None:
            if not beyond(rule, m, keep=False):
                return None  # nothing pending, nothing to start (most targets, most of the time)
            st = states[target] = _State()
        if st.active:
            if beyond(rule, m, keep=True):
                if not (st.hint is not None and st.measured is not None and reusable(rule, m, st.measured)) \
                        and not _restep(st, rule, m):
                    start_step = m.step if st.pending_step is None else st.pending_step
                    start_t = now if st.pending_t is None else st.pending_t
                    steps = max(m.steps_covered, m.step - start_step)
                    secs = max(m.seconds_covered, now - start_t)
                    self._show(st, make_hint(rule, target, m, st.since_step, st.first_step, steps, secs), m)
                    st.measured = m if m.clock is not None else None
                st.beyond_t = now
                st.holding = False
                return st
            if now - st.beyond_t < HOLD_S:
                # A gate with no room between threshold and clear (a throttle reason that
                # comes and goes) would otherwise make the hint blink: hold it a little.
                if not st.holding and st.hint is not None:
                    # Held, it says what it last measured: a hang's seconds stop growing there.
                    self._show(st, st.hint.frozen(st.beyond_t))
                    st.measured = None
                st.holding = True
                return st
            del states[target]  # back past the clear value (or a gate failed): cleared
            return None
        if not beyond(rule, m, keep=False):
            del states[target]
            return None
        if st.pending_step is None or st.pending_t is None:
            # The evidence starts where the measure's own window starts (history it embodies).
            st.pending_step, st.pending_t = m.step - m.steps_covered, now - m.seconds_covered
            # A window of n steps ending at step s covers steps s-n+1 .. s.
            st.first_step = max(0, st.pending_step + (1 if m.steps_covered else 0))
        steps = max(m.steps_covered, m.step - st.pending_step)
        secs = max(m.seconds_covered, now - st.pending_t)
        if steps < rule.window_steps or secs < rule.window_s:
            return None
        st.active = True
        st.beyond_t = now
        st.since_step = st.pending_step
        self._show(st, make_hint(rule, target, m, st.since_step, st.first_step, steps, secs), m)
        st.measured = m if m.clock is not None else None
        return st

    def _show(self, st: _State, hint: Hint, made: Measurement | None = None) -> None:
        st.hint = hint
        st.order = self._order(hint)
        st.made = (made, st.since_step, st.first_step) if made is not None else None


#: Hint's fields in order, and where its last step is among them (see _restep).
_HINT_FIELDS = Fields(Hint)
_LAST_STEP = _HINT_FIELDS.names.index("last_step")


def _restep(st: _State, rule: Rule, m: Measurement) -> bool:
    """Show ``st``'s hint again at ``m``'s step when ``m`` is the measurement it was made from
    but for the step: the same value, evidence, text and impact objects (a rank's kernel window
    measured once and handed out again, flowtop.monitor.hints.measures_kernels), nothing else of
    it or of the state that make_hint reads changed, and the window of steps and seconds the
    hint would say is the evidence's own. The hint made anew then differs in its last step only:
    a copy with that one field set, not a hint rendered again (~8,000 of them an evaluation of a
    4,096-rank job with a kernel profile on every rank, their summaries and actions formatted)."""
    made = st.made
    if made is None or st.hint is None or m.clock is not None:
        return False
    was, since_step, first_step = made
    if not (was.evidence is m.evidence and was.value is m.value and was.text is m.text
            and was.impact is m.impact and was.severity == m.severity and was.variant == m.variant
            and was.clock is None and since_step == st.since_step and first_step == st.first_step
            and (not rule.window_steps or "window_steps" in m.evidence)
            and (not rule.window_s or "window_s" in m.evidence)):
        return False
    if st.hint.last_step != m.step:
        values = list(_HINT_FIELDS.read(st.hint))
        values[_LAST_STEP] = m.step
        st.hint = Hint(*values)
    st.made = (m, since_step, first_step)
    return True



#: Rank rules about every process claiming a rank number, which a cut of one of them does not end.
CLAIMANT_RULES = frozenset({"rank_conflict"})


def _cut_targets(job: JobSnapshot) -> frozenset[str]:
    """The rank targets of ``job`` whose rank is unheard behind a silent or closed relay
    (RankSnapshot.cut) in its newest incarnation (the one a rank hint is of: latest_ranks)."""
    unheard = job.unheard  # one pass, kept with the snapshot (relay_silent reads it too)
    if not unheard:
        return frozenset()
    numbers = {r.rank for r in unheard}
    return frozenset(rank_target(r) for r in latest_ranks(job) if r.rank in numbers and r.cut is not None)


def _drop_held(states: dict[str, _State], out: list[tuple[Rule, _State]], n: int, named_t: float) -> None:
    """Clear the hints of a relative rule (``params["relative"]``: its targets measured against
    each other, the straggler's ranks) that are shown only by the hold (HOLD_S), their measure back
    past the clear value, now that another target's hint of the rule stands on its measurement:
    the rule's own figures say the held target is no longer behind. Shown on, it named the opposite
    of the new one: of two ranks, each "slower than the other" (a new user's trial, after the two
    swapped). Only a hint older than the newest one named (``named_t``: when its crossing began):
    two ranks behind since the same time keep their holds as any rule's. ``out[n:]``: this rule's
    shown states."""
    held = [t for t, st in states.items() if st.holding and (st.pending_t or 0.0) < named_t]
    if held:
        gone = set(map(id, (states.pop(t) for t in held)))
        out[n:] = [(rule, st) for rule, st in out[n:] if id(st) not in gone]


def _anchor(rule: Rule, index: Mapping[str, int], rules: Sequence[Rule]) -> int:
    """The table index of the last rule up the chain of ``hidden_by`` from ``rule``."""
    seen = {rule.id}
    while isinstance(up := rule.params.get("hidden_by"), str) and up in index and up not in seen:
        seen.add(up)
        rule = rules[index[up]]
    return index[rule.id]


def _order_key(order: Mapping[str, int]) -> Any:
    """Sort key of hints: most severe first, then the largest impact, then table order."""
    return lambda h: (SEVERITIES.index(h.severity), -h.impact, order.get(h.id, len(order)), h.target)
