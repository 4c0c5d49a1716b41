"""The snapshot JSON says when each rank ended and which ending was the job's cause (schema 1.14).

The monitor put each bye's send time on its own clock (RankSnapshot.ended_at) and followed the
first ending for the job's status, but the JSON carried neither: a script could not tell which
rank ended first. Every expectation here is derived by hand from the send and receive times below.
"""

from __future__ import annotations

import pytest

from flowtop.monitor.snapshot_json import SCHEMA, to_json
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot
from test_first_ending import CRASH, _model

HELLO = {"world_size": 3, "device": "cpu (test)", "probe_version": "t"}


def _ranks(data: dict[str, object]) -> dict[int, dict[str, object]]:
    (job,) = data["jobs"]  # type: ignore[misc]
    return {r["rank"]: r for r in job["ranks"]}  # type: ignore[index]


def test_schema_is_1_14() -> None:
    assert SCHEMA == "flowtop.snapshot/1.14"


def test_a_rank_ended_says_when_on_the_monitor_clock_and_a_running_one_null() -> None:
    """Rank 0's node clock is 100 s ahead of the monitor's: every frame it stamps reads +100. Its
    least transit (hello stamped 101.0, received 1.0) puts its stamps back by 100: its bye, stamped
    105.0 and received 5.4 (queued behind steps), ended at 5.0 on the monitor's clock. Rank 1 said
    bye "exit" stamped 5.2 (its clock the monitor's: hello 1.0 received 1.0), received 5.3: 5.2.
    Rank 2 still runs: null. The job's first ending is rank 0's stop (rank 1 is done, no cause)."""
    model = make_model()
    keys = {r: RankKey("j", f"node-{r}", 100 + r, r, 0) for r in range(3)}
    ahead = {0: 100.0, 1: 0.0, 2: 0.0}
    for r, key in keys.items():
        model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0 + ahead[r], {**HELLO, "local_rank": 0})), 1.0)
        model.ingest(wire.decode(wire.encode("step", key, 2, 1.5 + ahead[r], {"step": 1, "wall_s": 0.5, "tokens": 8,
                                                                               "drops": 0})), 1.6)
    running = to_json(model.tick(2.0))
    assert running["jobs"][0]["first_ending"] is None  # type: ignore[index]
    assert [r["ended_at"] for r in _ranks(running).values()] == [None, None, None]
    model.ingest(wire.decode(wire.encode("bye", keys[1], 3, 5.2, {"reason": "exit", "steps": 1, "drops": 0})), 5.3)
    model.ingest(wire.decode(wire.encode("bye", keys[0], 3, 105.0, {"reason": "SIGTERM", "steps": 1, "drops": 0})),
                 5.4)
    data = to_json(model.tick(6.0))
    assert_valid_snapshot(data)
    ranks = _ranks(data)
    assert ranks[0]["ended_at"] == pytest.approx(5.0) and ranks[1]["ended_at"] == pytest.approx(5.2)
    assert ranks[2]["ended_at"] is None
    first = data["jobs"][0]["first_ending"]  # type: ignore[index]
    assert first == {"rank": 0, "host": "node-0", "pid": 100, "incarnation": 0, "status": "stopped", "bye_reason": "SIGTERM",
                     "ended_at": pytest.approx(5.0)}
    assert data["taken_at"] - ranks[0]["ended_at"] == pytest.approx(1.0)  # type: ignore[operator]


def test_the_first_ending_is_the_crash_though_its_byes_peers_were_stamped_earlier() -> None:
    """tests/test_first_ending.py's skewed torchrun ending: rank 2 crashed at 10.00 (node-b),
    node-a's ranks 0 and 1 SIGTERMed at 10.20 but their clock 0.5 s behind (stamped 9.70), rank 3
    at 10.21. On the monitor's clock: 10.20, 10.20, 10.00, 10.21; the cause is rank 2's crash."""
    crash = [("j", 2, CRASH, 10.00, 10.05), ("j", 3, "SIGTERM", 10.21, 10.4),
             ("j", 0, "SIGTERM", 10.20, 10.4), ("j", 1, "SIGTERM", 10.20, 10.4)]
    data = to_json(_model(crash, behind={"node-a": 0.5}).tick(12.0))
    assert_valid_snapshot(data)
    ended = {r: row["ended_at"] for r, row in _ranks(data).items()}
    assert ended == {0: pytest.approx(10.20), 1: pytest.approx(10.20), 2: pytest.approx(10.00), 3: pytest.approx(10.21)}
    first = data["jobs"][0]["first_ending"]  # type: ignore[index]
    assert first == {"rank": 2, "host": "node-b", "pid": 102, "incarnation": 0, "status": "failed", "bye_reason": CRASH,
                     "ended_at": pytest.approx(10.00)}


def test_a_clean_end_has_no_first_ending() -> None:
    done = [("j", 0, "exit", 10.00, 10.1), ("j", 1, "exit", 10.05, 10.1)]
    data = to_json(_model(done).tick(12.0))
    assert_valid_snapshot(data)
    assert data["jobs"][0]["status"] == "done" and data["jobs"][0]["first_ending"] is None  # type: ignore[index]
    assert {r: row["ended_at"] for r, row in _ranks(data).items()} == {0: pytest.approx(10.00), 1: pytest.approx(10.05)}
