"""What the hint measures share within an evaluation stays exact: the ranks every rule reads
(latest_ranks, taken once per job snapshot) and the straggler's frame ends (_time_changes, runs of
equal receive times instead of pairs)."""

from __future__ import annotations

from array import array

import dataclasses
import operator
import random
from itertools import compress, islice

from flowtop.monitor.claims import newest_ranks
from flowtop.monitor.compact import ArraySeq
from flowtop.monitor.hints.base import latest_ranks
from flowtop.monitor.hints.measures_straggler import _time_changes
from test_hints_factories import job, rank


def test_latest_ranks_is_taken_once_per_job_snapshot_and_never_served_stale() -> None:
    snap = job(*[rank(r) for r in (3, 1, 2, 0)])
    first = latest_ranks(snap)
    assert [r.rank for r in first] == [0, 1, 2, 3] and first == newest_ranks(snap.ranks)
    assert latest_ranks(snap) is first  # the same snapshot: shared by every rule
    # A new snapshot (the next tick's, or a replace()d one) gets its own, even with equal fields
    fewer = dataclasses.replace(snap, ranks=snap.ranks[:2])
    assert [r.rank for r in latest_ranks(fewer)] == [1, 3]
    restarted = dataclasses.replace(snap, ranks=(*snap.ranks, dataclasses.replace(snap.ranks[0], incarnation=1)))
    newest = latest_ranks(restarted)
    assert len(newest) == 4 and newest[3].incarnation == 1
    assert latest_ranks(snap) is first and [r.incarnation for r in first] == [0, 0, 0, 0]


def test_time_changes_are_the_pairs_that_differ() -> None:
    """As map(operator.ne) over neighbours: NaN (one object or many), ±0.0 and inf included."""
    rng = random.Random(3)
    nan = float("nan")
    for _ in range(2000):
        n = rng.randint(0, 300)
        values: list[float] = []
        while len(values) < n:
            values += [rng.choice([rng.random(), 0.0, -0.0, nan, float("inf"), 1.0])] * rng.randint(1, 50)
        values = values[:n]
        # array('d') takes the flat path (bisection over runs, checked bit for bit), the rest the pairs
        for times in (values, tuple(values), ArraySeq.of("d", values)[rng.randint(0, n):], array("d", values)):
            want = list(compress(range(len(times) - 1), map(operator.ne, times, islice(times, 1, None))))
            assert _time_changes(times) == want


def test_each_values_median_of_the_others_is_medians_without_of_it() -> None:
    from flowtop.monitor.hints.aligned import medians_without, medians_without_each

    rng = random.Random(9)
    for _ in range(3000):
        column = tuple(rng.choice([rng.random(), 0.5, 1, 2.0]) for _ in range(rng.randint(0, 12)))
        want = [medians_without(sorted(column))(v) for v in column]
        got = medians_without_each(column)
        assert got == want and [type(x) for x in got] == [type(x) for x in want]
