"""The straggler rule's figures for ranks whose histories have no window of steps in common.

A large job with a fast step under a long pace (4,096 ranks at a 10 ms step send a frame every
2 s) has its ranks' newest steps up to 200 apart at any tick, while a history keeps 120: no step
index is in every rank's history, and a comparison by step over all ranks has nothing to compare.
Here ranks are compared in windows of the rule's length on a fixed grid of step indices (0-19,
20-39, ...), each rank in a window its history covers whole that many ranks cover too, against
the other ranks that cover it (not only those read in it). The same steps for all of them, so a
job-wide change of pace (longer sequences, an evaluation) reads alike for every rank; at a
200-step spread about half of a job's ranks cover each window a rank is read in.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from flowtop.monitor.hints.aligned import medians_without, run_start
from flowtop.monitor.snapshot import RankSnapshot


@dataclass(frozen=True)
class Figures:
    """Per rank index: ``step_time`` (its median step time over its window, the other ranks'
    median of theirs over the same window) and ``lead`` (its median lead, the others' median
    lead, the difference, its median step time), each only where there was another rank to
    compare with; ``starts``: the first step of the window each rank was read in; ``window``:
    the steps each figure spans."""

    step_time: dict[int, tuple[float, float]]
    lead: dict[int, tuple[float, float, float, float]]
    starts: dict[int, int]
    window: int


def choose_windows(firsts: Sequence[int], lasts: Sequence[int], window: int) -> list[int | None]:
    """Per rank whose steps run contiguously from ``firsts[i]`` to ``lasts[i]``: the first step of
    the grid window it is read in (None: its history covers no whole window). Windows are picked
    one at a time, each the one that covers the most ranks not yet placed (the newest of equals),
    and a rank is read in the first picked window it covers: every rank in a window most ranks
    share, and few windows to read (two or three at a 200-step spread, each a sort)."""
    spans = [(-(-a // window), (b + 1) // window - 1) for a, b in zip(firsts, lasts)]
    out: list[int | None] = [None] * len(spans)
    left = [i for i, (lo, hi) in enumerate(spans) if hi >= lo]
    while left:
        count: Counter[int] = Counter()
        for i in left:
            count.update(range(spans[i][0], spans[i][1] + 1))
        k = max(count, key=lambda k: (count[k], k))
        for i in left:
            if spans[i][0] <= k <= spans[i][1]:
                out[i] = window * k
        left = [i for i in left if out[i] is None]
    return out


def _median_of(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def figures(ranks: Sequence[RankSnapshot], window: int) -> Figures:
    """The straggler figures of ``ranks`` read in grid windows of ``window`` steps (ranks whose
    recent steps are not one contiguous run are left out: the model keeps them so but for a
    rank that restarted its count)."""
    runs = [(i, first, len(r.history.steps)) for i, r in enumerate(ranks)
            if (first := run_start(r.history.steps)) is not None]
    chosen = choose_windows([first for _, first, _ in runs], [first + n - 1 for _, first, n in runs], window)
    times: dict[tuple[int, int], float] = {}  # (rank index, window start) -> median step time
    leads: dict[tuple[int, int], float] = {}  # ... median lead, where the probe sent every one
    groups: dict[int, list[int]] = {}  # window start -> the rank indices that cover it
    for start in set(w for w in chosen if w is not None):
        group = groups[start] = []
        for i, first, n in runs:
            if first <= start and start + window <= first + n:
                h = ranks[i].history
                a = start - first
                times[i, start] = _median_of(h.step_time_s[a:a + window])
                lead = h.lead_s[a:a + window]
                if min(lead) > 0.0:  # 0.0: a step the probe sent no lead for
                    leads[i, start] = _median_of(lead)
                group.append(i)
    # Per window, the "median of the others" functions of its ranks' figures (a sort per window).
    others_t = {start: medians_without(sorted(times[q, start] for q in group)) for start, group in groups.items()}
    led = {start: sorted(leads[q, start] for q in group if (q, start) in leads) for start, group in groups.items()}
    others_l = {start: medians_without(values) for start, values in led.items()}
    step_time: dict[int, tuple[float, float]] = {}
    lead_of: dict[int, tuple[float, float, float, float]] = {}
    starts: dict[int, int] = {}
    for (i, _, _), at in zip(runs, chosen):
        if at is None or len(groups[at]) < 2:
            continue
        starts[i] = at
        mine = times[i, at]
        step_time[i] = (mine, others_t[at](mine))
        if (i, at) in leads and len(led[at]) >= 2:
            my_lead = leads[i, at]
            others_lead = others_l[at](my_lead)
            lead_of[i] = (my_lead, others_lead, my_lead - others_lead, mine)
    return Figures(step_time, lead_of, starts, window)
