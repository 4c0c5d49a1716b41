"""A job whose ranks a signal ended reads "stopped (SIGTERM)", not "done".

A new user's trial: ranks ended by SIGTERM (scancel, a preemption, a timeout's kill, `flowtop run`
forwarding SIGTERM) said bye "SIGTERM", and the monitor's job status read "done" in the TUI, the
JSON and Prometheus, like a training loop that finished (only the text report's rank line said
"done (SIGTERM)"). A rank a signal ended is now ``stopped``, its job too once every rank ended and
the first to end was stopped, not crashed (tests/test_first_ending.py), everywhere, and ``--until-done`` exits 5 for it (4 stays a failure, 0 a clean end).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flowtop.export.exporter import ExportPolicy, snapshot_families
from flowtop.export.serve import end_status
from flowtop.export.textreport import render
from flowtop.monitor.snapshot import MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.wire import RankKey
from snapshot_schema import assert_valid_snapshot

#: Trains for ever (a real model, real steps) once started; "ready" after 10 steps.
TRAIN = textwrap.dedent(
    """
    import torch
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    step = 0
    while True:
        m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        step += 1
        if step == 10:
            print("ready", flush=True)
    """
)


def _job(byes: dict[int, str]) -> MonitorSnapshot:
    """A 3-rank job of real wire frames (hello, 5 steps), each rank then saying its bye."""
    model = make_model()
    keys = {r: RankKey("j", "node-a", 100 + r, r, 0) for r in byes}
    seq = dict.fromkeys(keys.values(), 0)

    def send(key: RankKey, kind: str, fields: dict[str, object], now: float) -> None:
        seq[key] += 1
        model.ingest(wire.decode(wire.encode(kind, key, seq[key], now, fields)), now)

    for r, key in keys.items():
        send(key, "hello", {"local_rank": r, "world_size": len(keys), "device": "cpu (test)", "probe_version": "t"}, 1.0)
    for step in range(1, 6):
        for key in keys.values():
            send(key, "step", {"step": step, "wall_s": 0.1, "tokens": 8, "drops": 0}, 1.0 + 0.1 * step)
    for r, reason in byes.items():
        send(keys[r], "bye", {"reason": reason, "steps": 5, "drops": 0}, 2.0 + 0.1 * r)
    return model.tick(2.5)


def _prom(snap: MonitorSnapshot, name: str) -> dict[str, float]:
    """State -> value of the stateset ``name`` (one job, or one rank's labels: rank 0)."""
    out: dict[str, float] = {}
    for fam in snapshot_families(snap, ExportPolicy()):
        for s in fam.samples:
            if s.name == name and s.labels.get("rank", "0") == "0":
                out[s.labels[name]] = s.value
    return out


def test_a_job_a_signal_ended_reads_stopped_everywhere(capsys: pytest.CaptureFixture[str]) -> None:
    snap = _job({0: "SIGTERM", 1: "SIGTERM", 2: "exit"})  # rank 2 had finished before the kill
    job = snap.jobs[0]
    assert {r.rank: r.status for r in job.ranks} == {0: "stopped", 1: "stopped", 2: "done"}
    assert (job.status, job.stopped_by, job.status_text) == ("stopped", ("SIGTERM",), "stopped (SIGTERM)")
    # JSON: the schema admits it, and says the signal
    data = to_json(snap)
    assert_valid_snapshot(data)
    assert (data["jobs"][0]["status"], data["jobs"][0]["stopped_by"]) == ("stopped", ["SIGTERM"])
    assert {r["rank"]: r["status"] for r in data["jobs"][0]["ranks"]} == {0: "stopped", 1: "stopped", 2: "done"}
    # the text report: the job's line and the rank's cell
    lines = render(snap).splitlines()
    assert lines[0].endswith("  stopped (SIGTERM)"), lines[0]
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ("0", "1", "2")}
    assert rows["0"].endswith("stopped (SIGTERM)") and rows["2"].endswith("done")
    # Prometheus: the stateset's "stopped" is 1, "done" 0
    job_state = _prom(snap, "flowtop_job_status")
    assert job_state["stopped"] == 1 and job_state["done"] == 0 and sum(job_state.values()) == 1
    rank_state = _prom(snap, "flowtop_rank_status")
    assert rank_state["stopped"] == 1 and rank_state["done"] == 0
    # --until-done: 5, said on stderr with the signal and the first rank it ended
    assert end_status(snap) == 5
    assert capsys.readouterr().err == ("flowtop: --until-done: 2 rank(s) stopped by a signal (SIGTERM) before they "
                                       "finished, first rank 0 of j\n")


def test_the_tui_job_header_and_rank_table_say_stopped() -> None:
    from flowtop.tui.widgets.job_header import JobHeader

    snap = _job({0: "SIGTERM", 1: "SIGTERM", 2: "SIGTERM"})
    header = JobHeader.render_text(snap, snap.jobs[0], 0, 1).plain
    assert "step 5  stopped (SIGTERM)  rx " in header, header


@pytest.mark.parametrize(("byes", "status", "rc"), [
    ({0: "exit", 1: "exit", 2: "exit"}, "done", 0),  # the training loop finished: done, as before
    # byes sent in rank order, 0.1 s apart: the first ending decides (snapshot.first_ending)
    ({0: "error: RuntimeError: bad batch", 1: "SIGTERM", 2: "SIGTERM"}, "failed", 4),  # torchrun stops the peers
    ({0: "SIGTERM", 1: "error: RuntimeError: gloo peer gone", 2: "SIGTERM"}, "stopped", 5),  # scancel: peers fail
    ({0: "interrupted", 1: "exit", 2: "exit"}, "stopped", 5),  # Ctrl-C (SIGINT) is a signal's stop too
])
def test_the_job_status_and_exit_code_of_each_ending(byes: dict[int, str], status: str, rc: int) -> None:
    snap = _job(byes)
    assert snap.jobs[0].status == status
    assert _prom(snap, "flowtop_job_status")[status] == 1
    assert end_status(snap) == rc


def test_a_stopped_rank_is_filtered_binned_and_sorted_as_stopped() -> None:
    from flowtop.monitor.rankfilter import parse_filter
    from flowtop.monitor.rankstats import STATUS_BINS, LEGEND
    from flowtop.tui.widgets.rank_map import LEGEND_WIDTH, PALETTE, legend_lines

    snap = _job({0: "exit", 1: "SIGTERM", 2: "exit"})
    job = snap.jobs[0]
    matches = parse_filter("stopped").matcher(job)
    assert [r.rank for r in job.ranks if matches(r)] == [1]
    assert len(PALETTE["status"]) == len(LEGEND["status"]) == len(STATUS_BINS) == 8
    # a status map cell with a stopped and a failed rank shows the crash; with a stale one, the stop
    assert STATUS_BINS["stale"] < STATUS_BINS["stopped"] < STATUS_BINS["failed"]
    # at 80x24 the map's legend has 3 lines under its title: the worst five statuses stay on them
    shown = ["".join(text for text, _ in line) for line in legend_lines("status", 8, LEGEND_WIDTH - 1)[1:4]]
    assert shown == ["■failed ■stop", "■stale ■hung", "■unseen ■confl"]


@pytest.mark.slow
def test_until_done_exits_5_when_a_real_rank_is_sigtermed(tmp_path: Path) -> None:
    """A real training process (the probe attached as `flowtop run` attaches it) SIGTERMed
    mid-run, as scancel does: `flowtop snapshot --until-done --json` exits 5, its JSON says
    "stopped" and the signal, stderr names the rank; the process died of the signal as without
    the probe. It read "done" and exited 0."""
    from conftest import finished, probed_env
    from flowtop.tools.demo.launch import free_port_pair

    script = tmp_path / "t.py"
    script.write_text(TRAIN)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    watcher = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", listen, "--until-done",
                                "--timeout", "90", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    train = subprocess.Popen([sys.executable, str(script)], env=probed_env(listen, FLOWTOP_JOB="term"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert train.stdout is not None and train.stdout.readline() == "ready\n"
        train.send_signal(signal.SIGTERM)
        _, terr = finished(train, 30)
        assert train.returncode == -signal.SIGTERM, terr
        out, err = finished(watcher, 60)
    finally:
        for proc in (train, watcher):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert watcher.returncode == 5, err
    assert "--until-done: 1 rank(s) stopped by a signal (SIGTERM) before they finished, first rank 0 of term" in err
    job = json.loads(out)["jobs"][0]
    assert (job["status"], job["stopped_by"]) == ("stopped", ["SIGTERM"])
    (rank,) = job["ranks"]
    assert (rank["status"], rank["bye_reason"]) == ("stopped", "SIGTERM") and rank["step"] >= 10
