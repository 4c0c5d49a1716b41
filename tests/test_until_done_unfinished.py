"""``--until-done``'s timeout names the ranks that had not finished, by status.

A new user's trial: SIGKILL of rank 2 of 4 under torchrun (gloo). torchrun stopped the others
(bye "SIGTERM"); rank 2, killed outright, never said bye, so ``flowtop snapshot --until-done
--timeout 60`` waited for its timeout and said only "not every rank had finished after 60 s (the
timeout); the output shows them as they were": which rank, and that it was silent, was the JSON's
to find. The snapshot here is test_first_ending's (rank 2 last heard at 1.5, the others' byes at
2.05, taken at 41.5: rank 2 silent for 40 s).
"""

from __future__ import annotations

import pytest

from flowtop.export.serve import after_timeout, not_done
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from test_first_ending import _killed_then_stopped


def test_a_timeout_names_the_silent_rank_and_how_the_others_ended(capsys: pytest.CaptureFixture[str]) -> None:
    snap = _killed_then_stopped("SIGTERM")
    assert not_done(after_timeout(60.0), snap) == 3
    assert capsys.readouterr().err == (
        "flowtop: --until-done: not every rank had finished after 60 s (the timeout); the output shows them as "
        "they were\n"
        "flowtop: --until-done: j: rank 2 stale (nothing heard for 40 s), ranks 0-1,3 stopped\n")


def test_live_ranks_and_ranks_never_heard_are_named(capsys: pytest.CaptureFixture[str]) -> None:
    """A world of 4 of which ranks 0-1 step on (last received 1.5, taken at 2.0) and 2-3 never
    reached this monitor."""
    model = make_model()
    for r in (0, 1):
        key = RankKey("j", "node-a", 100 + r, r, 0)
        model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0, {"local_rank": r, "world_size": 4,
                                                                     "device": "cpu (test)", "probe_version": "t"})), 1.0)
        model.ingest(wire.decode(wire.encode("step", key, 2, 1.5, {"step": 1, "wall_s": 0.1, "tokens": 8,
                                                                    "drops": 0})), 1.5)
    assert not_done(after_timeout(5.0), model.tick(2.0)) == 3
    assert capsys.readouterr().err.splitlines()[1] == (
        "flowtop: --until-done: j: ranks 0-1 live, ranks 2-3 of 4 never heard")


def test_a_rank_behind_a_dead_relay_reads_unheard_not_stale(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 3's relay on node-b silent for 43 s while ranks 0-2 step on: "unheard behind relay
    node-b silent", as its relay_silent hint says (it may still train), not "stale (nothing heard
    for 43 s)" (a reviewer's case)."""
    from flowtop.monitor.relays import SILENT_AFTER_S
    from test_unheard import _Job

    j = _Job()
    j.run(3.0)
    j.relayed = False
    snap = j.run(SILENT_AFTER_S + 40.0)
    assert not_done(after_timeout(60.0), snap) == 3
    assert capsys.readouterr().err.splitlines()[1] == (
        "flowtop: --until-done: j: ranks 0-2 live, rank 3 unheard behind relay node-b silent")
