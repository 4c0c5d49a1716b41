"""An elastic restart's old processes sort below the current run's problems (flowtop.monitor.rankview
HISTORY_TIER), told by when the monitor first saw each process, not by incarnation.

torchrun counts restarts per node agent: the agent whose worker crashed restarts its workers at
incarnation + 1, the others restart theirs at the same incarnation, and the rendezvous may hand
a rank number to another node. So after two crash-restarts an old process at incarnation 1 can
hold a rank number beside the current one's at 0; when the whole job then goes silent (nothing
runs: claims.superseded hides no one) the claims show the old crash and stop in place of the
current processes (the newest incarnation), and worst-first put them above the current ranks
gone silent. A process not heard since another process took its rank number is history. The
reverted order by incarnation (6992884) sank a crash at incarnation 0 on a node beside one at 1:
the guard below. The real model, real wire frames, a clock driven by hand (test_succession.Job).
"""

from __future__ import annotations

import dataclasses

from flowtop.monitor.claims import is_history
from flowtop.monitor.rankview import ViewSpec, build_view, job_context_of
from flowtop.monitor.snapshot import JobSnapshot
from probe.wire import RankKey
from synthetic.cluster import cluster_rank
from test_succession import Job

CRASH = "error: ValueError: bad batch"


def _start(job: Job, host: str, ranks: range, inc: int, pid0: int) -> list[RankKey]:
    keys = [RankKey(job.name, host, pid0 + r, r, inc) for r in ranks]
    for key in keys:
        job.send(key, "hello", {"local_rank": key.rank % 2, "world_size": 4, "device": "cpu (test)",
                                "probe_version": "test"})
        job.steps[key] = 0
    return keys


def _end(job: Job, crashed: RankKey, stopped: list[RankKey]) -> None:
    """``crashed`` raises; 0.1 s later its agent and the others stop the rest (SIGTERM)."""
    job.now += 0.1
    job.send(crashed, "bye", {"reason": CRASH, "steps": job.steps[crashed], "drops": 0})
    job.now += 0.1
    for key in stopped:
        job.send(key, "bye", {"reason": "SIGTERM", "steps": job.steps[key], "drops": 0})
    job.now += 2.0  # the agents' restart


def _first_crash_restarted(name: str) -> tuple[Job, list[RankKey], list[RankKey]]:
    """Node A (ranks 0-1) and node B (2-3) at incarnation 0; rank 0 crashes; A's agent restarts
    its workers at incarnation 1, B's at 0 (not counted): the second run's A and B keys."""
    job = Job(name)
    a0, b0 = _start(job, "A", range(0, 2), 0, 100), _start(job, "B", range(2, 4), 0, 200)
    job.run(a0 + b0, 5)
    _end(job, a0[0], a0[1:] + b0)
    a1, b1 = _start(job, "A", range(0, 2), 1, 110), _start(job, "B", range(2, 4), 0, 210)
    job.run(a1 + b1, 5)
    return job, a1, b1


def _order(job: JobSnapshot) -> list[tuple[int, str, int, str]]:
    """The rank view's rows, worst first, flat: (rank, host, incarnation, status)."""
    view = build_view(job, ViewSpec(grouped=False))
    return [(row.rank.rank, row.rank.host, row.rank.incarnation, row.rank.status) for row in view.rows]


def test_a_restart_s_old_crash_sorts_below_the_current_ranks_gone_silent() -> None:
    """Rank 0 crashes again (node A, incarnation 1); the third run gets ranks 0-1 on node B
    (incarnation 0, first seen 2.1 s after the second crash) and 2-3 on node A (incarnation 2);
    5 s later the whole job goes silent. The claims show the second run's rank 0 (failed) and 1
    (stopped), incarnation 1 above B's 0, beside A's ranks 2-3 (stale). Those two ended before B's
    processes took their numbers: history, below the silent ranks (the base: the crash first, the
    stop, then the silent ranks), the crash before the stop it caused."""
    job, a1, b1 = _first_crash_restarted("pa")
    _end(job, a1[0], a1[1:] + b1)
    b2, a2 = _start(job, "B", range(0, 2), 0, 220), _start(job, "A", range(2, 4), 2, 120)
    job.run(b2 + a2, 5)
    snap = job.run([], 20)  # all silent (stale after 5 s)
    assert _order(snap) == [(2, "A", 2, "stale"), (3, "A", 2, "stale"), (0, "A", 1, "failed"), (1, "A", 1, "stopped")]
    ctx = job_context_of(snap)
    assert [r.rank for r in snap.ranks if ctx.history(r)] == [0, 1]
    assert ctx.first_failure_at is None  # the old crash is no current rank's cause


def test_a_crash_at_incarnation_0_beside_a_node_at_1_is_the_current_run_s() -> None:
    """The guard (the reverted order by incarnation sank it): after the first crash-restart node B
    runs at incarnation 0 beside node A at 1; now B's rank 2 crashes and the agents stop the rest.
    Every process shown is of the current run (each first seen after its rank's old process
    ended, none since): the crash first, then the stops it caused in rank order, before and after."""
    job, a1, b1 = _first_crash_restarted("guard")
    _end(job, b1[0], a1 + b1[1:])
    snap = job.run([], 1)
    assert sorted(snap.claimed_at) == [0, 1, 2, 3]  # every rank number held twice: the rule is in play
    assert _order(snap) == [(2, "B", 0, "failed"), (0, "A", 1, "stopped"), (1, "A", 1, "stopped"),
                            (3, "B", 0, "stopped")]
    assert snap.status == "failed"


def test_a_crash_on_a_node_at_incarnation_0_while_the_other_runs_on_leads() -> None:
    """The same guard while node A (incarnation 1) still runs: B's crash leads, A's live ranks follow."""
    job, a1, b1 = _first_crash_restarted("guard2")
    job.now += 0.1
    job.send(b1[0], "bye", {"reason": CRASH, "steps": job.steps[b1[0]], "drops": 0})
    snap = job.run(a1 + b1[1:], 1)
    assert [(r, s) for r, _, _, s in _order(snap)][:1] == [(2, "failed")]
    assert sorted(r for r, _, _, s in _order(snap)[1:]) == [0, 1, 3]


def test_history_is_a_last_frame_at_or_before_another_process_took_the_rank_number() -> None:
    """The rule's edges, on the monitor's clock: rank 7's newest process first seen at 50.0."""
    claimed = {7: 50.0}
    old = dataclasses.replace(cluster_rank(7), status="stopped", first_seen=10.0, heard_at=50.0)
    assert is_history(old, claimed)  # a start at the instant of its last frame follows it
    assert not is_history(dataclasses.replace(old, heard_at=50.5), claimed)  # heard after: current
    assert not is_history(dataclasses.replace(old, first_seen=50.0, heard_at=60.0), claimed)  # the newest itself
    assert not is_history(dataclasses.replace(old, status="stalled"), claimed)  # still runs
    assert is_history(dataclasses.replace(old, status="stale"), claimed)
    assert not is_history(dataclasses.replace(old, first_seen=None), claimed)  # made by hand
    assert not is_history(old, {8: 50.0})  # no process took its number
