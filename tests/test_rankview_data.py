"""The rank view's data side (flowtop.monitor.rankview, rankfilter, rankstats): order, groups, filter,
percentiles, map cells — over real snapshot dataclasses, no Textual."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from flowtop.monitor.rankfilter import FilterError, parse_filter
from flowtop.monitor.rankstats import (
    MISSING,
    NO_VALUE,
    STATUS_BINS,
    job_percentiles,
    map_layout,
    percentiles,
    rank_grid,
)
from flowtop.monitor.rankview import NodeRow, RankRow, ViewSpec, build_view, job_context, node_group, sort_ranks
from synthetic.cluster import Troubles, cluster_job, cluster_rank


@pytest.mark.parametrize("module", ["flowtop.monitor.rankview", "flowtop.monitor.rankfilter",
                                    "flowtop.monitor.rankstats", "flowtop.monitor.rankorder",
                                    "synthetic.cluster"])
def test_rank_view_data_side_imports_without_textual(module: str) -> None:
    code = f"import {module}, sys, json; print(json.dumps(sorted(sys.modules)))"
    mods = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                     cwd=os.path.dirname(__file__),
                                     check=True).stdout.splitlines()[-1])
    assert not [m for m in mods if m.split(".")[0] in ("textual", "torch")]


def _small_job(**troubles: object):
    return cluster_job(64, troubles=Troubles(**{"slow_node": 2, "stalled_rank": 5, "dead_nodes": (6,),
                                                "input_wait_ranks": (40,), "conflict_rank": 99, **troubles}))


def test_worst_first_puts_stuck_then_stragglers_then_low_mfu() -> None:
    job = _small_job()
    order = [r.rank for r in sort_ranks(job.ranks, job_context(job.ranks))]
    # the silent node 6 (ranks 48-55: when a node dies the others hang waiting for it, it is
    # the one to look at), then stalled rank 5, then the slow node 2 (3 steps behind), then
    # rank 40 (27 % slower than the median, no lag), then everyone by MFU.
    assert order[:8] == list(range(48, 56))
    assert order[8:9] == [5]
    assert order[9:17] == list(range(16, 24))
    assert order[17] == 40
    rest = [r for r in sort_ranks(job.ranks, job_context(job.ranks))][18:]
    mfus = [r.flops.mfu for r in rest]
    assert mfus == sorted(mfus) and len(rest) == 64 - 18


def test_nodes_whose_worst_ranks_tie_keep_the_order_of_the_ranks() -> None:
    """Rank 25 (node003) claimed again by a process on node375: the two conflicting processes
    have equal worst-first keys and each is its node's worst. The grouped view orders nodes by
    their worst rank (rankorder.node_order, sorting within nodes); on this tie it sorts every rank,
    and the node whose process the job lists first comes first (a stable sort): here node375's,
    listed between node003's ranks 24 and 25 (node003 is seen first, its rank 25 comes second)."""
    job = _small_job(conflict_rank=25)
    *ranks, twin = job.ranks
    job = dataclasses.replace(job, ranks=(*ranks[:25], twin, *ranks[25:]))
    assert [(r.host, r.rank) for r in job.ranks[24:27]] == [("node003", 24), ("node375", 25), ("node003", 25)]
    view = build_view(job, ViewSpec())
    hosts = [row.host for row in view.rows if isinstance(row, NodeRow)]
    # worst first: silent node006, node000 (stalled rank 5), the two claimants, slow node002
    assert hosts[:5] == ["node006", "node000", "node375", "node003", "node002"]
    assert len(hosts) == 9 and view.rows[2].ranks[0].rank == 25 and view.rows[3].ranks[0].rank == 25


def test_a_rank_a_straggler_hint_names_leads_the_stragglers() -> None:
    """A late forward (the usual DDP straggler) shows neither a step lag nor a slower step time:
    rank 517's hint said "finishes its forward 80 ms after the others" while its row sat
    mid-list among 1,024 ranks (a new user's trial). The ranks the job's straggler hints name
    lead the live ranks, the one with the most at stake first; an ended hint does not."""
    from flowtop.monitor.rankview import job_context_of
    from flowtop.monitor.snapshot import Hint

    def hint(target: str, impact: float, ended: bool = False) -> Hint:
        return Hint(id="straggler", severity="warning", scope="rank", target=target, summary="", evidence={},
                    action="", impact=impact, ended=ended, first_step=0, last_step=0)

    job = dataclasses.replace(_small_job(), hints=(hint("rank 33", 0.2), hint("rank 60", 0.4), hint("rank 7", 0.9, True)))
    order = [r.rank for r in sort_ranks(job.ranks, job_context_of(job))]
    assert order[:9] == [*range(48, 56), 5]  # the silent node and the stalled rank still first
    assert order[9:11] == [60, 33]  # then the ranks the hints name, most at stake first
    assert order[11:19] == list(range(16, 24))  # then the slow node (3 steps behind)
    assert order.index(7) > 19  # an ended hint's rank is back among the rest


def test_a_rank_a_signal_ended_sorts_before_the_crashes_that_followed() -> None:
    """A node SIGTERMed mid-run (scancel, preemption) says bye "SIGTERM" and is ``stopped``; its
    peers then fail in their broken collectives. The signalled ranks are where it started: they
    sort first, before the failed ones (a new user's trial had them last, below the gloo errors),
    as does their node row's worst status; a rank done without a signal stays last."""
    job = _small_job(dead_nodes=())
    by_rank = {r.rank: r for r in job.ranks}
    ranks = []
    for r in job.ranks:
        if r.rank in (8, 9):  # node 1: SIGTERMed
            r = dataclasses.replace(r, status="stopped", bye_reason="SIGTERM", heard_at=1000.0)
        elif r.rank in (0, 3):  # peers whose collective broke, moments later
            r = dataclasses.replace(r, status="failed", bye_reason="error: RuntimeError: Connection reset by peer",
                                    heard_at=1000.2)
        elif r.rank == 63:  # ended cleanly
            r = dataclasses.replace(r, status="done", bye_reason=None)
        ranks.append(r)
    assert by_rank[8].status == "live"
    order = [r.rank for r in sort_ranks(ranks, job_context(ranks))]
    assert order[:4] == [8, 9, 0, 3]
    assert order[-1] == 63
    node1 = node_group(by_rank[8].host, [r for r in ranks if r.host == by_rank[8].host], job_context(ranks))
    assert by_rank[8].host == by_rank[9].host and node1.worst_status == "stopped"  # live ranks 10-15 beside them
    only = node_group("x", [r for r in ranks if r.rank in (8, 9, 0)], job_context(ranks))
    assert only.worst_status == "stopped"  # a node's word, as a job's: its first ending (snapshot.job_end_status)


def test_a_crash_sorts_before_the_ranks_a_launcher_stopped_after_it() -> None:
    """torchrun's usual ending: rank 13 raises, its bye names the exception; the agent then stops
    every other rank with SIGTERM (their byes "SIGTERM", heard after the crash). The crash is
    the thing to look at: it sorts first, the ranks stopped because of it after every failed
    rank (they sorted first, rank 13 below 63 of them), and the node rows holding the crash read
    ``failed`` as the job does; a node with only stopped ranks reads ``stopped``."""
    job = _small_job(dead_nodes=(), stalled_rank=9999, slow_node=9999, conflict_rank=9999)
    ranks = []
    for r in job.ranks:
        if r.rank == 13:
            r = dataclasses.replace(r, status="failed", bye_reason="error: ValueError: bad batch", heard_at=1000.0,
                                    step=100)
        else:
            r = dataclasses.replace(r, status="stopped", bye_reason="SIGTERM", heard_at=1000.0 + 0.1 + r.rank / 1e3,
                                    step=100)
        ranks.append(r)
    order = [r.rank for r in sort_ranks(ranks, job_context(ranks))]
    assert order[0] == 13
    assert order[1:] == [n for n in range(64) if n != 13]  # then the stopped, lowest step then rank (all equal steps)
    host13 = next(r.host for r in ranks if r.rank == 13)
    node = node_group(host13, [r for r in ranks if r.host == host13], job_context(ranks))
    assert node.worst_status == "failed" and len(node.ranks) == 8
    other = node_group("y", [r for r in ranks if r.host != host13][:8], job_context(ranks))
    assert other.worst_status == "stopped"


def test_column_sort_worst_values_first_and_missing_last() -> None:
    job = _small_job()
    ctx = job_context(job.ranks)
    no_flops = dataclasses.replace(job.ranks[7], flops=None)
    ranks = [*job.ranks[:7], no_flops, *job.ranks[8:]]
    by_mfu = sort_ranks(ranks, ctx, "mfu")
    assert by_mfu[0].flops.mfu == 0.0 and by_mfu[-1] is no_flops  # lowest first, unknown last
    assert sort_ranks(ranks, ctx, "mfu", reverse=True)[-1] is no_flops  # reversed: still last
    assert [r.rank for r in sort_ranks(ranks, ctx, "rank")][:3] == [0, 1, 2]
    lags = [ctx.lag(r) for r in sort_ranks(ranks, ctx, "lag")]
    assert lags == sorted(lags, reverse=True) and lags[0] == 10  # the stalled rank, 10 steps behind


def test_node_rows_aggregate_their_ranks() -> None:
    job = _small_job()
    view = build_view(job, ViewSpec())
    assert view.grouped and view.nodes == 8 and view.total == 64
    assert all(isinstance(r, NodeRow) for r in view.rows[:1])
    assert isinstance(view.rows[0], NodeRow) and view.rows[0].host == "node006"  # the silent node first
    first = next(r for r in view.rows if isinstance(r, NodeRow) and r.host == "node000")
    assert first.open  # 64 ranks: open
    g = first.group
    assert (len(g.ranks), g.worst_status, g.max_lag) == (8, "stalled", 10)
    assert g.mfu_min == 0.0 and g.mfu_median == pytest.approx(0.45, abs=0.02)
    assert [r.rank for r in first.ranks][0] == 5  # the node's worst rank leads it
    assert isinstance(view.rows[1], RankRow) and view.rows[1].nested and view.rows[9].host == "node000"


def test_nodes_start_closed_beyond_a_screenful_and_toggle_by_hand() -> None:
    job = cluster_job(4096)
    spec = ViewSpec()
    view = build_view(job, spec)
    assert len(view.rows) == 512 and not view.open_default
    assert [r.host for r in view.rows[:6]] == ["node300", "node301", "node302", "node303", "node154", "node375"]
    spec = spec.toggled("node154", view.open_default)
    view = build_view(job, spec)
    assert len(view.rows) == 520 and [r.rank.rank for r in view.rows[5:6]] == [1234]
    flat = build_view(job, dataclasses.replace(spec, grouped=False))
    assert len(flat.rows) == 4097 and not flat.grouped


def test_one_host_is_not_grouped() -> None:
    job = cluster_job(8)
    assert not build_view(job, ViewSpec()).grouped


@pytest.mark.parametrize(
    ("text", "shown"),
    [("node01*", 80), ("128-255", 128), ("stalled", 1), ("hung", 1), ("input_wait", 2), ("stale", 32),
     ("stale stalled", 33), ("node30* stale", 32), ("rank:4000-", 96), ("host:node000,node001", 16),
     ("conflict", 2), ("straggler", 8), ("hint:hang_rank", 1), ("", 4097)],
)  # fmt: skip
def test_filter_terms(text: str, shown: int) -> None:
    job = cluster_job(4096)
    flt = parse_filter(text)
    view = build_view(job, ViewSpec(filter=flt))
    assert view.shown == shown
    assert flt.active == bool(text)


@pytest.mark.parametrize("text", ["rank:9-1", "status:sleepy", "colour:red", "rank:x"])
def test_filter_errors_say_what_is_wrong(text: str) -> None:
    with pytest.raises(FilterError):
        parse_filter(text)


def test_percentiles_interpolate_like_numpy() -> None:
    assert percentiles([4.0, 1.0, 3.0, 2.0]) == (1.0, 2.5, pytest.approx(3.85), 4.0)
    assert percentiles([]) is None
    job = _small_job()
    done = dataclasses.replace(job.ranks[63], status="done", input_wait_frac=0.9)
    p = job_percentiles(dataclasses.replace(job, ranks=(*job.ranks[:63], done)))
    assert p.ranks == 63  # stalled and stale ranks count (MFU 0), a finished one does not
    assert p.mfu is not None and p.mfu[0] == 0.0 and p.mfu[-1] == pytest.approx(0.4639, abs=1e-3)
    assert p.input_wait_frac == (0.01, 0.01, 0.01, 0.3)


def test_map_layout_fits_4096_ranks_in_a_64x64_block_or_several_per_cell() -> None:
    full = map_layout(4096, 64, 32)
    assert (full.per_cell, full.width, full.cell_rows, full.half, full.text_size) == (1, 64, 64, True, (64, 32))
    short = map_layout(4096, 64, 4)  # the 80x24 band
    assert (short.per_cell, short.width, short.text_size) == (8, 64, (64, 4))
    small = map_layout(24, 64, 4)  # few ranks: two characters a cell, a node a row
    assert (small.per_cell, small.width, small.half, small.text_size) == (1, 8, False, (16, 3))


def test_map_cells_show_the_worst_rank_and_unseen_ranks() -> None:
    job = _small_job()
    grid = rank_grid(job, "mfu", map_layout(64, 64, 32))
    assert grid.ranks[5] is not None and grid.ranks[5].rank == 5
    assert grid.bins[5] == 4 and grid.bins[0] == 0  # MFU 0 (stalled) vs 45 %
    coarse = rank_grid(job, "mfu", map_layout(64, 4, 1))  # 8 cells of 8 ranks
    assert coarse.layout.per_cell == 8 and coarse.ranks[0].rank == 5  # the stalled one speaks for its cell
    missing = dataclasses.replace(job, ranks=tuple(r for r in job.ranks if r.rank != 9), world_size=64)
    status = rank_grid(missing, "status", map_layout(64, 64, 32))
    assert status.bins[9] == STATUS_BINS["missing"] and status.bins[5] == STATUS_BINS["stalled"]
    assert rank_grid(missing, "mfu", map_layout(64, 64, 32)).bins[9] == MISSING
    no_count = dataclasses.replace(job, ranks=(dataclasses.replace(cluster_rank(0), flops=None),))
    assert rank_grid(no_count, "mfu", map_layout(1, 64, 32)).bins[0] == NO_VALUE


def test_node_group_of_a_node_with_no_flop_count() -> None:
    ranks = [dataclasses.replace(cluster_rank(r), flops=None) for r in range(8)]
    g = node_group("node000", ranks, job_context(ranks))
    assert g.mfu_min is None and g.mfu_median is None and g.worst_status == "live"
    assert not g.conflict


def test_a_node_with_a_rank_claimed_twice_says_so() -> None:
    from flowtop.monitor.snapshot import Claimant

    ranks = [cluster_rank(r) for r in range(8)]
    ranks[3] = dataclasses.replace(ranks[3], conflict=(Claimant("node000", 999),))
    g = node_group("node000", ranks, job_context(ranks))
    assert g.conflict and g.worst_status == "live"


def test_the_filter_of_a_hint_names_its_ranks_or_else_its_id() -> None:
    from flowtop.monitor.rankfilter import hint_filter, parse_filter
    from flowtop.monitor.snapshot import Hint

    def hint(scope: str, target: str, **evidence: object) -> Hint:
        return Hint(id="hang_all", severity="critical", scope=scope, target=target, summary="", evidence=evidence,
                    action="", impact=1.0)

    assert hint_filter([hint("rank", "rank 7"), hint("rank", "rank 5"), hint("rank", "rank 6"),
                        hint("rank", "rank 9")]) == "rank:5-7,9"
    # a job's hint: the ranks its evidence lists (silent and failed ranks of a hang), else its id
    assert hint_filter([hint("job", "", silent_ranks=[720, 721, 722, 723], failed_ranks=[3], ranks_n=4096)]) \
        == "rank:3,720-723"
    assert hint_filter([hint("job", "", ranks_n=4096)]) == "hint:hang_all"
    assert parse_filter("rank:3,720-723").ranges == ((3, 3), (720, 723))


def test_a_bare_word_that_names_no_host_of_the_job_is_refused() -> None:
    from flowtop.monitor.rankfilter import FilterError, parse_filter

    hosts = {"node001.cluster", "node002.cluster"}
    with pytest.raises(FilterError, match="'stalld' is no status, hint id or host of this job"):
        parse_filter("stalld", hosts=hosts)
    assert parse_filter("node00* stalled", hosts=hosts).hosts == ("node00*",)
    assert parse_filter("node002", hosts=hosts).hosts == ("node002",)  # the short name
    assert parse_filter("host:gpu*", hosts=hosts).hosts == ("gpu*",)  # a prefix takes any glob
    assert parse_filter("stalld").hosts == ("stalld",)  # no job to check against


def test_the_filter_of_an_ended_job_hint_keeps_every_rank_and_ranges_may_overlap() -> None:
    """``f`` on an ended job-wide hint: hint:<id> matches no rank once it ended (the table went
    empty), so no filter. Rank ranges are tested by bisection (``f`` can make hundreds)."""
    from flowtop.monitor.rankfilter import _range_test, hint_filter
    from flowtop.monitor.snapshot import Hint

    ended = Hint(id="input_bound", severity="warning", scope="job", target="", summary="", evidence={"ranks_n": 8},
                 action="", impact=0.3, ended=True)
    assert hint_filter([ended]) == ""
    flag = dataclasses.replace(ended, ended=False, evidence={"silent_ranks": [True, 4]})
    assert hint_filter([flag]) == "rank:4"  # a flag is no rank number
    test = _range_test(((10, 20), (0, 3), (12, 14), (30, 30), (2, 5)))
    kept = [r for r in range(40) if test(cluster_rank(r))]
    assert kept == [*range(0, 6), *range(10, 21), 30]


def test_a_node_s_exported_state_with_an_unheard_rank_says_failed_over_stopped() -> None:
    """flowtop_node_status of a node holding a crashed rank, ranks a signal stopped and one unheard
    behind a closed relay: "failed" where the crash ended first (its bye sent at 1.0, the stop's at
    2.0), as its node row and its job read (the first ending); "stopped" where the stop's bye was
    sent first (its crash followed it), and without the crash (before "unheard": the monitor heard
    that signal itself)."""
    from flowtop.export.rank_series import node_state
    from flowtop.monitor.relayviews import RelayCut

    job = _small_job(dead_nodes=())
    host = job.ranks[0].host
    members = [r for r in job.ranks if r.host == host][:3]
    crashed = dataclasses.replace(members[0], status="failed", bye_reason="error: ValueError: x", heard_at=1.0)
    stopped = dataclasses.replace(members[1], status="stopped", bye_reason="SIGTERM", heard_at=2.0)
    unheard = dataclasses.replace(members[2], status="stale", cut=RelayCut(host, None))
    ranks = [crashed, stopped, unheard]
    assert node_state(node_group(host, ranks, job_context(ranks)), ranks) == "failed"
    first = dataclasses.replace(stopped, ended_at=0.5)  # sent before the crash, received after it
    ranks = [crashed, first, unheard]
    assert node_state(node_group(host, ranks, job_context(ranks)), ranks) == "stopped"
    ranks = [stopped, unheard]
    assert node_state(node_group(host, ranks, job_context(ranks)), ranks) == "stopped"


def test_a_status_the_filter_does_not_know_lists_every_status() -> None:
    """`status:sleepy` is refused naming the statuses a filter takes: "stopped" among them (it
    matches, yet the refusal listed live, stalled, stale, done, failed and conflict only)."""
    with pytest.raises(FilterError, match=r"a status is live, stalled \(hung\), stale, done, failed, stopped or conflict"):
        parse_filter("status:sleepy")
    assert parse_filter("status:stopped").active
