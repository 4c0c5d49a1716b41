"""Random views: the rank view's rows (flowtop.monitor.rankview.build_view, its cheap grouped
worst-first order: rankorder.node_order) against the plain order of the base (every rank sorted
by flowtop.monitor.rankview.sort_ranks, then grouped by host in the order hosts first come).

Jobs are made up to tie: a few hosts, few rank numbers claimed by several hosts' processes,
few steps, step times and MFUs (and None), random statuses (``stopped`` and unknown ones
included), conflicts, a host of no name, a job of one rank's copies (ties on every key), ranks
unheard behind a silent relay, straggler hints of equal impact; views: every sort (worst first
and each column), reversed or not, grouped or flat, filtered by status, host and rank (alone and
combined), nodes opened or closed by hand. A job of 0, 1 or a
few ranks and a node of one rank come up too. Prints the first differences and exits 1 on any.
(node_order without its fallback on tied worst ranks differs in about 2 views of 1,000.)

Usage::

    PYTHONPATH=. python bench/rank_order_check.py [--jobs 3000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tests/synthetic

from flowtop.monitor.rankfilter import parse_filter  # noqa: E402
from flowtop.monitor.rankview import (  # noqa: E402
    ALL_SORTS,
    OPEN_UP_TO,
    WORST,
    RankView,
    ViewSpec,
    build_view,
    job_context_of,
    node_key,
    rank_key,
    sort_ranks,
)
from flowtop.monitor.relayviews import RelayCut  # noqa: E402
from flowtop.monitor.snapshot import Claimant, Hint, JobSnapshot, RankSnapshot  # noqa: E402
from synthetic.cluster import cluster_job, cluster_rank  # noqa: E402

STATUSES = ("live", "live", "live", "stalled", "stale", "done", "failed", "stopped", "odd")


def random_rank(rng: random.Random, hosts: list[str], n_numbers: int) -> RankSnapshot:
    base = cluster_rank(rng.randrange(64))
    flops = base.flops
    assert flops is not None
    mfu = rng.choice((None, 0.0, 0.3, 0.3, 0.45))
    step_s = rng.choice((None, 0.2, 0.2, 0.26, 0.5))
    return replace(
        base, rank=rng.randrange(n_numbers), host=rng.choice(hosts), pid=rng.randrange(3),
        incarnation=rng.choice((0, 0, 1)), status=rng.choice(STATUSES), step=rng.choice((990, 999, 1000, 1000)),
        step_time_s=step_s, input_wait_frac=rng.choice((None, 0.01, 0.3)),
        tokens_per_s=rng.choice((None, 0.0, 8e4)),
        flops=None if rng.random() < 0.1 else replace(flops, mfu=mfu),
        conflict=(Claimant("x", 1),) if rng.random() < 0.1 else (),
        cut=RelayCut("relay0", 1.0) if rng.random() < 0.05 else None,
    )


def random_job(rng: random.Random) -> JobSnapshot:
    n = rng.choice((0, 1, 2, 3, 5, 8, 20, 40, 70, 120))
    hosts = [f"h{i}" for i in range(rng.choice((1, 2, 3, 5, 9)))] + ([""] if rng.random() < 0.2 else [])
    ranks = [random_rank(rng, hosts, rng.choice((1, 3, max(1, n // 2), max(1, n)))) for _ in range(n)]
    if ranks and rng.random() < 0.1:  # ties on every sort key: one rank's copies on every host
        ranks = [replace(ranks[0], host=rng.choice(hosts), pid=i) for i in range(n)]
    hints = tuple(Hint(id="straggler", severity="warning", scope="rank", target=f"rank {rng.randrange(8)}",
                       summary="", evidence={}, action="", impact=rng.choice((0.3, 0.3, 0.5)))
                  for _ in range(rng.choice((0, 0, 1, 3))))
    job = cluster_job(8, per_node=4)
    return replace(job, ranks=tuple(ranks), world_size=max(1, n), hints=hints)


def random_spec(rng: random.Random, hosts: list[str]) -> ViewSpec:
    sort = rng.choice((WORST, WORST, WORST, *ALL_SORTS))
    text = rng.choice(("", "", "", "stopped", "stalled stale", "h1*", "0-3", "h0* stopped failed", "h2* 1-",
                       "conflict", "live 2-5"))
    flt = parse_filter(text, set(), None)
    opened = frozenset(h for h in hosts if rng.random() < 0.3)
    closed = frozenset(h for h in hosts if rng.random() < 0.3) - opened
    return ViewSpec(sort=sort, reverse=rng.random() < 0.5, grouped=rng.random() < 0.75, filter=flt,
                    opened=opened, closed=closed)


def plain_view(job: JobSnapshot, spec: ViewSpec) -> list[tuple]:
    """The base's rows (d77ef80's build_view): keys, nesting and node membership."""
    keep = spec.filter.matcher(job)
    ranks = [r for r in job.ranks if keep(r)]
    ctx = job_context_of(job)
    ordered = sort_ranks(ranks, ctx, spec.sort, spec.reverse)
    by_host: dict[str, list[RankSnapshot]] = {}
    for r in ordered:
        by_host.setdefault(r.host, []).append(r)
    name = job.job
    if not (spec.grouped and len(by_host) > 1):
        return [("rank", rank_key(name, r), False) for r in ordered] + [("counts", len(ranks), len(by_host))]
    default = len(ranks) <= OPEN_UP_TO
    rows: list[tuple] = []
    for host, members in by_host.items():
        is_open = spec.is_open(host, default)
        rows.append(("node", node_key(name, host), tuple(rank_key(name, r) for r in members), is_open))
        if is_open:
            rows += [("rank", rank_key(name, r), True) for r in members]
    return rows + [("counts", len(ranks), len(by_host))]


def view_rows(view: RankView, job: JobSnapshot) -> list[tuple]:
    out: list[tuple] = []
    for row in view.rows:
        if hasattr(row, "host"):
            out.append(("node", row.key, tuple(rank_key(job.job, r) for r in row.ranks), row.open))
        else:
            out.append(("rank", row.key, row.nested))
    index = view.index()
    assert index == {row.key: i for i, row in enumerate(view.rows)}, "index differs from the rows"
    return out + [("counts", view.shown, view.nodes)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--views", type=int, default=8, help="random views per job")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bad = checked = 0
    for _ in range(args.jobs):
        job = random_job(rng)
        hosts = sorted({r.host for r in job.ranks})
        for _ in range(args.views):
            spec = random_spec(rng, hosts)
            want, got = plain_view(job, spec), view_rows(build_view(job, spec), job)
            checked += 1
            if want != got:
                bad += 1
                if bad <= 3:
                    print(f"differs: {len(job.ranks)} ranks, spec {spec}\n want {want}\n got  {got}")
    print(f"{checked} views of {args.jobs} jobs: {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
