"""One rule for "the newest process of a rank number" (flowtop.monitor.claims.newest_per) and its variants:
the hints read the highest incarnation and, of equals, the last process in the job's order; the
model's view, the exporter and the screens read the highest incarnation, then the latest heard,
and of equals the first."""

from __future__ import annotations

import dataclasses

from flowtop.monitor.claims import newest_per, newest_ranks, rank_newness
from flowtop.monitor.hints.base import latest_ranks
from flowtop.tui.screens.snapshot_screen import pick_rank
from synthetic.replay import synthetic_snapshot


def _ranks():  # type: ignore[no-untyped-def]
    job = synthetic_snapshot(120, with_kernels=False).jobs[0]
    r0, r1 = job.ranks
    return job, [
        dataclasses.replace(r0, incarnation=0, pid=1, heard_at=5.0, status="done"),
        dataclasses.replace(r0, incarnation=1, pid=2, heard_at=3.0, status="stale"),
        dataclasses.replace(r0, incarnation=1, pid=3, heard_at=4.0, status="stale"),  # conflict: same incarnation
        dataclasses.replace(r0, incarnation=1, pid=4, heard_at=4.0, status="stale"),  # ... heard as late
        dataclasses.replace(r1, incarnation=0, pid=9, heard_at=1.0),
    ]


def test_newest_per_keeps_the_first_or_the_last_of_equals() -> None:
    items = [("a", 1, "x"), ("a", 2, "y"), ("b", 1, "z"), ("a", 2, "w")]
    first = newest_per(items, lambda t: t[0], lambda t: t[1])
    last = newest_per(items, lambda t: t[0], lambda t: t[1], later_wins_ties=True)
    assert first == {"a": ("a", 2, "y"), "b": ("b", 1, "z")} and list(first) == ["a", "b"]
    assert last == {"a": ("a", 2, "w"), "b": ("b", 1, "z")}


def test_the_variants_of_newest() -> None:
    job, ranks = _ranks()
    # Hints: incarnation only, the last of equals (pid 4), one per rank number, by rank.
    assert [(r.rank, r.pid) for r in newest_ranks(ranks)] == [(0, 4), (1, 9)]
    assert latest_ranks(dataclasses.replace(job, ranks=tuple(ranks))) == newest_ranks(ranks)
    # Exporter and model: incarnation, then the latest heard, the first of equals (pid 3).
    assert newest_per(ranks, lambda r: r.rank, rank_newness)[0].pid == 3
    # Screens: a live process first, then the same rule.
    live_old = dataclasses.replace(ranks[0], status="live")
    picked = pick_rank(dataclasses.replace(job, ranks=(live_old, *ranks[1:])), 0)
    assert picked is live_old
    assert pick_rank(dataclasses.replace(job, ranks=tuple(ranks)), 0) is ranks[2]
    assert pick_rank(dataclasses.replace(job, ranks=tuple(ranks)), 7) is None
