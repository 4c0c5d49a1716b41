"""Which ranks and rules of a large job a tick takes its turn with. No Textual.

A tick rebuilds the full views of RANKS_PER_TICK ÷ spread ranks of a job and measures a share of
its rules: a larger job's round takes :func:`ticks_per_round` ticks (the model, flowtop.monitor.model;
the spread, flowtop.monitor.thinning). The same in a replay, so a replay reproduces the hints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Ranks of a job whose views a tick rebuilds in full and whose hints it evaluates: a larger
#: job's views are rebuilt over ceil(ranks / RANKS_PER_TICK) ticks, staggered by rank (the others
#: get their step and liveness only), and its hints are evaluated once in that many ticks (in
#: HINT_SHARES shares). At 4,096 ranks a rank's figures and the job's hints then refresh every
#: 4 s instead of 0.5 s; the tick stays within its budget (bench/ingest.py --costs: a full view
#: and the hints cost ~0.3 ms a rank).
RANKS_PER_TICK = 512

#: How much thinner than RANKS_PER_TICK a tick may spread a large job's work (Model.spread; set by
#: the collector when its ticks crowd out its frames, flowtop.monitor.thinning; recorded, so that a
#: replay spreads its ticks where the live monitor did).
SPREADS = (1, 2, 4, 8)


def ranks_per_tick(spread: int = 1) -> int:
    """Ranks of a large job whose views a tick rebuilds in full at ``spread``."""
    return max(1, RANKS_PER_TICK // spread)


def ticks_per_round(ranks: int, spread: int = 1) -> int:
    """Ticks a job of ``ranks`` ranks takes to rebuild every view and measure every rule."""
    return -(-ranks // ranks_per_tick(spread))


#: A large job's rules are measured in this many shares (of about equal cost, a hidden rule with
#: the rule that hides it: HintEngine.plan), at evenly spaced ticks of each round of ``spread``
#: ticks (every rule still once a round). All at one tick held every frame behind that tick: at
#: 4,096 ranks the longest tick took 1.2-1.8 s of CPU on a 2-core box, 0.8-1.4 s in two shares by
#: table index. Four shares by cost (2026-12-06, 4,096 ranks in-process): the rules' costliest
#: share ~270 -> ~115 ms; what each share reads, every rank's history as it is then
#: (Model._as_now, ~120 ms), the tick before it takes (Prepared). A job whose round changes
#: length (ranks come, the spread changes) changes its shares: a rule may then be measured once
#: more or once less in that round.
HINT_SHARES = 4


def hint_share(tick: int, spread: int) -> tuple[int, int] | None:
    """(share, shares) to measure at ``tick`` of a job whose round is ``spread`` ticks, or None.
    At most one share every second tick: the tick before each takes its histories (Prepared),
    never the same tick (a round of 2-3 ticks measures every rule at once, 4-5 in two shares)."""
    shares = max(1, min(HINT_SHARES, spread // 2))
    at = tick % spread
    for k in range(shares):
        if at == k * spread // shares:
            return k, shares
    return None


def prepares(tick: int, spread: int) -> bool:
    """Whether ``tick`` takes the histories the next tick's share of the rules will read (the
    tick before a share's, itself not a share's: see :class:`Prepared`)."""
    return hint_share(tick, spread) is None and hint_share(tick + 1, spread) is not None


@dataclass(frozen=True, slots=True)
class Taken(Generic[T]):
    """What a tick took for the next one, and when (monitor time)."""

    at: float
    value: T


@dataclass(frozen=True, slots=True)
class _Held(Generic[T]):
    """What :class:`Prepared` holds for a job: the tick that took it, of which ranks, and what."""

    tick: int
    ranks: Sequence[object]  # in their order, compared by identity
    taken: Taken[T]


class Prepared(Generic[T]):
    """What a tick took for the next tick's share of a large job's rules, per job.

    A share's tick read every rank's history as it is now (Model._as_now, ~120 ms at 4,096 ranks)
    and measured its rules (~115 ms at most) at once; the tick before it now takes the histories
    and the share's tick measures them a tick later (the hang rule's 30 s floor and the
    straggler's windows of steps do not see half a second). What a tick took serves only the next
    tick, within ``within_s`` of it (a ticker that fell behind skips ticks), over the very ranks it
    was taken of (a rank that comes or goes, or another process shown for a rank number, voids
    it: the share's tick takes its own), and a rank's bye voids it."""

    def __init__(self, within_s: float) -> None:
        self.within_s = within_s
        self._held: dict[str, _Held[T]] = {}

    def keep(self, job: str, tick: int, at: float, ranks: Sequence[object], value: T) -> None:
        """Hold ``value``, taken by ``tick`` at monitor time ``at`` of ``ranks`` (in their order)."""
        self._held[job] = _Held(tick, ranks, Taken(at, value))

    def take(self, job: str, tick: int, now: float, ranks: Sequence[object]) -> Taken[T] | None:
        """What is held for ``job`` by the tick before ``tick`` of the same ``ranks`` (the same
        objects, in order) and within ``within_s`` of ``now``, or None."""
        held = self._held.pop(job, None)
        if held is None or held.tick != tick - 1 or now - held.taken.at > self.within_s:
            return None
        kept = held.ranks
        if len(kept) != len(ranks) or any(a is not b for a, b in zip(kept, ranks)):
            return None
        return held.taken

    def void(self, job: str) -> None:
        """Forget what is held for ``job`` (a rank's bye, the job forgotten)."""
        self._held.pop(job, None)

    def expire(self, tick: int) -> None:
        """Forget what ticks before ``tick`` held (what they took keeps ring blocks alive)."""
        for job in [j for j, held in self._held.items() if held.tick < tick]:
            del self._held[job]

    def __len__(self) -> int:
        return len(self._held)
