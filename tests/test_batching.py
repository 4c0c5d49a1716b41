"""Bounded frames per rank: step records leave in batches (wire MINOR 2), at most one frame per
``FLOWTOP_FLUSH_S``, and the monitor's figures equal what the training loop itself saw."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import probed_env
from monitor_thread import MonitorThread
from probe.wire import RankKey

_LOOP = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.set_num_threads(1)
    w = torch.zeros(4, requires_grad=True)
    emb = torch.nn.Embedding(10, 4)
    opt = torch.optim.SGD([w, *emb.parameters()], lr=0.0)
    walls, last = [], None
    start = time.perf_counter()
    # At least the seconds asked and 1,500 steps (a loaded machine runs a 1 ms step slower), at most 60 s.
    while (time.perf_counter() - start < float(sys.argv[2]) or len(walls) < 1500) and time.perf_counter() - start < 60:
        t = time.perf_counter() + 0.001
        while time.perf_counter() < t:  # a 1 ms step, on the host
            pass
        (emb(torch.zeros(2, 3, dtype=torch.long)).sum() + w.sum()).backward()
        opt.step()
        now = time.perf_counter()
        if last is not None:
            walls.append(now - last)
        last = now
    json.dump({"steps": len(walls) + 1, "walls": walls, "seconds": time.perf_counter() - start}, open(sys.argv[1], "w"))
""")


@pytest.mark.slow
def test_a_one_ms_loop_sends_about_ten_frames_a_second_and_loses_nothing(monitor: MonitorThread,
                                                                         tmp_path: Path) -> None:
    script, truth_file = tmp_path / "loop.py", tmp_path / "truth.json"
    script.write_text(_LOOP)
    env = probed_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_TELEMETRY="0", FLOWTOP_FLOPS="0")
    before = monitor.snapshot().received
    run_s = 3.0
    proc = subprocess.run([sys.executable, str(script), str(truth_file), str(run_s)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    truth = json.loads(truth_file.read_text())
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 10)
    r = snap.jobs[0].ranks[0]
    frames = snap.received - before
    # ~1/FLUSH_S step frames per second plus a hello every 2 s and the bye, for thousands of steps
    assert truth["steps"] > 1000
    print(f"{truth['steps']} steps in {truth['seconds']:.1f} s -> {frames} frames")
    assert frames <= 12 * (truth["seconds"] + 1.5), frames
    assert r.step == truth["steps"] and r.lost_messages == 0 and r.dropped_messages == 0
    assert r.tokens_per_step == 6
    hist = r.history.step_time_s  # the last steps the monitor keeps, one by one
    assert len(hist) >= 100 and len(set(r.history.steps)) == len(r.history.steps)
    assert list(r.history.steps) == list(range(truth["steps"] - len(hist) + 1, truth["steps"] + 1))
    theirs = statistics.median(truth["walls"][-len(hist):])
    assert abs(statistics.median(hist) - theirs) / theirs < 0.2


@pytest.mark.slow
def test_step_frames_stand_in_for_the_hello_heartbeat_and_a_rank_that_stops_stepping_sends_it_again(
        monitor: MonitorThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """While step frames leave they keep the rank heard: one hello at the start, not one every
    2 s (a third of the frames at 4,096 ranks). A rank that stops stepping but lives (hung in a
    collective) sends its hello again 2.5 s after its last step frame and every 2 s after: the
    monitor sees it stalled, never silent long enough to be stale."""
    from probe.transport import publisher as publisher_mod
    from probe.transport.publisher import Publisher

    hellos: list[float] = []
    encode = publisher_mod.wire.encode

    def counted(kind, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if kind == "hello":
            hellos.append(time.monotonic())
        return encode(kind, *args, **kwargs)

    monkeypatch.setattr(publisher_mod.wire, "encode", counted)
    pub = Publisher(RankKey("beat", "h", 4321, 0, 0), monitor.listen)
    pub.hello_fields = {"local_rank": 0, "world_size": 1, "device": "cpu (test)", "probe_version": "test"}
    pub.start()
    try:
        deadline = time.monotonic() + 10
        while not hellos and time.monotonic() < deadline:
            time.sleep(0.05)
        for step in range(1, 301):  # 3 s of 10 ms steps (over a hello's 2 s)
            pub.publish("step", {"step": step, "wall_s": 0.01, "tokens": 8, "drops": 0})
            time.sleep(0.01)
        stopped = time.monotonic()
        assert len(hellos) == 1, hellos  # was 2-3 (one every 2 s)
        statuses: set[str] = set()
        # Without a step: stalled after 5 s; watched until then and the third hello again (~6.5 s:
        # past the 5 s a silent rank takes to go stale), 15 s at most.
        while time.monotonic() < stopped + 15 and not ("stalled" in statuses and len(hellos) >= 4):
            snap = monitor.snapshot()
            statuses |= {r.status for j in snap.jobs for r in j.ranks}
            time.sleep(0.1)
        assert "stalled" in statuses and "stale" not in statuses, statuses
        again = [t - stopped for t in hellos[1:]]
        assert again and 2.4 <= again[0] <= 4.0 and len(again) >= 3, again  # 2.5 s after, then every 2 s
    finally:
        pub.close()


@pytest.mark.slow
def test_a_flush_longer_than_the_outboxs_max_age_loses_no_step(monitor: MonitorThread, tmp_path: Path) -> None:
    """FLOWTOP_FLUSH_S=3 (allowed up to 10 s) holds each batch 3 s, past the outbox's 2 s expiry
    counted from its first record: every batch was dropped as stale and the job read "done" at a
    few steps of thousands (a new user's trial). A batch's age counts from when it is ready to go."""
    script, truth_file = tmp_path / "loop.py", tmp_path / "truth.json"
    script.write_text(_LOOP)
    env = probed_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_TELEMETRY="0", FLOWTOP_FLOPS="0",
                     FLOWTOP_FLUSH_S="3")
    proc = subprocess.run([sys.executable, str(script), str(truth_file), "7"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    truth = json.loads(truth_file.read_text())
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 15)
    r = snap.jobs[0].ranks[0]
    assert (r.step, r.dropped_messages, r.lost_messages) == (truth["steps"], 0, 0)
