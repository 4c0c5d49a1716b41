"""The straggler measure: ranks that hold the others up, by step time, pace and lead, aligned by
step index (or, with no step in common, in grid windows: flowtop.monitor.hints.staggered), within
a pipeline stage where leads are compared (flowtop.monitor.hints.stages)."""

from __future__ import annotations

import bisect
import operator
import statistics
from array import array
from collections.abc import Sequence
from itertools import accumulate, compress, groupby, islice
from dataclasses import dataclass
from typing import Any

from flowtop.monitor.hints.base import Measurement, clamp01, rank_target, safe_div
from flowtop.monitor.hints import staggered
from flowtop.monitor.hints.aligned import (Aligned, align, flat, medians_without, medians_without_each, pairs_of,
                                           values_at)
from flowtop.monitor.hints.measures_time import _running
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.hints.stages import per_stage
from flowtop.monitor.snapshot import JobSnapshot, RankSnapshot


@dataclass(frozen=True, slots=True)
class PaceSpan:
    """What one rank's pace figure is taken over: steps, and seconds of monitor receive time."""

    steps: int
    seconds: float


#: Shortest stretch of receive time a pace figure is taken over (see _by_reach).
PACE_MIN_SPAN_S = 1.0
#: A rank whose steps reach the monitor faster than this share of its own step time is catching
#: up a backlog (a relay or the monitor stopped, then a burst): no pace figure. Steadily, steps
#: cannot arrive faster than they are made; a trial's SIGSTOP of a relay read 0.0077 s a step
#: against steps of 0.1 s and named a random rank "660 % slower".
CATCH_UP = 0.5


def _by_median(ranks: list[RankSnapshot], window: int) -> tuple[dict[int, float], int]:
    """Per rank: median step time over the last ``window`` step indices all ranks reported."""
    al = align([(r.history.steps, r.history.step_time_s) for r in ranks], window)
    if not al.steps:
        return {}, 0
    return {r.rank: float(statistics.median(row)) for r, row in zip(ranks, al.rows)}, len(al.steps)


def _by_reach(ranks: list[RankSnapshot], window: int, keep: int, step_s: dict[int, float] | None = None,
              spans_of: dict[int, PaceSpan] | None = None) -> tuple[dict[int, float], int, Aligned]:
    """Per rank: time per step to reach, from a step at least ``window`` steps back to its newest,
    among the last ``keep`` step indices every rank reached (monitor receive times, so ranks share
    one clock); the fewest steps any rank's figure spans; and the reach times at those indices.
    ``spans_of``, where given, gets what each rank's figure spans (its hint says so).

    The steps of one frame share its receive time: only the last step of a frame was received
    when it was made. A figure from a step in the middle of a frame would be off by up to a flush
    interval (a rank paced to 0.45 s at 10 ms steps read 100 % slower or faster by its phase), so
    both ends of each rank's span are ends of its frames: where its receive time changes.
    ``step_s`` (a rank's median step time): a rank catching up (see CATCH_UP) gets no figure."""
    # Each column as one array (copied in C): the frame ends below index them a dozen times a rank
    tails = [(flat(steps)[-keep:], flat(times)[-keep:])
             for steps, times in (pairs_of(r.history.reached) for r in ranks)]
    reach = align(tails)
    if not reach.steps:
        return {}, 0, reach
    lo, hi = reach.steps[0], reach.steps[-1]
    per_step: dict[int, float] = {}
    spans: list[int] = []
    for r, (steps, times) in zip(ranks, tails):
        # a frame ends where the rank's own receive time changes (or at its newest step): its own
        # series, since the common window may stop in the middle of this rank's newest frame.
        ends = [j for j in _time_changes(times) if lo <= steps[j] <= hi]
        if steps and steps[-1] <= hi:
            ends.append(len(steps) - 1)
        if len(ends) < 2:
            continue  # one frame in the window: no rate from its receive times
        b = ends[-1]
        # A frame's receive time is off its last step's by up to a step, a flush and a drain:
        # over a span of a few tenths of a second that is tens of % (two ranks of a 2-rank job
        # in lockstep, 8 ms steps, read 29 % apart by pace; a new user's trial). The span must
        # be PACE_MIN_SPAN_S long as well as ``window`` steps: else no pace figure for the rank.
        step_b, time_b = steps[b], times[b]  # read once, not at every end (the columns index in Python)
        starts = [j for j in ends[:-1] if step_b - steps[j] >= window and time_b - times[j] >= PACE_MIN_SPAN_S]
        if not starts:
            continue
        a = starts[-1]
        pace = (time_b - times[a]) / (step_b - steps[a])
        if step_s is not None and pace < CATCH_UP * step_s.get(r.rank, 0.0):
            continue  # a backlog arriving at once: its receive times say nothing of its pace
        per_step[r.rank] = pace
        spans.append(step_b - steps[a])
        if spans_of is not None:
            spans_of[r.rank] = PaceSpan(step_b - steps[a], time_b - times[a])
    if len(per_step) < 2:
        if spans_of is not None:
            spans_of.clear()
        return {}, 0, reach
    return per_step, min(spans), reach


def _time_changes(times: Sequence[float]) -> list[int]:
    """The indices ``j`` where ``times[j] != times[j + 1]``, ascending: the last step of each of a
    rank's frames but its newest (a frame's steps share its receive time). Found per run of equal
    times, each run counted in C (groupby compares as ``!=`` does: a NaN is a run of its own), not
    per pair through map(operator.ne) and compress, five C calls a value: at every rank, a few
    frames in its 256 receive times (7 % of a 1,024-rank tick's instructions were those pairs).
    With a NaN (never a model's receive time) pair by pair: groupby takes one NaN object for equal
    to itself, where ``!=`` does not."""
    if isinstance(times, array) and times.typecode == "d":
        ends = _run_ends(times)
        if ends is not None:
            return ends
    total = sum(times)
    if total != total:
        return list(compress(range(len(times) - 1), map(operator.ne, times, islice(times, 1, None))))
    ends = list(accumulate(len(list(run)) for _, run in groupby(times)))
    return [end - 1 for end in ends[:-1]]


def _run_ends(times: array) -> list[int] | None:
    """_time_changes of a float array whose runs of equal times are each found by bisection and
    checked bit for bit (a run's bytes are its first time's, the next time differs): a few C calls
    a run (a frame) instead of a compare a value. None where a check fails (a NaN, ±0.0, times
    out of order): the general path says then."""
    raw, n, out, j = times.tobytes(), len(times), [], 0
    while j < n:
        v = times[j]
        if v != v:
            return None
        k = bisect.bisect_right(times, v, j)
        if raw[8 * j:8 * k] != raw[8 * j:8 * j + 8] * (k - j):
            return None
        if k < n:
            if times[k] == v:
                return None
            out.append(k - 1)
        j = k
    return out


def _leads(ranks: list[RankSnapshot], last: int | None = None) -> Aligned:
    """Leads (boundary → end of the step's last forward) at the step indices where every rank
    has a known one (the model writes 0.0 where the probe sent none); the last ``last`` of them
    (all when None)."""
    return align([(r.history.steps, r.history.lead_s) for r in ranks], last, above=0.0)


def _by_lead(ranks: list[RankSnapshot], window: int) -> tuple[dict[int, tuple[float, float, float, float]], int]:
    """Per rank index: (its median lead, the others' median lead, median of its per-step lag
    behind the others' median lead, its median step time) over the last ``window`` step indices
    where every rank reported a lead; also the number of those steps.

    In synchronous data parallelism the gradient all-reduce makes every rank leave the step
    together, so step times and reach times are equal; the lead still differs: the rank that
    finishes its forward last is the one the others wait for. The per-step lag's median keeps a
    single slow step (a sampled FLOP count, a kernel window) from making a straggler.
    """
    leads = _leads(ranks, window)
    if not leads.steps:
        return {}, 0
    # Per step, every rank's lag behind the others' median lead (one sort per step, shared).
    others: list[list[float]] = []
    for column in leads.columns():
        others.append(medians_without_each(column))
    by_rank = list(zip(*others))
    out: dict[int, tuple[float, float, float, float]] = {}
    for i, (r, mine) in enumerate(zip(ranks, leads.rows)):
        times = [t for t in values_at(leads.steps, (r.history.steps, r.history.step_time_s)) if t > 0]
        step = float(statistics.median(times)) if times else 0.0
        other = by_rank[i]
        out[i] = (float(statistics.median(mine)), float(statistics.median(other)),
                  float(statistics.median([v - o for v, o in zip(mine, other)])), step)
    return out, len(leads.steps)


def _lead_since(slow: list[int], ranks: list[RankSnapshot], keep: int, clear_frac: float) -> dict[int, int]:
    """Per rank index in ``slow``: the last step (of the last ``keep`` with known leads on every
    rank) at which it lagged the others' median lead by at most ``clear_frac`` of its step time;
    the first of those steps if it lagged at all of them."""
    if not slow:
        return {}
    leads = _leads(ranks, keep)
    if not leads.steps:
        return {}
    without = [medians_without(sorted(column)) for column in leads.columns()]  # shared by every slow rank
    out: dict[int, int] = {}
    for i in slow:
        times = values_at(leads.steps, (ranks[i].history.steps, ranks[i].history.step_time_s))
        on_time = [s for s, v, w, t in zip(leads.steps, leads.rows[i], without, times) if v - w(v) <= clear_frac * t]
        out[i] = on_time[-1] if on_time else leads.steps[0]
    return out


#: A rank's worst figure: (slower, mine, the others', steps it spans, basis).
_Best = tuple[float, float, float, int, str]


def straggler(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: how much it holds the others up, the largest of three measures — step time and
    pace (time to reach steps) against the other ranks' median, and lead-time lag as a share of
    the step (the one that sees a straggler of synchronous data parallelism)."""
    # A rank unheard behind a silent relay (cut) is not behind, only unheard: no reference, no target.
    ranks = [r for r in _running(job) if (r.history.steps or r.history.reached) and r.cut is None]
    if len(ranks) < 2:
        return {}
    window = max(rule.window_steps, 1)
    med, n_med = _by_median(ranks, window)
    if not n_med:
        # No step in every rank's history (a large job's fast steps under a long pace): each rank
        # against the ranks that reported the same steps. Since when it fell behind is not known
        # then: the engine's "since" (the step it was first measured behind) stands.
        # Within a pipeline stage, as below: a later stage's forward ends later by design.
        figs = per_stage(ranks, lambda sub: _staggered_by_rank(staggered.figures(sub, window)))
        in_windows = {i: best for i, (best, _) in figs.items()}
        if in_windows:
            lead_of = {i: lead for i, (_, lead) in figs.items() if lead is not None}
            return _measurements(ranks, _one_of_a_pair(in_windows, rule.clear, len(ranks)), lead_of, None, {})
    keep = max(int(rule.params["since_steps"]), window + 1)
    spans: dict[int, PaceSpan] = {}
    pace, n_pace, reach = _by_reach(ranks, window, keep, med, spans)
    # Leads compare within a pipeline stage: a later stage's forward ends later by design.
    led = per_stage(ranks, lambda sub: {i: (v, n) for table, n in [_by_lead(sub, window)] for i, v in table.items()})
    lead = {i: v for i, (v, _) in led.items()}
    tables = [(table, sorted(table.values()), n, basis)
              for table, n, basis in ((med, n_med, "step_time"), (pace, n_pace, "pace")) if table]
    med_sorted = sorted(med.values())
    best: dict[int, _Best] = {}
    for idx, r in enumerate(ranks):
        candidates = []
        for table, ordered, n, basis in tables:
            if r.rank not in table:
                continue  # no figure of that kind for this rank (a single frame in its window)
            other = _median_without(ordered, table[r.rank])
            if other > 0:
                candidates.append((table[r.rank] / other - 1.0, table[r.rank], other, n, basis))
        if idx in lead and lead[idx][3] > 0:
            _, _, lag, step = lead[idx]
            # Step times for context (in lockstep they are about equal).
            mine_t = med.get(r.rank, step)
            others_t = _median_without(med_sorted, mine_t) if r.rank in med else step
            candidates.append((lag / step, mine_t, others_t, led[idx][1], "lead"))
        if candidates:
            best[idx] = _worst(candidates)
    best = _one_of_a_pair(best, rule.clear, len(ranks))
    # Only ranks that may show the hint need "since when".
    slow = [i for i, b in best.items() if 100.0 * b[0] >= rule.clear]
    since_of = _falling_behind_since(slow, reach, {i: 0.1 * best[i][2] for i in slow})
    by_lead = {id(ranks[i]) for i in slow if best[i][4] == "lead"}
    lead_since = per_stage(ranks, lambda sub: _lead_since(
        [j for j, r in enumerate(sub) if id(r) in by_lead], sub, keep, rule.clear / 100.0))
    paced = {i: _pace_evidence(spans[ranks[i].rank], med, med_sorted, ranks[i].rank)
             for i, b in best.items() if b[4] == "pace"}
    return _measurements(ranks, best, lead, since_of, lead_since, paced)


def _pace_evidence(span: PaceSpan, med: dict[int, float], med_sorted: list[float], rank: int) -> dict[str, Any]:
    """What a pace figure spans, and beside it the rank's and the others' median step times over
    the window the step-time figure reads (None where it has none): a pace is no step time, and
    its hint says which it is (a user read "30 % slower" beside step times 5 % apart)."""
    mine = med.get(rank)
    return {"pace_steps": span.steps, "pace_span_s": span.seconds, "step_time_s": mine,
            "others_step_time_s": _median_without(med_sorted, mine) if mine is not None else None}


#: Two figures closer than this (a share of the step) are one: float rounding, not a measure.
_TIE = 1e-9


def _worst(candidates: list[_Best]) -> _Best:
    """The largest figure; of figures equal but for rounding the first (step time before pace
    before lead): a pace read from step times' sums equals their median to 1e-15, and which of the
    two the hint then named (and so how it said it) turned on that noise."""
    top = max(c[0] for c in candidates)
    return next(c for c in candidates if c[0] >= top - _TIE)


def _one_of_a_pair(best: dict[int, _Best], clear_pct: float, n_ranks: int) -> dict[int, _Best]:
    """Of two ranks, only one can be slower than the other: when both read as stragglers (each
    by its own worst measure, over windows of its own — in a 2-rank DDP job in lockstep, rank 1
    "14 % slower" by its step times and rank 0 "9 % slower" by its pace at once, a new user's
    trial), the larger claim stands and the other reads 0."""
    if n_ranks != 2 or len(best) != 2 or not all(100.0 * b[0] >= clear_pct for b in best.values()):
        return best
    worse = max(best, key=lambda i: best[i][0])
    return {i: b if i == worse else (0.0, *b[1:]) for i, b in best.items()}


def _staggered_by_rank(fig: staggered.Figures) -> dict[int, tuple[_Best, tuple[float, float, float, float] | None]]:
    """Per rank index: its worst figure over its window and its lead figures."""
    return {i: (best, fig.lead.get(i)) for i, best in _staggered_best(fig).items()}


def _staggered_best(fig: staggered.Figures) -> dict[int, _Best]:
    """Per rank index: the larger of its step-time and lead figures read in grid windows."""
    best: dict[int, _Best] = {}
    for idx, (mine, other) in fig.step_time.items():
        candidates = [(mine / other - 1.0, mine, other, fig.window, "step_time")] if other > 0 else []
        if idx in fig.lead and fig.lead[idx][3] > 0:
            lag, step = fig.lead[idx][2:]
            candidates.append((lag / step, mine, other, fig.window, "lead"))
        if candidates:
            best[idx] = _worst(candidates)
    return best


def _measurements(ranks: list[RankSnapshot], best: dict[int, _Best],
                  lead: dict[int, tuple[float, float, float, float]],
                  since_of: dict[int, tuple[int | None, float | None]] | None,
                  lead_since: dict[int, int],
                  paced: dict[int, dict[str, Any]] | None = None) -> dict[str, Measurement | None]:
    """The rule's measurement per rank from its worst figure (``best``), its lead figures and,
    for the slow ones, since when (the rank's step where that is not known; ``since_of`` None:
    the engine's, from when it first measured the rank behind). A figure by pace (``paced``:
    what it spans, the step times beside it) is said as a pace, never as step times."""
    out: dict[str, Measurement | None] = {}
    since_at = since_of or {}
    for idx, r in enumerate(ranks):
        figure = best.get(idx)
        if figure is None:
            out[rank_target(r)] = None
            continue
        slower, mine, other, n, basis = figure
        since, lag_s = since_at.get(idx, (None, None))
        if idx in lead_since:
            since = lead_since[idx]
        pct = 100.0 * slower
        text: dict[str, str] = {}
        ev: dict[str, Any] = {"slower_pct": pct, "basis": basis, "step_time_s": mine, "others_step_time_s": other,
                              "window_steps": n, "lag_s": lag_s}
        if basis == "pace" and paced is not None:
            ev["pace_s_per_step"], ev["others_pace_s_per_step"] = mine, other
            ev.update(paced[idx])
            step_s, others_s = ev["step_time_s"], ev["others_step_time_s"]
            # the step times beside a pace, where the window has them (never "n/a s")
            text["step_times"] = (f"; median step times {step_s:.3g} s vs {others_s:.3g} s"
                                  if step_s is not None and others_s is not None else "")
        if since_of is not None:
            ev["since_step"] = since if since is not None else r.step
        led = lead.get(idx)
        if led is not None:  # stored one by one: an update() of keywords built a dict a rank
            my_lead, others_lead, lead_lag, step = led
            ev["lead_s"], ev["others_lead_s"], ev["lead_lag_s"] = my_lead, others_lead, lead_lag
            ev["lag_pct_of_step"] = 100.0 * safe_div(lead_lag, step)
            text["lead_lag_ms"] = f"{1000.0 * lead_lag:.0f}"
        # Impact: the share of the step the others spend waiting for this rank.
        by_lead = basis == "lead"
        impact = slower if by_lead else safe_div(mine - other, mine)
        # positionally (its keywords were parsed per rank), a call mypy checks
        out[rank_target(r)] = Measurement(pct, ev, clamp01(impact), r.step, n, 0.0, text, None,
                                          "lead" if by_lead else "pace" if basis == "pace" else "", None)
    return out


def _median_without(ordered: list[float], value: float) -> float:
    """Median of ``ordered`` (sorted) with one occurrence of ``value`` removed, in O(log n): the
    other ranks' median without a sort per rank (a job may have a thousand ranks)."""
    n = len(ordered) - 1
    if n <= 0:
        return 0.0
    i = bisect.bisect_left(ordered, value)

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    if n % 2:
        return float(at(n // 2))
    return (at(n // 2 - 1) + at(n // 2)) / 2.0


def _falling_behind_since(
    ranks_idx: list[int], reach: Aligned, tol_s: dict[int, float]
) -> dict[int, tuple[int | None, float | None]]:
    """Per rank index: (step from which it has been falling behind, its lag now in s).

    Lag at step s = the rank's time to reach s − the other ranks' median time to reach s, over
    the recent steps all ranks reached (``since_steps`` of them, not just the window). The rank
    has been falling behind since the last step where the lag was within ``tol_s`` of its smallest
    value (the tolerance keeps receive-time jitter from picking a random step of a flat stretch).
    """
    common = reach.steps
    if not common or not ranks_idx:
        return {i: (None, None) for i in ranks_idx}
    lags: dict[int, list[float]] = {i: [] for i in ranks_idx}
    for column in reach.columns():
        without = medians_without(sorted(column))  # one sort per step, shared by every rank
        for i in ranks_idx:
            lags[i].append(column[i] - without(column[i]))
    out: dict[int, tuple[int | None, float | None]] = {}
    for i, lag in lags.items():
        low = min(lag)
        out[i] = (max(s for s, x in zip(common, lag) if x <= low + tol_s[i]), lag[-1])
    return out
