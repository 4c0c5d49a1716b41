"""A job's first ending is its cause: a node scancel'd reads ``stopped``, not its peers' errors.

A new user's trial: two nodes under torchrun (gloo), SIGTERM to one node's processes. Its ranks
said bye "SIGTERM", then the other node's ranks failed ("RuntimeError: ... Connection closed by
peer"); the job read ``failed`` and ``--until-done`` exited 4 naming the peer's gloo error as the
cause. Which ending came first is told by the send time each probe stamped on its bye (the wire's
``t``), not the receive time: direct ranks in one drain share one ``now``, and a SIGTERM bye queued
behind its rank's step frames is received after its peer's error. A crash first still reads
``failed`` (torchrun then stops its peers with SIGTERM), a crash on a tie. Every expectation here
is derived by hand from the byes' send times below.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from flowtop.export.serve import end_status
from flowtop.monitor.hints import HintEngine
from flowtop.monitor.hints.measures_time import _why
from flowtop.monitor.model import Model
from flowtop.monitor.rankview import job_context, node_group, sort_ranks
from flowtop.monitor.recording import Recorder, replay, replay_all
from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from test_hints_factories import _stalled, job, small_hang_rules
from test_hints_rules import find, settle

GLOO = "error: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
CRASH = "error: ValueError: bad batch"
#: Rank -> host: two nodes of two ranks.
HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}

#: (job, rank, bye reason, sent at: the probe's clock, received at: the monitor's), in the order
#: received. scancel of node-a: its byes sent at 10.00-10.01, its peers' errors 0.3 s later
#: (the process teardown that broke their collective), all received in one drain (10.5) with the
#: errors first: the tie of receive times the reverted attempt gave to the crash.
SCANCEL_ONE_DRAIN = [("j", 2, GLOO, 10.30, 10.5), ("j", 3, GLOO, 10.31, 10.5),
                     ("j", 0, "SIGTERM", 10.00, 10.5), ("j", 1, "SIGTERM", 10.01, 10.5)]
#: The same, node-a's byes queued behind its step frames: received after the errors.
SCANCEL_BYES_LATE = [("j", 2, GLOO, 10.30, 10.5), ("j", 3, GLOO, 10.31, 10.5),
                     ("j", 0, "SIGTERM", 10.00, 10.7), ("j", 1, "SIGTERM", 10.01, 10.7)]
#: torchrun's ending: rank 2 raised at 10.00, the agent SIGTERMed the others (sent 10.20), whose
#: byes were received first.
CRASH_FIRST = [("j", 0, "SIGTERM", 10.20, 10.4), ("j", 1, "SIGTERM", 10.20, 10.4),
               ("j", 3, "SIGTERM", 10.21, 10.4), ("j", 2, CRASH, 10.00, 10.5)]


def _frames(endings: list[tuple[str, int, str, float, float]],
            behind: dict[str, float] | None = None) -> list[tuple[float, bytes]]:
    """(received at, frame) of each rank named in ``endings``: a hello and 5 steps (sent at 1.0-1.5,
    received at once), then the byes as ``endings`` says; ``behind``: a host's clock that many
    seconds behind, every frame of its ranks stamped so (the byes' times in ``endings`` are true)."""
    late = behind or {}
    keys = {(j, r): RankKey(j, HOSTS[r], 100 + r, r, 0) for j, r, *_ in endings}
    world = {j: sum(1 for jj, _ in keys if jj == j) for j, _ in keys}
    out: list[tuple[float, bytes]] = []
    for (j, r), key in keys.items():
        out.append((1.0, wire.encode("hello", key, 1, 1.0 - late.get(key.host, 0.0), {"local_rank": r % 2, "world_size": world[j],
                                                           "device": "cpu (test)", "probe_version": "t"})))
    for step in range(1, 6):
        for key in keys.values():
            t = 1.0 + 0.1 * step
            out.append((t, wire.encode("step", key, 1 + step, t - late.get(key.host, 0.0), {"step": step, "wall_s": 0.1, "tokens": 8,
                                                                   "drops": 0})))
    for j, r, reason, sent, received in endings:
        out.append((received, wire.encode("bye", keys[(j, r)], 7, sent - late.get(keys[(j, r)].host, 0.0), {"reason": reason, "steps": 5, "drops": 0})))
    return out


def _model(endings: list[tuple[str, int, str, float, float]], behind: dict[str, float] | None = None) -> Model:
    model = make_model()
    for received, frame in _frames(endings, behind):
        model.ingest(wire.decode(frame), received)
    return model


def _snap(endings: list[tuple[str, int, str, float, float]]) -> MonitorSnapshot:
    return _model(endings).tick(12.0)


def _job(snap: MonitorSnapshot, name: str = "j") -> JobSnapshot:
    (found,) = [j for j in snap.jobs if j.job == name]
    return found


@pytest.mark.parametrize("endings", [SCANCEL_ONE_DRAIN, SCANCEL_BYES_LATE], ids=["one drain", "byes late"])
def test_a_scancelled_node_reads_stopped_and_its_peers_failures_follow_it(
        endings: list[tuple[str, int, str, float, float]], capsys: pytest.CaptureFixture[str]) -> None:
    snap = _snap(endings)
    job_ = _job(snap)
    assert {r.rank: r.status for r in job_.ranks} == {0: "stopped", 1: "stopped", 2: "failed", 3: "failed"}
    assert (job_.status, job_.status_text) == ("stopped", "stopped (SIGTERM)")
    assert end_status(snap) == 5
    assert capsys.readouterr().err == (
        "flowtop: --until-done: 2 rank(s) stopped by a signal (SIGTERM) before they finished, first rank 0 of j\n"
        f"flowtop: --until-done: 2 rank(s) of j failed after the signal, first rank 2: {GLOO}\n")
    # the rank table: the stopped node first, its peers after; the node rows say each node's own
    ctx = job_context(job_.ranks)
    assert [r.rank for r in sort_ranks(job_.ranks, ctx)] == [0, 1, 2, 3]
    nodes = {h: node_group(h, [r for r in job_.ranks if r.host == h], ctx).worst_status for h in ("node-a", "node-b")}
    assert nodes == {"node-a": "stopped", "node-b": "failed"}


@pytest.mark.parametrize("tie", [False, True])
def test_a_crash_first_reads_failed_and_the_stops_after_it_are_said_as_such(
        tie: bool, capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun's crash: failed, exit 4, the SIGTERMed peers said after it; sent at the same
    instant as the stops (``tie``), the crash still comes first."""
    endings = [(j, r, why, 10.20 if tie and why == CRASH else sent, got) for j, r, why, sent, got in CRASH_FIRST]
    snap = _snap(endings)
    job_ = _job(snap)
    assert job_.status == "failed"
    assert end_status(snap) == 4
    assert capsys.readouterr().err == (
        f"flowtop: --until-done: 1 rank(s) failed, first rank 2 of j: {CRASH}\n"
        "flowtop: --until-done: 3 rank(s) of j stopped by a signal (SIGTERM) after the failure, first rank 0\n")
    assert [r.rank for r in sort_ranks(job_.ranks, job_context(job_.ranks))] == [2, 0, 1, 3]


def _said(model: Model, now: float) -> list[str]:
    return [n.text for n in model.notices.take() if n.severity == "error"] + \
        [n.text for n in (model.tick(now), model.notices.take())[1] if n.severity == "error"]


@pytest.mark.parametrize("endings", [SCANCEL_ONE_DRAIN, SCANCEL_BYES_LATE], ids=["one drain", "byes late"])
def test_the_notice_of_a_scancel_names_the_stop_before_the_failure(
        endings: list[tuple[str, int, str, float, float]]) -> None:
    """The TUI's notice, said at the tick that finds every rank ended (else a second after the
    first failure came: model_notices.FAILURE_SETTLE_S), names the first failure by the send times
    (rank 2, 10.30) and the stop before it (rank 0, 10.00: 0.30 s); the base said "rank 2 of j
    failed" alone, as the first failure received, while the job read stopped. Said once."""
    model = _model(endings)
    assert _said(model, 11.0) == [f"rank 2 of j failed: {GLOO} (0.30 s after rank 0 was stopped by SIGTERM, which "
                                  "came first: the failure likely follows from it)"]
    assert _said(model, 20.0) == []


def test_the_notice_names_the_first_crash_by_send_time_not_arrival() -> None:
    """Rank 2 crashed at 10.00, its bye received at 10.6, after rank 3's broken collective (sent
    10.30, received 10.35): the notice names rank 2's error (the base: rank 3's, received first)."""
    model = _model([("j", 3, GLOO, 10.30, 10.35), ("j", 2, CRASH, 10.00, 10.6),
                    ("j", 0, "SIGTERM", 10.4, 10.6), ("j", 1, "SIGTERM", 10.4, 10.6)])
    assert _said(model, 11.35) == [f"rank 2 of j failed: {CRASH}"]


def test_every_rank_ended_says_it_at_that_tick_and_a_replay_or_a_stop_says_what_is_left(tmp_path: Path) -> None:
    """A headless --until-done stops at the tick that finds every rank ended (10.5 here, the last
    bye received there): the notice is said at it, not a second later (a reviewer's case: said
    nowhere). A replay ending under a second after a failure, with ranks still running, says it
    at its end (Model.flush_notices), as a collector's stop does."""
    model = _model(CRASH_FIRST)
    assert _said(model, 10.5) == [f"rank 2 of j failed: {CRASH}"]
    rec = Recorder(tmp_path / "crash.rec")
    for received, frame in _frames([("j", 2, CRASH, 10.00, 10.5), ("j", 3, "exit", 9.0, 9.0)])[:-1]:
        rec.write(received, frame)  # rank 3's bye left out: it runs on
    rec.close(now=10.8)
    replayed = make_model()
    replay(tmp_path / "crash.rec", replayed)
    assert [n.text for n in replayed.notices.take() if n.severity == "error"] == [f"rank 2 of j failed: {CRASH}"]


def test_a_relayed_failure_waits_from_when_it_came_not_when_its_relay_got_it() -> None:
    """Rank 3's failure (sent 10.31) got by its relay at 10.35, by the monitor after the tick of
    11.0 (a relay a second behind); node-a's SIGTERMs (sent 10.00) come at 11.9: the tick of 11.5
    must not say the failure alone (the base of this notice waited from the relay's 10.35)."""
    frames = _frames([("j", 3, GLOO, 10.31, 10.35), ("j", 0, "SIGTERM", 10.00, 11.9),
                      ("j", 1, "SIGTERM", 10.01, 11.9)])
    model = make_model()
    for received, frame in frames[:-3]:
        model.ingest(wire.decode(frame), received)
    model.tick(11.0)
    model.ingest(wire.decode(frames[-3][1]), frames[-3][0])  # the relay's time: 10.35
    assert _said(model, 11.5) == []
    for received, frame in frames[-2:]:
        model.ingest(wire.decode(frame), received)
    assert _said(model, 12.0) == [f"rank 3 of j failed: {GLOO} (0.31 s after rank 0 was stopped by SIGTERM, which "
                                  "came first: the failure likely follows from it)"]


def test_a_ctrl_c_before_the_failure_reads_interrupted() -> None:
    model = _model([("j", 2, GLOO, 10.30, 10.5), ("j", 0, "interrupted", 10.00, 10.5),
                    ("j", 1, "interrupted", 10.01, 10.5)])
    assert _said(model, 11.5) == [f"rank 2 of j failed: {GLOO} (0.30 s after rank 0 was interrupted (Ctrl-C), which "
                                  "came first: the failure likely follows from it)"]


def test_a_job_that_restarts_and_fails_again_is_said_again() -> None:
    """torchrun's elastic restart: incarnation 1 fails too, said (the base: once a job name, for good)."""
    model = _model(CRASH_FIRST)
    assert len(_said(model, 11.5)) == 1
    keys = {r: RankKey("j", HOSTS[r], 200 + r, r, 1) for r in range(4)}
    for r, k in keys.items():
        model.ingest(wire.decode(wire.encode("hello", k, 1, 20.0, {"local_rank": r % 2, "world_size": 4,
                                                                   "device": "cpu (test)", "probe_version": "t"})), 20.0)
    model.ingest(wire.decode(wire.encode("bye", keys[1], 2, 30.0, {"reason": CRASH, "steps": 5, "drops": 0})), 30.0)
    assert _said(model, 31.0) == [f"rank 1 of j failed: {CRASH}"]


def test_two_jobs_each_say_their_own_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """Job "a" scancel'd (its rank 1's error follows the stop), job "b" finished: 5, naming "a"
    alone (the base counted failures across jobs: 4). With "b" crashing first too: 4, each job's
    lines of its own ranks."""
    scancel = [("a", 0, "SIGTERM", 10.0, 10.5), ("a", 1, GLOO, 10.3, 10.5)]
    snap = _snap([*scancel, ("b", 2, "exit", 9.0, 9.1), ("b", 3, "exit", 9.0, 9.1)])
    assert (_job(snap, "a").status, _job(snap, "b").status) == ("stopped", "done")
    assert end_status(snap) == 5
    assert capsys.readouterr().err == (
        "flowtop: --until-done: 1 rank(s) stopped by a signal (SIGTERM) before they finished, first rank 0 of a\n"
        f"flowtop: --until-done: 1 rank(s) of a failed after the signal, first rank 1: {GLOO}\n")
    # "b": rank 3 crashed at 9.0 (the earliest ending of the snapshot), rank 2 stopped after it
    snap = _snap([*scancel, ("b", 2, "SIGTERM", 9.2, 9.3), ("b", 3, CRASH, 9.0, 9.3)])
    assert (_job(snap, "a").status, _job(snap, "b").status) == ("stopped", "failed")
    assert end_status(snap) == 4
    assert capsys.readouterr().err == (
        "flowtop: --until-done: 1 rank(s) stopped by a signal (SIGTERM) before they finished, first rank 0 of a\n"
        f"flowtop: --until-done: 1 rank(s) of a failed after the signal, first rank 1: {GLOO}\n"
        f"flowtop: --until-done: 1 rank(s) failed, first rank 3 of b: {CRASH}\n"
        "flowtop: --until-done: 1 rank(s) of b stopped by a signal (SIGTERM) after the failure, first rank 2\n")


def test_the_hang_hint_names_the_first_ending() -> None:
    """Ranks 0-1 hang in a collective. Rank 2 was stopped (bye sent at 100.0), rank 3's collective
    then broke (100.2): the hint names the signal and the failure after it (the base: "since rank 3
    failed"). Rank 3 crashed first (99.8): its exception is the why."""
    def ended(r: int, status: str, why: str, at: float) -> RankSnapshot:
        return dataclasses.replace(_stalled(r, 5.0, 0.0), status=status, bye_reason=why, ended_at=at)

    running = (_stalled(0, 5.0, 0.0), _stalled(1, 5.5, 0.0))
    snap = job(*running, ended(2, "stopped", "SIGTERM", 100.0), ended(3, "failed", GLOO, 100.2))
    hint = find(settle(HintEngine(small_hang_rules()), snap, 0.0), "hang_all")
    assert hint is not None and hint.evidence["stopped_ranks"] == [2] and hint.evidence["failed_ranks"] == [3]
    assert hint.summary == ("the 2 running ranks (of 4; the others ended) stopped at step 10: no step for 35 s since "
                            "a signal (SIGTERM) ended rank 2 (node1); rank 3 (node1) failed after it; they likely "
                            "wait for it in a collective")
    # two failures: the why is the first to end's, not the first in rank order
    snap = job(*running, ended(2, "failed", GLOO, 100.2), ended(3, "failed", CRASH, 99.8))
    hint = find(settle(HintEngine(small_hang_rules()), snap, 0.0), "hang_all")
    assert hint is not None and "since ranks 2-3 (node1) failed (ValueError: bad batch);" in hint.summary


def test_a_replay_decides_by_the_recorded_byes_send_times(tmp_path: Path) -> None:
    """The recording holds the frames, their send times with them: the byes received late replay
    as stopped, as live."""
    rec = Recorder(tmp_path / "scancel.rec")
    for received, frame in _frames(SCANCEL_BYES_LATE):
        rec.write(received, frame)
    rec.close(now=11.0)
    job_ = _job(replay_all(tmp_path / "scancel.rec", make_model()))
    assert (job_.status, job_.status_text) == ("stopped", "stopped (SIGTERM)")
    assert [r.rank for r in sort_ranks(job_.ranks, job_context(job_.ranks))] == [0, 1, 2, 3]


def test_a_nodes_clock_behind_does_not_make_its_stops_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    """torchrun's crash on node-b (sent 10.00), node-a's ranks SIGTERMed after it (10.20), node-a's
    clock 0.5 s behind (its byes stamped 9.70): each rank's stamps are put on the monitor's clock
    by its least transit (its hello: stamped 0.5, received 1.0: 0.5 s), so the crash is first (a
    reviewer's case: read stopped, exit 5, by the raw stamps)."""
    crash = [("j", 2, CRASH, 10.00, 10.05), ("j", 3, "SIGTERM", 10.21, 10.4),
             ("j", 0, "SIGTERM", 10.20, 10.4), ("j", 1, "SIGTERM", 10.20, 10.4)]
    snap = _model(crash, behind={"node-a": 0.5}).tick(12.0)
    assert _job(snap).status == "failed" and end_status(snap) == 4
    assert capsys.readouterr().err.startswith(f"flowtop: --until-done: 1 rank(s) failed, first rank 2 of j: {CRASH}\n")


def test_a_crash_early_in_a_run_whose_hello_came_late_is_still_first(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0's hello received 0.3 s late (a start's burst), its steps at once; it crashes (sent
    10.00), rank 1 is then stopped (10.10): the crash is first (the clock's lead is sampled on step
    frames too: taken from the hello alone, rank 0's bye read 10.30, after the stop; a reviewer's case)."""
    model = make_model()
    keys = [RankKey("j", "node-a", 100 + r, r, 0) for r in range(2)]
    hello = {"local_rank": 0, "world_size": 2, "device": "cpu (test)", "probe_version": "t"}
    for key in keys:
        model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0, hello)), 1.3 if key.rank == 0 else 1.0)
        model.ingest(wire.decode(wire.encode("step", key, 2, 1.1, {"step": 1, "wall_s": 0.1, "tokens": 8,
                                                                    "drops": 0})), 1.1)
    model.ingest(wire.decode(wire.encode("bye", keys[1], 3, 10.10, {"reason": "SIGTERM", "steps": 1, "drops": 0})), 10.2)
    model.ingest(wire.decode(wire.encode("bye", keys[0], 3, 10.00, {"reason": CRASH, "steps": 1, "drops": 0})), 10.5)
    snap = model.tick(11.0)
    assert _job(snap).status == "failed" and end_status(snap) == 4
    assert capsys.readouterr().err.startswith(f"flowtop: --until-done: 1 rank(s) failed, first rank 0 of j: {CRASH}\n")



@pytest.mark.parametrize("stamp", [0.0, 1.25], ids=["t=0", "before its own steps"])
def test_a_bye_stamped_before_its_own_frames_is_put_at_its_receive_time(stamp: float) -> None:
    """node-a scancel'd (byes sent 10.00-10.01), node-b's errors after (rank 3's sent 10.31), all
    received at 10.5; rank 2's probe stamped its bye ``stamp``: t=0, or 1.25, after its hello (1.0:
    the monitor first heard it then, its clock lead 0) but before its own steps (sent 1.1-1.5). Either
    stamp is no time it ended: its receive time (10.5), so the stop is first, the errors after it
    (by step, then rank: 2, 3). The base took ``stamp`` as the job's first ending: failed, the
    stops sorted after both errors (2, 3, 0, 1)."""
    endings = [("j", 2, GLOO, stamp, 10.5), ("j", 3, GLOO, 10.31, 10.5),
               ("j", 0, "SIGTERM", 10.00, 10.5), ("j", 1, "SIGTERM", 10.01, 10.5)]
    job_ = _job(_snap(endings))
    assert {r.rank: r.ended_at for r in job_.ranks} == {0: 10.00, 1: 10.01, 2: 10.5, 3: 10.31}
    assert job_.status == "stopped"
    assert [r.rank for r in sort_ranks(job_.ranks, job_context(job_.ranks))] == [0, 1, 2, 3]


def test_a_hello_sent_just_before_a_bye_with_a_later_stamp_leaves_the_bye_its_time() -> None:
    """The probe stamps a frame when it is queued, but a due hello when its sender's round sends it,
    first (probe.transport.sender): node-a's SIGTERM byes (sent 10.00-10.01) go out behind hellos
    stamped 10.05, all received at 10.7 after node-b's errors (10.30-10.31, received 10.5). The
    hello's stamp is no frame the bye came after: the byes keep their send times, the stop is first."""
    frames = _frames(SCANCEL_BYES_LATE)
    hellos = [(10.7, wire.encode("hello", RankKey("j", "node-a", 100 + r, r, 0), 6, 10.05,
                                 {"local_rank": r, "world_size": 4, "device": "cpu (test)", "probe_version": "t"}))
              for r in (0, 1)]
    byes_at = next(i for i, (got, _) in enumerate(frames) if got == 10.7)
    model = make_model()
    for received, frame in frames[:byes_at] + hellos + frames[byes_at:]:
        model.ingest(wire.decode(frame), received)
    job_ = _job(model.tick(12.0))
    assert {r.rank: r.ended_at for r in job_.ranks} == {0: 10.00, 1: 10.01, 2: 10.30, 3: 10.31}
    assert job_.status == "stopped"


def test_telemetry_sent_just_before_a_crash_bye_leaves_the_bye_its_time() -> None:
    """torchrun's crash (rank 2 at 10.00, the SIGTERMs at 10.20, CRASH_FIRST): rank 2's sender
    stamped a telemetry sample at 10.01, when its sampling ended, and sent it ahead of the bye the
    training thread had queued at 10.00 (probe.transport.sender: local frames join the pending list
    first). The telemetry is no frame the bye came after: the crash keeps 10.00, failed, exit 4 (a
    reviewer's case: read stopped, exit 5, the crash put at its receive time)."""
    frames = _frames(CRASH_FIRST)
    tel = (10.5, wire.encode("telemetry", RankKey("j", "node-b", 102, 2, 0), 6, 10.01, {"gpu": {}, "proc": {},
                                                                                   "reasons": {}}))
    model = make_model()
    for received, frame in frames[:-1] + [tel] + frames[-1:]:
        model.ingest(wire.decode(frame), received)
    snap = model.tick(12.0)
    assert {r.rank: r.ended_at for r in _job(snap).ranks}[2] == pytest.approx(10.00)
    assert _job(snap).status == "failed"


def test_a_crash_bye_queued_before_its_probe_connected_keeps_its_time() -> None:
    """A rank that crashed at start-up (bye stamped 10.00) while its monitor was still connecting:
    its probe stamped the hello at 10.08, as it connected, and sent it first (received 10.081, the
    bye at 10.082): the monitor first heard it after the bye's stamp, by less than a probe holds a
    frame (rankstate.BYE_HELD_S): the crash keeps 10.00 (a reviewer's case: 10.082)."""
    key = RankKey("j", "node-a", 100, 0, 0)
    model = make_model()
    model.ingest(wire.decode(wire.encode("hello", key, 1, 10.08, {"local_rank": 0, "world_size": 1,
                                                                  "device": "cpu (test)", "probe_version": "t"})), 10.081)
    model.ingest(wire.decode(wire.encode("bye", key, 2, 10.00, {"reason": CRASH, "steps": 0, "drops": 0})), 10.082)
    (rank,) = _job(model.tick(11.0)).ranks
    assert rank.ended_at == pytest.approx(10.001)


def _killed_then_stopped(peers_why: str, byes_at: float = 2.0, why_of: dict[int, str] | None = None) -> MonitorSnapshot:
    """torchrun's ending of a rank killed outright (SIGKILL: the OOM killer): ranks 0-3 step to
    step 5 (received 1.1-1.5, sent at once); rank 2 then says nothing more (no bye: a killed
    process cannot), and 0.5 s later the others end (byes sent 2.00-2.01, received 2.05), each with
    ``peers_why`` (torchrun's SIGTERM, or a gloo peer's error). 40 s later: rank 2 has been silent
    38.5 s (> the 30 s floor: 10 × its 0.1 s step is less)."""
    model = make_model()
    keys = {r: RankKey("j", HOSTS[r], 100 + r, r, 0) for r in range(4)}
    hello = {"world_size": 4, "device": "cpu (test)", "probe_version": "t"}
    for r, key in keys.items():
        model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0, dict(hello, local_rank=r % 2))), 1.0)
    for step in range(1, 6):
        for key in keys.values():
            t = 1.0 + 0.1 * step
            model.ingest(wire.decode(wire.encode("step", key, 1 + step, t, {"step": step, "wall_s": 0.1, "tokens": 8,
                                                                          "drops": 0})), t)
    for r in (0, 1, 3):
        why = (why_of or {}).get(r, peers_why)
        model.ingest(wire.decode(wire.encode("bye", keys[r], 7, byes_at + r / 300,
                                             {"reason": why, "steps": 5, "drops": 0})), byes_at + 0.05)
    model.tick(20.0)
    return model.tick(41.5)


@pytest.mark.parametrize("peers_why, after", [
    ("SIGTERM", "a signal (SIGTERM) ended ranks 0-1,3 (node-a, node-b)"),
    (GLOO, "ranks 0-1,3 (node-a, node-b) failed (RuntimeError: Connection closed by peer)"),  # no source location
], ids=["torchrun's SIGTERM", "gloo errors"])
def test_a_rank_silent_before_the_others_ended_is_named_as_the_cause(peers_why: str, after: str) -> None:
    """A trial: SIGKILL of rank 2 of 4 under torchrun (gloo). The hang hint read "the 1 running rank
    (of 4; the others ended) stopped at step 44: no step for 42 s since a signal (SIGTERM) ended
    ranks 0-1,3 (vm); they likely wait for it in a collective": the SIGTERM torchrun sent because
    rank 2 died named as the cause, and the dead rank as one waiting in a collective. Rank 2 fell
    silent (its last frame received at 1.5) before the first bye was sent (2.00): it is the cause."""
    snap = _killed_then_stopped(peers_why)
    job_ = _job(snap)
    assert {r.rank: r.status for r in job_.ranks}[2] == "stale"
    (hint,) = [h for h in job_.hints if h.id == "hang_all"]
    assert hint.evidence["silent_ranks"] == [2] and hint.evidence["first_cause"] == "silent"
    assert hint.summary_at(snap.taken_at) == (
        "the 1 running rank (of 4; the others ended) stopped at step 5: no step for 40 s; nothing heard from "
        f"rank 2 (node-b) for 40 s, since before {after}: it likely died without a word (SIGKILL, the OOM "
        "killer, a segfault, its host or network down)")


def test_a_rank_last_heard_a_frame_before_the_others_byes_is_not_the_cause() -> None:
    """Rank 2 last heard at 1.5, the others' byes sent 0.05 s after (under a frame's usual gap:
    its 0.1 s step): it ended with them, its bye lost; the signal is the cause (a reviewer's case:
    any silence before the first bye, however short, named the silent rank)."""
    job_ = _job(_killed_then_stopped("SIGTERM", byes_at=1.55))
    (hint,) = [h for h in job_.hints if h.id == "hang_all"]
    assert hint.evidence["first_cause"] == "stopped" and "since a signal (SIGTERM) ended ranks 0-1,3" in hint.summary_at(41.5)


def test_a_paced_rank_last_heard_a_frame_before_the_others_byes_is_not_the_cause() -> None:
    """Paced: each rank's steps leave 5 to a frame every 0.5 s (steps of 0.1 s). Rank 2's last
    frame came at 1.5, its frame of 2.0 and its bye lost; the others' frames came at 1.5 and 2.0
    and their SIGTERM byes were sent at 2.05. Rank 2 was silent 0.55 s before the first bye, about
    the 0.5 s its ranks' frames are apart: it ended with them, not before (a reviewer's case: the
    margin was a step, 0.1 s)."""
    model = make_model()
    keys = {r: RankKey("j", HOSTS[r], 100 + r, r, 0) for r in range(4)}
    hello = {"world_size": 4, "device": "cpu (test)", "probe_version": "t"}
    for r, key in keys.items():
        model.ingest(wire.decode(wire.encode("hello", key, 1, 1.0, dict(hello, local_rank=r % 2))), 1.0)
    for frame, at in enumerate((1.5, 2.0)):
        for r, key in keys.items():
            if r == 2 and at == 2.0:
                continue
            recs = [{"step": 5 * frame + i, "wall_s": 0.1, "tokens": 8} for i in range(1, 6)]
            model.ingest(wire.decode(wire.encode_steps(key, 2 + frame, at, recs, 0)), at)
    for r in (0, 1, 3):
        model.ingest(wire.decode(wire.encode("bye", keys[r], 9, 2.05, {"reason": "SIGTERM", "steps": 10,
                                                                     "drops": 0})), 2.06)
    model.tick(20.0)
    job_ = _job(model.tick(41.5))
    (hint,) = [h for h in job_.hints if h.id == "hang_all"]
    assert hint.evidence["first_cause"] == "stopped"


@pytest.mark.parametrize("peers_why, cause", [(GLOO, "silent"), (CRASH, "failed")], ids=["lost peer", "own crash"])
def test_a_rank_killed_whose_peers_failed_at_once_of_the_lost_connection_is_the_cause(peers_why: str,
                                                                                       cause: str) -> None:
    """A trial: SIGKILL of rank 2 of 4 under gloo; its peers' collectives failed within
    milliseconds ("Connection reset by peer"), 0.05 s after its last frame, inside any margin: the
    hint named them as the cause. Every failure a lost connection: the rank silent since before
    them is (first_cause "silent"); an exception of its own (ValueError) still is the failure's."""
    job_ = _job(_killed_then_stopped(peers_why, byes_at=1.55))
    (hint,) = [h for h in job_.hints if h.id == "hang_all"]
    assert hint.evidence["first_cause"] == cause



def test_one_ranks_own_connection_error_is_no_lost_peer() -> None:
    """Rank 0 failed of its own S3 read's "Connection reset by peer" 0.05 s after rank 2's last
    frame, ranks 1 and 3 were then stopped: one rank's I/O error is no collective's lost peer,
    the margin holds, the failure is the cause (a reviewer's case: rank 2 named as killed). A
    hint's quote keeps brackets that are no source location ("index [0:16]")."""
    s3 = "error: ConnectionError: ('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))"
    job_ = _job(_killed_then_stopped("SIGTERM", byes_at=1.55, why_of={0: s3}))
    (hint,) = [h for h in job_.hints if h.id == "hang_all"]
    assert hint.evidence["first_cause"] == "failed"
    assert _why("error: IndexError: index [0:16] out of range") == "IndexError: index [0:16] out of range"
    assert _why("error: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                "peer") == "RuntimeError: Connection closed by peer"
