"""Hints end to end: real trainings under `flowtop run`, the real collector, model and engine.

Each training runs until the hint under test has been seen and checked, then is stopped, so the
tests take as long as the evidence needs (the rules' windows: 10 steps for input wait, 20 for the
straggler, the hang floor) and no longer. Numbers in the hints are checked against the same
snapshot's history, recomputed here independently.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from flowtop.tools.demo.launch import free_port_pair, training_command
from flowtop.monitor.snapshot import Hint, JobSnapshot, MonitorSnapshot
from flowtop.monitor.snapshot_json import to_json
from monitor_thread import MonitorThread
from snapshot_schema import assert_valid_snapshot

INPUT_SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class SlowTokens(Dataset):
        # Every sample costs 10 ms to "load": 40 ms per batch of 4, in the training process.
        def __len__(self):
            return 4 * int(sys.argv[1])
        def __getitem__(self, i):
            time.sleep(0.01)
            return torch.randint(0, 512, (64,))

    torch.set_num_threads(1)
    # About as much compute as loading (~40 ms a step on one core): a share well inside 0..100 %.
    model = torch.nn.Sequential(torch.nn.Embedding(512, 256), torch.nn.Linear(256, 8192))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for idx in DataLoader(SlowTokens(), batch_size=4, num_workers=0):
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    """
)


@contextlib.contextmanager
def flowtop_run(addr: str, *cmd: str) -> Iterator[subprocess.Popen[bytes]]:
    """`flowtop run -- CMD` in the background; on exit resume and stop it and everything it started."""
    proc = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--", *cmd],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        family = [proc.pid]
        with contextlib.suppress(psutil.Error):
            family += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        for p in _procs(family):  # a stopped process would hold SIGTERM until continued
            with contextlib.suppress(psutil.Error):
                p.resume()
        proc.terminate()  # forwarded to the command (torchrun passes it on to its workers)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        _, alive = psutil.wait_procs([p for p in _procs(family) if p.is_running()], timeout=5)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _procs(pids: list[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


def the_job(snap: MonitorSnapshot) -> JobSnapshot | None:
    return snap.jobs[0] if len(snap.jobs) == 1 else None


def hints_of(snap: MonitorSnapshot, rule: str) -> list[Hint]:
    job = the_job(snap)
    return [h for h in job.hints if h.id == rule] if job else []


@pytest.mark.slow
def test_slow_dataloader_triggers_input_wait(monitor: MonitorThread, tmp_path: Path) -> None:
    script = tmp_path / "slow_loader.py"
    script.write_text(INPUT_SCRIPT)
    with flowtop_run(monitor.listen, sys.executable, str(script), "2000") as proc:
        snap = monitor.wait_for(lambda s: bool(hints_of(s, "input_wait")) or proc.poll() is not None, 60)
    (hint,) = hints_of(snap, "input_wait")
    (r,) = the_job(snap).ranks
    assert hint.target == "rank 0" and r.status == "live"
    # The hint's share is Σ input wait ÷ Σ step time over the last 10 steps of this very snapshot.
    waits, steps = r.history.input_wait_s[-10:], r.history.step_time_s[-10:]
    pct = 100.0 * sum(waits) / sum(steps)
    assert hint.evidence["input_wait_pct"] == pytest.approx(pct)
    assert hint.evidence["window_steps"] == 10
    assert hint.summary == f"rank 0 waits for input {pct:.0f} % of each step"
    # Four samples of 10 ms each are loaded between two steps: at least 40 ms of wait per step.
    assert 0.040 <= hint.evidence["input_wait_s_per_step"] < 0.100
    # The rank's own figure (median per-step share over its recent steps) tells the same story.
    assert r.input_wait_frac is not None and abs(100.0 * r.input_wait_frac - pct) < 10.0
    assert hint.severity == ("critical" if pct > 25.0 else "warning")
    assert hint.impact == pytest.approx(pct / 100.0)
    assert_valid_snapshot(to_json(snap))


@pytest.mark.slow
def test_finished_run_keeps_its_input_wait_hint_in_the_final_json(tmp_path: Path) -> None:
    """`flowtop snapshot --until-done --json` over a 16-step run that waits on its DataLoader: the
    final snapshot, taken after the rank said bye, still holds the hint, marked ended."""
    script = tmp_path / "slow_loader.py"
    script.write_text(INPUT_SCRIPT)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"
    monitor = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", addr, "--until-done",
                                "--timeout", "150", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # the monitor binds before the probe's first frames (they are not kept long)
        run = subprocess.run([sys.executable, "-m", "flowtop.cli", "run", "--connect", addr, "--",
                              sys.executable, str(script), "16"], capture_output=True, text=True, timeout=150)
        assert run.returncode == 0, run.stderr[-3000:]
        out, err = monitor.communicate(timeout=60)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(5)
    assert monitor.returncode == 0, err
    data = json.loads(out)
    assert_valid_snapshot(data)
    (job,) = data["jobs"]
    (r,) = job["ranks"]
    assert job["status"] == "done" and r["status"] == "done" and r["step"] == 16
    (hint,) = [h for h in job["hints"] if h["id"] == "input_wait"]
    assert hint["ended"] is True and hint["target"] == "rank 0"
    # It held over the steps the monitor saw it hold: from the start of its 10-step window to the
    # last step (the bye's last look sees every step), with the share it had then.
    assert hint["last_step"] == 16
    assert 1 <= hint["first_step"] <= hint["last_step"] - 9
    assert hint["evidence"]["input_wait_pct"] > 5.0 and hint["evidence"]["window_steps"] >= 10
    assert hint["summary"] == f"rank 0 waits for input {hint['evidence']['input_wait_pct']:.0f} % of each step"


def _lead_lag(job: JobSnapshot, slow: int, window: int = 20) -> tuple[float, float]:
    """Median over the last ``window`` steps both ranks reported a lead for: the slow rank's lead
    minus the other's; and the slow rank's median step time over those steps."""
    by_rank = {r.rank: r.history for r in job.ranks}
    leads = {k: {s: x for s, x in zip(h.steps, h.lead_s) if x > 0} for k, h in by_rank.items()}
    common = sorted(set(leads[0]) & set(leads[1]))[-window:]
    lag = statistics.median(leads[slow][s] - leads[1 - slow][s] for s in common)
    times = dict(zip(by_rank[slow].steps, by_rank[slow].step_time_s))
    return lag, statistics.median(times[s] for s in common)


@pytest.mark.slow
def test_ddp_straggler_is_found_by_lead_time(monitor: MonitorThread) -> None:
    """Rank 1 sleeps 50 ms after each optimizer step. The gradient all-reduce makes rank 0 wait,
    so both ranks' step times are equal; rank 1's forward still ends ~50 ms after rank 0's."""
    cmd = training_command(2, 3000, ["--sleep-rank=1", "--sleep-s=0.05", "--batch=4", "--seq=64"])
    seen: list[Hint] = []

    def straggler_seen(s: MonitorSnapshot) -> bool:
        seen.extend(hints_of(s, "straggler"))
        return bool(hints_of(s, "straggler"))

    with flowtop_run(monitor.listen, *cmd):
        snap = monitor.wait_for(straggler_seen, 90)
    job = the_job(snap)
    found = hints_of(snap, "straggler")
    assert len(found) == 1, [(h.target, h.evidence) for h in found]
    (hint,) = found
    assert {h.target for h in seen} == {"rank 1"}  # never rank 0
    assert hint.evidence["basis"] == "lead"
    # Lockstep: the step times the other two measures compare are within a few % of each other.
    assert abs(hint.evidence["step_time_s"] / hint.evidence["others_step_time_s"] - 1.0) < 0.1
    lag, step = _lead_lag(job, slow=1)
    assert hint.evidence["lead_lag_s"] == pytest.approx(lag)
    assert hint.evidence["lag_pct_of_step"] == pytest.approx(100.0 * lag / step)
    assert hint.evidence["slower_pct"] == pytest.approx(100.0 * lag / step)
    assert 0.040 < lag < 0.080  # the 50 ms sleep, give or take the forward's jitter
    assert hint.evidence["lead_s"] - hint.evidence["others_lead_s"] == pytest.approx(lag, abs=0.01)
    assert hint.summary == (
        f"rank 1 finishes its forward {1000 * lag:.0f} ms after the others each step "
        f"({100 * lag / step:.0f} % of the step); they wait for it in the gradient all-reduce"
    )
    assert hint.severity == ("critical" if 100 * lag / step > 50 else "warning")


def _stat_state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.slow
def test_stopped_rank_triggers_hang_then_clears(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowtop.monitor.hints import engine

    # A cleared hint stays shown HOLD_S (10 s) after its measure fell back (tests/test_ticks.py and
    # tests/test_hints_engine.py pin that): here only that it clears counts, 2 s of hold is enough.
    monkeypatch.setattr(engine, "HOLD_S", 2.0)
    monitor = MonitorThread(hint_overrides={"hang": {"floor_s": 2.0}})
    pid = None
    try:
        with flowtop_run(monitor.listen, *training_command(2, 100_000, ["--batch=2", "--seq=32"])) as proc:
            snap = monitor.wait_for(lambda s: (j := the_job(s)) is not None and len(j.ranks) == 2
                                    and min(r.step for r in j.ranks) >= 15, 60)
            job = the_job(snap)
            assert job is not None and min(r.step for r in job.ranks) >= 15
            pid = next(r.pid for r in job.ranks if r.rank == 1)
            # The snapshot's pid is the torchrun worker: one of our own descendants.
            assert pid in {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            psutil.Process(pid).suspend()  # SIGSTOP
            snap = monitor.wait_for(lambda s: bool(hints_of(s, "hang_all")), 30)
            (hint,) = hints_of(snap, "hang_all")
            assert _stat_state(pid) == "T" and proc.poll() is None  # stopped, not dead
            assert hint.severity == "critical" and hint.target == ""
            ev = hint.evidence_at(snap.taken_at)
            assert ev["limit_s"] == 2.0  # the overridden floor (10 × the step time is far less)
            assert ev["stalled_s"] > 2.0 and ev["ranks_n"] == 2
            stopped_at = {r.rank: r.step for r in the_job(snap).ranks}
            assert ev["last_step"] == max(stopped_at.values())
            assert not hints_of(snap, "hang_rank")  # one job hint instead of one per rank
            # Rank 0 is blocked in the all-reduce but keeps sending heartbeats; rank 1 goes silent.
            snap = monitor.wait_for(lambda s: any(h.evidence.get("silent_ranks") == [1]
                                                  for h in hints_of(s, "hang_all")), 30)
            (hint,) = hints_of(snap, "hang_all")
            assert hint.evidence["silent_ranks"] == [1]
            host = next(r.host for r in the_job(snap).ranks if r.rank == 1)
            assert f"nothing heard from rank 1 ({host}) for" in hint.summary_at(snap.taken_at)
            status = {r.rank: r.status for r in the_job(snap).ranks}
            # Rank 0 still sends heartbeats: "live", then "stalled" once it has made no step for
            # max(5 median steps, 5 s) — about when rank 1's silence makes it "stale".
            assert status[0] in ("live", "stalled") and status[1] == "stale"
            assert {r.rank: r.step for r in the_job(snap).ranks} == stopped_at
            psutil.Process(pid).resume()  # SIGCONT: training goes on and the hint clears
            snap = monitor.wait_for(lambda s: not hints_of(s, "hang_all")
                                    and min(r.step for r in the_job(s).ranks) > max(stopped_at.values()), 30)
            assert not hints_of(snap, "hang_all")
            assert min(r.step for r in the_job(snap).ranks) > max(stopped_at.values())
    finally:
        monitor.close()
    assert pid is not None and _gone(pid)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie whose parent left counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
