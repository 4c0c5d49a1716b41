"""Which ranks and rules of a large job a tick takes its turn with. No Textual.

A tick rebuilds the full views of RANKS_PER_TICK ÷ spread ranks of a job and measures a share of
its rules: a larger job's round takes :func:`ticks_per_round` ticks (the model, flowtop.monitor.model;
the spread, flowtop.monitor.thinning). The same in a replay, so a replay reproduces the hints.
"""

from __future__ import annotations

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


#: A large job's rules are measured in this many shares (by table index, a hidden rule with the
#: rule that hides it), at evenly spaced ticks of each round of ``spread`` ticks (every rule
#: still once a round). All at one tick held every frame behind that tick: at 4,096 ranks the
#: longest tick took 1.2-1.8 s of CPU on a 2-core box, 0.8-1.4 s in two shares, at about the same
#: CPU a round (+7 %, within noise); more shares cost more (each walks every rank again with cold
#: caches: +10-20 % tick CPU at 4 or 8).
HINT_SHARES = 2


def hint_share(tick: int, spread: int) -> tuple[int, int] | None:
    """(share, shares) to measure at ``tick`` of a job whose round is ``spread`` ticks, or None."""
    shares = min(HINT_SHARES, spread)
    at = tick % spread
    for k in range(shares):
        if at == k * spread // shares:
            return k, shares
    return None
