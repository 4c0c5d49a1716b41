"""What a tick reuses from the one before gives what it gave when built anew: a relay's row kept
from its last report (flowtop.monitor.relays.Relays.snapshot), and the processes an earlier run
left (flowtop.monitor.claims.superseded), whose per-rank starts are one latest start now."""

from __future__ import annotations

from flowtop.monitor.claims import Seen, superseded
from flowtop.monitor.relays import Relays
from probe import wire
from probe.wire import RankKey

REPORT = {"relay": "n0:7:1", "listen": "ipc:///x", "upstream": "tcp://m:1", "ranks": 2, "frames_in": 10,
          "frames_out": 9, "bytes_in": 1000, "bytes_out": 900, "drops": 1, "queued": 0, "commands": 3,
          "link_ups": 1, "uptime_s": 5.0, "hosted_by": "flowtop relay"}


def _report(relays: Relays, now: float, **changed: object) -> None:
    frame = wire.encode("relay", RankKey("", "n0", 7, 0, 0), 0, now, {**REPORT, **changed})
    relays.report(wire.decode(frame), now)


def test_a_relays_row_moves_with_the_clock_between_reports_and_shows_each_new_report() -> None:
    relays = Relays()
    _report(relays, 100.0)
    first = relays.snapshot(101.0)[0]
    assert (first.status, first.age_s, first.frames_in, first.commands, first.uptime_s) == ("live", 1.0, 10, 3, 5.0)
    # No report since: the same figures, 4 s older, silent past SILENT_AFTER_S (3 s).
    later = relays.snapshot(104.5)[0]
    assert (later.status, later.age_s, later.frames_in, later.commands, later.uptime_s) == ("silent", 4.5, 10, 3, 5.0)
    assert later.listen == "ipc:///x" and later.hosted_by == "flowtop relay" and later.drops == 1
    # A new report: its figures, live again.
    _report(relays, 105.0, frames_in=25, commands=4)
    new = relays.snapshot(105.5)[0]
    assert (new.status, new.age_s, new.frames_in, new.commands, new.frames_out) == ("live", 0.5, 25, 4, 9)


def _seen(job: str, rank: int, pid: int, running: bool, last_recv: float, first_seen: float) -> Seen:
    return Seen(RankKey(job, "h", pid, rank, 0), running, True, last_recv, first_seen)


def test_superseded_reads_the_latest_start_of_a_job_and_of_a_rank_number() -> None:
    seen = [
        _seen("a", 0, 1, True, 50.0, 10.0),  # running, last heard before rank 0's restart (pid 2) started
        _seen("a", 0, 2, True, 60.0, 55.0),  # the restart: kept
        _seen("a", 0, 3, True, 60.0, 40.0),  # an older start of rank 0, heard after 55: kept
        _seen("a", 1, 4, False, 55.0, 5.0),  # ended at the very instant the latest start of job a: gone
        _seen("a", 2, 5, False, 55.5, 5.0),  # ended after it: kept
        _seen("a", 3, 6, True, 58.0, 20.0),  # running alone: kept
        _seen("b", 0, 7, False, 30.0, 1.0),  # a job with no running process: kept
        _seen("b", 1, 8, True, 40.0, -float("inf")),  # a start never heard (the default): nothing after it
    ]
    assert superseded(seen) == {RankKey("a", "h", 1, 0, 0), RankKey("a", "h", 4, 1, 0)}


def test_no_rank_state_outlives_its_eviction_after_a_restart() -> None:
    """Rank 0 of 8 restarted (two processes of rank 0 for a while: the view's order is cached),
    then every rank silent past eviction: no RankState is left alive (the order's cache held the
    forgotten processes' states, a whole job's at 4,096 ranks, until the next restart anywhere;
    a reviewer's case)."""
    import gc

    from test_succession import Job

    from flowtop.monitor.rankstate import RankState

    j = Job("evicted-after-restart")  # a job name no other test uses: other tests' states may live on
    keys = j.start(range(8), inc=0, pid0=100)
    j.run(keys, 5.0)
    j.run(j.start(range(1), inc=1, pid0=900) + keys[1:], 5.0)
    for _ in range(140):  # 700 s: past EVICT_AFTER_S (600 s)
        j.now += 5.0
        j.model.tick(j.now)
    gc.collect()
    assert not j.model.ranks
    assert [o for o in gc.get_objects() if type(o) is RankState and o.key.job == j.name] == []

