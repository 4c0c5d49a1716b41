"""A rank whose process ends of an exception nobody caught reads "failed", not "done".

A new user's trial: a rank that raised at step 20 (exit status 1), and two ranks whose gloo
collective failed when the other node's were killed, all read "done" with bye reason "exit",
exactly like a clean finish. The probe's bye now says why the process ended (Python keeps an
uncaught exception for atexit), and the monitor shows such a rank and its job as "failed".
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flowtop.monitor.rankfilter import parse_filter
from flowtop.monitor.rankview import job_context, node_group, worst_first
from flowtop.monitor.snapshot import ENDED
from synthetic.cluster import cluster_rank

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for step in range(5):
        m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
        if step == 2 and sys.argv[1] == "raise":
            raise RuntimeError("boom\\nat step 3")
    if sys.argv[1] == "thread":  # an exception in another thread does not end the process
        import threading
        t = threading.Thread(target=lambda: 1 / 0)
        t.start(); t.join()
    if sys.argv[1] == "status":
        sys.exit(3)
    """
)

#: A rank that catches its own failure and exits with a status, as torch.multiprocessing.spawn's
#: worker wrapper, Hydra's main and many scripts do: nothing is left in sys.last_value.
HANDLED = textwrap.dedent(
    """
    import sys, traceback
    import torch

    def train(rank):
        m = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(5):
            m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
            if step == 2:
                raise ValueError("bad batch")

    if __name__ == "__main__":
        if sys.argv[1] == "spawn":
            import torch.multiprocessing as mp
            mp.spawn(train, nprocs=1)
        try:
            train(0)
        except Exception:
            traceback.print_exc()
            sys.exit(1)
    """
)


@pytest.mark.slow
def test_a_crashed_rank_and_its_job_read_failed(tmp_path: Path) -> None:
    from monitor_thread import MonitorThread

    from conftest import probed_env

    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    mon = MonitorThread()
    try:
        # the four runs side by side (each imports torch: ~28 s one after another under CI's load)
        procs = {how: subprocess.Popen([sys.executable, str(script), how], env=probed_env(mon.listen, FLOWTOP_JOB=how),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for how in ("raise", "clean", "thread", "status")}
        ran = {}
        for how, proc in procs.items():
            out, err = proc.communicate(timeout=90)
            ran[how] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        assert ran["raise"].returncode == 1 and "RuntimeError: boom" in ran["raise"].stderr
        assert ran["clean"].returncode == 0 and ran["thread"].returncode == 0, ran["thread"].stderr
        assert ran["status"].returncode == 3
        snap = mon.wait_for(lambda s: len(s.jobs) == 4 and all(j.status in ENDED for j in s.jobs), 30)
        jobs = {j.job: j for j in snap.jobs}
        (crashed,) = jobs["raise"].ranks
        assert crashed.status == "failed" and jobs["raise"].status == "failed"
        assert crashed.bye_reason == "error: RuntimeError: boom at step 3"  # one line
        assert crashed.step == 3
        for how in ("clean", "thread"):
            (r,) = jobs[how].ranks
            assert (r.status, r.bye_reason, jobs[how].status) == ("done", "exit", "done")
        (r,) = jobs["status"].ranks
        assert (r.status, r.bye_reason) == ("failed", "error: exit status 3")
    finally:
        mon.close()


@pytest.mark.slow
def test_a_rank_that_handles_its_crash_and_exits_non_zero_reads_failed(tmp_path: Path) -> None:
    """torch.multiprocessing.spawn's worker catches the rank's exception and calls sys.exit(1),
    as a script's own ``except: print; sys.exit(1)`` does: it read "done" / "exit" (a reviewer's
    repro with mp.spawn, a supported launcher)."""
    from monitor_thread import MonitorThread

    from conftest import finished, probed_env

    script = tmp_path / "h.py"
    script.write_text(HANDLED)
    mon = MonitorThread()
    try:
        # the two runs side by side (each imports torch; spawn's rank a second time)
        procs = {how: subprocess.Popen([sys.executable, str(script), how], env=probed_env(mon.listen, FLOWTOP_JOB=how),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for how in ("handled", "spawn")}
        for proc in procs.values():
            _, err = finished(proc, 120)
            assert proc.returncode == 1 and "ValueError: bad batch" in err, err
        snap = mon.wait_for(lambda s: len(s.jobs) == 2 and all(j.status in ENDED for j in s.jobs), 30)
        for job in snap.jobs:
            (r,) = job.ranks
            assert (r.status, r.bye_reason, job.status) == ("failed", "error: ValueError: bad batch", "failed"), job.job
            assert r.step == 3
    finally:
        mon.close()


def test_a_failed_rank_comes_first_and_marks_its_node() -> None:
    ranks = [cluster_rank(i) for i in range(8)]
    ranks[5] = dataclasses.replace(ranks[5], status="failed", bye_reason="error: RuntimeError: x")
    ranks[2] = dataclasses.replace(ranks[2], status="stalled")
    ctx = job_context(ranks)
    order = sorted(ranks, key=worst_first(ctx))
    assert [r.rank for r in order[:2]] == [5, 2]  # the crash before the hang it caused
    assert node_group("node0000", order, ctx).worst_status == "failed"
    assert ctx.lag(ranks[5]) == 0  # ended: not late
    from synthetic.cluster import cluster_job

    job = dataclasses.replace(cluster_job(8), ranks=tuple(ranks))
    failed = parse_filter("failed").matcher(job)
    assert [r.rank for r in ranks if failed(r)] == [5]


def test_the_status_maps_legend_keeps_failed_on_a_short_map() -> None:
    """At 80x24 the rank map is 4 rows: the legend's title and 3 lines. A seventh status made the
    legend 5 lines, and "failed", listed last, was the one cut (a reviewer's find): worst first.
    The eighth, "stop" (a signal ended it), leaves live and done to be cut."""
    from flowtop.tui.widgets.rank_map import LEGEND_WIDTH, legend_lines

    shown = ["".join(text for text, _ in line) for line in legend_lines("status", 8, LEGEND_WIDTH - 1)[:4]]
    assert "■failed ■stop" in shown and "■stale ■hung" in shown and "■unseen ■confl" in shown, shown


@pytest.mark.slow
def test_until_done_exits_4_when_a_rank_failed(tmp_path: Path) -> None:
    """A script waiting with `flowtop snapshot --until-done` had exit 0 for a crashed run: only
    the JSON said it (a reviewer's note). It exits 4 and names the first failed rank."""
    import json

    from conftest import probed_env
    from flowtop.tools.demo.launch import free_port_pair

    script = tmp_path / "t.py"
    script.write_text(SCRIPT)
    listen = f"tcp://127.0.0.1:{free_port_pair()}"
    watcher = subprocess.Popen([sys.executable, "-m", "flowtop.cli", "snapshot", "--listen", listen, "--until-done",
                                "--timeout", "90", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ran = subprocess.run([sys.executable, str(script), "raise"], env=probed_env(listen, FLOWTOP_JOB="crash"),
                             capture_output=True, text=True, timeout=90)
        assert ran.returncode == 1
        out, err = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
    assert watcher.returncode == 4, err
    assert "1 rank(s) failed, first rank 0 of crash: error: RuntimeError: boom at step 3" in err
    assert json.loads(out)["jobs"][0]["status"] == "failed"


def test_the_first_rank_to_fail_is_said_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    """A DDP rank crashes; its peer dies of the broken collective a moment later. The UI's table
    has room for "failed" only, and nothing said why (a new user's trial); --until-done named
    rank 0's "Connection closed by peer", in rank order, for rank 1's own error."""
    from flowtop.export.serve import end_status
    from flowtop.monitor.wiring import make_model
    from probe import wire

    model = make_model()
    keys = {r: wire.RankKey("ddp", "node-a", 100 + r, r, 0) for r in (0, 1)}
    hello = {"local_rank": 0, "world_size": 2, "device": "cpu", "probe_version": "t"}
    for r, key in keys.items():
        model.ingest(wire.decode(wire.encode("hello", key, 1, 10.0, dict(hello, local_rank=r))), 10.0)
    ends = ((1, 20.0, "error: RuntimeError: rank 1 exploded"),
            (0, 20.4, "error: RuntimeError: Connection closed by peer"))
    for r, t, why in ends:
        model.ingest(wire.decode(wire.encode("bye", keys[r], 2, t, {"reason": why, "steps": 60, "drops": 0})), t)
    model.tick(20.5)  # said at the tick that finds both ended (else a second after it came: FAILURE_SETTLE_S)
    said = [n for n in model.notices.take() if "failed" in n.text]
    assert [(n.severity, n.text) for n in said] == [("error", "rank 1 of ddp failed: error: RuntimeError: rank 1 exploded")]
    model.tick(30.0)
    assert not [n for n in model.notices.take() if "failed" in n.text]  # once a job
    snap = model.snapshot(21.0, "test")
    assert snap.jobs[0].status == "failed"
    assert end_status(snap) == 4
    assert "first rank 1 of ddp: error: RuntimeError: rank 1 exploded" in capsys.readouterr().err
