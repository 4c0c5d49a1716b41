"""The straggler rule's figures for ranks whose histories have no step in common.

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

from flowtop.monitor.hints.aligned import medians_without
from flowtop.monitor.snapshot import RankSnapshot

#: Fewest ranks covering a window for a rank to be read in it: itself and two others (one other
#: rank alone would decide whether it is the slow one).
MIN_GROUP = 3
#: Most windows read: ranks in lockstep whose newest steps are a pace apart need two or three;
#: more says they are not in lockstep (ranks thousands of steps apart), and a window per rank
#: would cost a pass over every rank each.
MAX_WINDOWS = 8


@dataclass(frozen=True)
class Figures:
    """Per rank index: ``step_time`` (its median step time over its window, the other ranks'
    median of theirs over the same window) and ``lead`` (its median lead, the others' median
    lead, the difference, its median step time), each only where enough ranks covered its
    window; ``window``: the steps each figure spans."""

    step_time: dict[int, tuple[float, float]]
    lead: dict[int, tuple[float, float, float, float]]
    window: int


def tail_start(steps: Sequence[int]) -> int:
    """The index from which ``steps`` (strictly increasing) run contiguously to the end: a rank's
    recent steps after its last gap (a lost or refused frame). Found by bisection: a suffix that
    runs contiguously from one index does from every later one too."""
    n = len(steps)
    if not n:
        return 0
    last = steps[-1]
    lo, hi = 0, n - 1  # the suffix from hi is contiguous; find the first index whose suffix is
    while lo < hi:
        mid = (lo + hi) // 2
        if last - steps[mid] == n - 1 - mid:
            hi = mid
        else:
            lo = mid + 1
    return lo


def choose_windows(firsts: Sequence[int], lasts: Sequence[int], window: int) -> list[int | None]:
    """Per rank whose recent steps run contiguously from ``firsts[i]`` to ``lasts[i]``: the first
    step of the grid window it is read in (None: none it covers whole has MIN_GROUP ranks).

    Windows are picked one at a time, each the one that covers the most ranks not yet placed
    (then the most ranks, then the newest), at most MAX_WINDOWS; each rank is then read in the
    picked window it covers that the most ranks cover. Few windows to read (each costs a sort of
    its ranks' figures), and every rank in the largest group they offer it."""
    spans = [(-(-a // window), (b + 1) // window - 1) for a, b in zip(firsts, lasts)]
    total: Counter[int] = Counter()
    for lo, hi in spans:
        total.update(range(lo, hi + 1))
    picked: set[int] = set()
    left = [i for i, (lo, hi) in enumerate(spans) if hi >= lo]
    while left and len(picked) < MAX_WINDOWS:
        count: Counter[int] = Counter()
        for i in left:
            count.update(range(spans[i][0], spans[i][1] + 1))
        k = max(count, key=lambda k: (count[k], total[k], k))
        picked.add(k)
        left = [i for i in left if not spans[i][0] <= k <= spans[i][1]]
    out: list[int | None] = []
    for lo, hi in spans:
        mine = [k for k in picked if lo <= k <= hi and total[k] >= MIN_GROUP]
        out.append(window * max(mine, key=lambda k: (total[k], k)) if mine else None)
    return out


def figures(ranks: Sequence[RankSnapshot], window: int) -> Figures:
    """The straggler figures of ``ranks`` read in grid windows of ``window`` steps (each rank's
    steps after its last gap)."""
    runs = []  # (rank index, first step of its contiguous tail, index of that step in its history)
    for i, r in enumerate(ranks):
        steps = r.history.steps
        if steps:
            at = tail_start(steps)
            runs.append((i, steps[at], at, len(steps)))
    chosen = choose_windows([first for _, first, _, _ in runs], [first + n - at - 1 for _, first, at, n in runs],
                            window)
    times: dict[tuple[int, int], float] = {}  # (rank index, window start) -> median step time
    leads: dict[tuple[int, int], float] = {}  # ... median lead, where the probe sent every one
    groups: dict[int, list[int]] = {}  # window start -> the rank indices that cover it
    for start in set(w for w in chosen if w is not None):
        group = groups[start] = []
        for i, first, at, n in runs:
            if first <= start and start + window <= first + n - at:
                h = ranks[i].history
                a = at + start - first
                times[i, start] = float(statistics.median(h.step_time_s[a:a + window]))
                lead = h.lead_s[a:a + window]
                if min(lead) > 0.0:  # 0.0: a step the probe sent no lead for
                    leads[i, start] = float(statistics.median(lead))
                group.append(i)
    # Per window, the "median of the others" functions of its ranks' figures (a sort per window).
    others_t = {start: medians_without(sorted(times[q, start] for q in group)) for start, group in groups.items()}
    led = {start: sorted(leads[q, start] for q in group if (q, start) in leads) for start, group in groups.items()}
    others_l = {start: medians_without(values) for start, values in led.items()}
    step_time: dict[int, tuple[float, float]] = {}
    lead_of: dict[int, tuple[float, float, float, float]] = {}
    for (i, _, _, _), w in zip(runs, chosen):
        if w is None:
            continue
        mine = times[i, w]
        step_time[i] = (mine, others_t[w](mine))
        if (i, w) in leads and len(led[w]) >= MIN_GROUP:
            my_lead = leads[i, w]
            others_lead = others_l[w](my_lead)
            lead_of[i] = (my_lead, others_lead, my_lead - others_lead, mine)
    return Figures(step_time, lead_of, window)
