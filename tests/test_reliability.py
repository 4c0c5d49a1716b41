"""Reliability: nothing sent to the probe may hurt training, and top-level attach() stays one rank.

Real processes on loopback: a training subprocess with the probe, a real monitor, hostile peers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import zmq

from conftest import ROOT
from monitor_thread import MonitorThread
from probe import wire
from snapshot_schema import assert_valid_snapshot

#: A training whose boundaries sit inside the user's own record_function ranges too (the ranges
#: that outlived a profiler session were the crash), with windows forced as often as allowed.
STRESS = textwrap.dedent(
    """
    import gc, sys, time, torch, probe
    from torch.autograd.profiler import record_function
    from probe.kernels.schedule import WindowScheduler
    torch.set_num_threads(1)
    probe.attach()
    p = probe._current()
    p._kernels.scheduler = WindowScheduler(min_interval_steps=1, max_interval_steps=1, align_steps=False)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    deadline = time.monotonic() + 30
    while p.publisher.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # windows are taken only while a monitor listens
    steps = int(sys.argv[1])
    for i in range(steps):
        with record_function("user_step"):
            model(torch.randn(16, 32)).pow(2).mean().backward()
            with record_function("user_opt"):
                opt.step()
            opt.zero_grad()
        if i % 50 == 0:
            gc.collect()  # heap corruption shows up as a crash inside the collector
    print("windows", p._kernels.windows, flush=True)
    """
)


def _plain_env(listen: str, **extra: str) -> dict[str, str]:
    """Explicit ``probe.attach()`` in the script (no flowtop run bootstrap)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWTOP_")}
    env.update(FLOWTOP_ADDR=listen, PYTHONPATH=str(ROOT), PYTHONFAULTHANDLER="1", **extra)
    return env


@pytest.mark.slow
def test_thousand_back_to_back_windows_never_crash(tmp_path: Path) -> None:
    script = tmp_path / "stress.py"
    script.write_text(STRESS)
    monitor = MonitorThread()
    try:
        proc = subprocess.run([sys.executable, str(script), "2000"], env=_plain_env(monitor.listen, FLOWTOP_FLOPS="0"),
                              capture_output=True, text=True, timeout=240)
    finally:
        monitor.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    windows = int(proc.stdout.split("windows")[1])
    # One unprofiled step after each window (a session never starts where one stopped).
    assert windows == 999  # the first step only anchors the schedule: windows on steps 3, 5, ..., 1999
    assert "USDT" not in proc.stderr  # Kineto's per-session lines stay out of the training's log


HIJACKED = textwrap.dedent(
    """
    import sys, time, torch, probe
    torch.set_num_threads(1)
    probe.attach()
    p = probe._current()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        model(torch.randn(16, 32)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        time.sleep(0.005)
    print("windows", p._kernels.windows, "refused", p._kernels.scheduler.refused,
          "dropped", p.publisher.commands_dropped, flush=True)
    """
)


def _flood(sock: zmq.Socket, frame: bytes, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        time.sleep(0.02)


def _free_port_pair() -> int:
    import socket

    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port pair")


@pytest.mark.slow
def test_a_stranger_on_the_old_control_port_cannot_steer_the_probe(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(HIJACKED)
    port = _free_port_pair()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)  # what an attacker bound before: data port + 1, no auth
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(f"tcp://127.0.0.1:{port + 1}")
    stop = threading.Event()
    flood = threading.Thread(target=_flood, args=(pub, wire.encode_control("kernels_now", "hj", None), stop))
    flood.start()
    try:
        proc = subprocess.run([sys.executable, str(script), "2"], env=_plain_env(f"tcp://127.0.0.1:{port}", FLOWTOP_JOB="hj"),
                              capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        flood.join()
        pub.close(0)
        ctx.term()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["windows", "0", "refused", "0", "dropped", "0"]  # the probe never hears it


@pytest.mark.slow
def test_even_the_monitor_gets_windows_only_within_the_budget(tmp_path: Path) -> None:
    """A peer at the data address is the monitor; its flood of requests is rate-limited."""
    script = tmp_path / "train.py"
    script.write_text(HIJACKED)
    port = _free_port_pair()
    ctx = zmq.Context()
    xsub = ctx.socket(zmq.XSUB)
    xsub.setsockopt(zmq.LINGER, 0)
    xsub.bind(f"tcp://127.0.0.1:{port}")
    xsub.send(b"\x01")
    stop = threading.Event()
    flood = threading.Thread(target=_flood, args=(xsub, wire.encode_control("kernels_now", "hj", None), stop))
    flood.start()
    seconds = 3.0
    try:
        proc = subprocess.run([sys.executable, str(script), str(seconds)],
                              env=_plain_env(f"tcp://127.0.0.1:{port}", FLOWTOP_JOB="hj",
                                             FLOWTOP_KERNELS_MIN_STEPS="1000000"),  # requested windows only
                              capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        flood.join()
        xsub.close(0)
        ctx.term()
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.split()
    windows, refused, dropped = int(out[1]), int(out[3]), int(out[5])
    # 50 requests/s for 3 s: at most one window per second (the floor of the rate limit); the rest
    # refused, or dropped unread past the command gate's bound (32, then 4 a second:
    # probe.transport.gate), and counted — those the gate never read (its socket left alone for
    # a second) are not counted, hence the lower bound.
    assert 1 <= windows <= seconds + 1
    assert refused + dropped > 20 * seconds, (refused, dropped)
    assert refused <= 32 + 4 * (seconds + 1)  # the gate's bound on what reaches the runtime


WORKERS = textwrap.dedent(
    """
    import sys, torch, probe
    probe.attach()  # at the top, as the README shows: re-run in every spawned worker

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.randn(16)

    if __name__ == "__main__":
        model = torch.nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        dl = torch.utils.data.DataLoader(DS(), batch_size=8, num_workers=2, multiprocessing_context=sys.argv[1],
                                         persistent_workers=True)
        for epoch in range(3):
            for x in dl:
                model(x).sum().backward(); opt.step(); opt.zero_grad()
        print("attached", probe.is_attached(), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_top_level_attach_in_dataloader_workers_is_no_rank(monitor: MonitorThread, tmp_path: Path, method: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(WORKERS)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0")
    proc = subprocess.run([sys.executable, str(script), method], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "attached True" in proc.stdout
    snap = monitor.wait_for(lambda s: bool(s.jobs) and all(r.status == "done" for r in s.jobs[0].ranks), 30)
    (job,) = snap.jobs
    # One rank, the trainer's pid, at its last step: no worker said hello as rank 0.
    assert [(r.pid, r.step) for r in job.ranks] == [(job.ranks[0].pid, 24)]
    assert job.ranks[0].bye_reason == "exit"


def _frame(kind: str, key: wire.RankKey, seq: int, **fields: object) -> bytes:
    return wire.encode(kind, key, seq, time.time(), fields)


def _quiet_training(monitor: MonitorThread, tmp_path: Path, seconds: float, **extra: str) -> subprocess.Popen[bytes]:
    """A probed training of ``seconds`` with steps only (no windows, counts or telemetry)."""
    script = tmp_path / "train.py"
    script.write_text(HIJACKED)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0", **extra)
    return subprocess.Popen([sys.executable, str(script), str(seconds)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _step_fields(step: int) -> dict[str, object]:
    return {"step": step, "wall_s": 0.01, "tokens": 16, "drops": 0}


def test_a_forged_step_far_ahead_is_rejected_and_the_real_rank_goes_on(monitor: MonitorThread, tmp_path: Path) -> None:
    proc = _quiet_training(monitor, tmp_path, 8)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(monitor.listen)
    try:
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step > 20, 60)
        r = snap.jobs[0].ranks[0]
        key = wire.RankKey(snap.jobs[0].job, r.host, r.pid, r.rank, r.incarnation)
        rejected = snap.rejected
        forged = [_frame("step", key, 10**12, **_step_fields(5)),  # seq far ahead
                  _frame("step", key, 0, **_step_fields(2**63 - 1))]  # step far ahead
        deadline = time.monotonic() + 20
        while monitor.snapshot().rejected < rejected + 2 and time.monotonic() < deadline:
            for f in forged:  # a PUB drops until its connection is up: resend (duplicates are fine)
                pub.send(f)
            time.sleep(0.1)
        snap = monitor.snapshot()
        assert snap.rejected >= rejected + 2
        assert sum(n for why, n in snap.rejected_reasons.items() if why.startswith("implausible")) >= 2
        before = snap.jobs[0].ranks[0].step
        assert before < 10**6
        snap = monitor.wait_for(lambda s: s.jobs[0].ranks[0].step > before + 20, 30)
        assert snap.jobs[0].ranks[0].status == "live"  # its view still moves: no false hang
    finally:
        pub.close(0)
        ctx.term()
        proc.kill()
        proc.wait(10)


def test_terminal_escapes_from_the_wire_never_reach_the_output() -> None:
    from flowtop.monitor.model import Model
    from flowtop.monitor.snapshot_json import to_json
    from flowtop.export.textreport import render

    model = Model()
    bad_host = wire.RankKey("job\x1b]0;pwned\x07", "host", 1, 0, 0)
    with pytest.raises(wire.WireError, match="job"):
        wire.decode(_frame("step", bad_host, 0, **_step_fields(1)))
    key = wire.RankKey("j", "h", 1, 0, 0)
    hello = {"local_rank": 0, "world_size": 1, "device": "\x1b[31mGPU\x07", "probe_version": "1", "argv": ["a\nb"]}
    model.ingest(wire.decode(_frame("hello", key, 0, **hello)), 1.0)
    model.ingest(wire.decode(_frame("hello", key, 1, **hello)), 1.0)  # re-sent: unlike the cleaned copy kept
    model.ingest(wire.decode(_frame("step", key, 2, **_step_fields(1))), 1.0)
    model.ingest(wire.decode(_frame("bye", key, 3, reason="\x9b2J gone", steps=1, drops=0)), 1.0)
    snap = model.snapshot(2.0)
    assert_valid_snapshot(to_json(snap))
    text = render(snap) + repr(snap) + str(to_json(snap))
    assert snap.jobs[0].ranks[0].device == "\\x1b[31mGPU\\x07"
    assert snap.jobs[0].ranks[0].bye_reason == "\\x9b2J gone"
    assert not any(c in text for c in ("\x1b", "\x07", "\x9b"))


def test_a_full_disk_at_exit_still_prints_the_snapshot(tmp_path: Path) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    port = _free_port_pair()
    proc = subprocess.run([sys.executable, "-m", "flowtop.cli", "snapshot", "--record", "/dev/full", "--timeout", "1",
                           "--json", "--listen", f"tcp://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    import json

    assert json.loads(proc.stdout)["schema"].startswith("flowtop.snapshot/")
    assert_valid_snapshot(json.loads(proc.stdout))
    assert "Traceback" not in proc.stderr
    assert "recording /dev/full is incomplete: No space left on device" in proc.stderr
    assert proc.returncode == 1  # the recording asked for is not whole


def test_forged_rank_floods_are_capped_and_counted() -> None:
    from flowtop.monitor.limits import Limits
    from flowtop.monitor.model import Model

    model = Model(limits=Limits(max_jobs=3, max_ranks_per_job=50, max_ranks=120, new_ranks_per_s=100, new_ranks_burst=200))
    t = 1000.0

    def hello(job: str, rank: int, now: float) -> None:
        key = wire.RankKey(job, "h", 1000 + rank, rank, 0)
        model.ingest(wire.decode(_frame("step", key, 0, **_step_fields(1))), now)

    for r in range(80):  # one job: 50 admitted, 30 refused (per-job cap, nobody has ended)
        hello("a", r, t)
    assert len(model.ranks) == 50 and model.rejected == 30
    for j in ("b", "c", "d"):  # a fourth job is over the job cap
        hello(j, 0, t)
    assert {k.job for k in model.ranks} == {"a", "b", "c"} and model.rejected == 31
    # The bucket held 200 and 83 were taken (every new key takes one, admitted or not): of 200
    # more in the same instant, 117 pass the rate (49 admitted to b, 68 over b's cap), 83 do not.
    for r in range(200):
        hello("b", 1000 + r, t)
    assert model.rejected_reasons["new rank refused: more new ranks per second than the monitor admits"] == 83
    assert model.rejected_reasons["new rank refused: the job's rank limit is reached"] == 30 + 68  # a, then b
    assert model.rejected_reasons["new rank refused: the monitor's job limit is reached"] == 1  # d
    # Later, job a's ranks have gone silent (stale): a new rank of a takes the longest-silent one's place.
    key0 = wire.RankKey("a", "h", 1000, 0, 0)
    before = model.ranks[key0].last_recv
    hello("a", 999, t + 60)
    assert len([k for k in model.ranks if k.job == "a"]) == 50 and model.ranks_evicted_for_room == 1
    assert before == t and key0 not in model.ranks  # the oldest silent one went first
    snap = model.snapshot(t + 60)
    assert snap.ranks_evicted_for_room == 1 and snap.rejected == model.rejected
    # A new job at the job cap takes the place of a job whose ranks have all ended (c, silent the
    # longest with b), never of a few ended ranks of a job that goes on.
    hello("b", 5000, t + 61)  # b is heard again (taking a silent b rank's place: full): c is now
    hello("e", 0, t + 62)      # the longest-silent job whose ranks all ended
    assert {k.job for k in model.ranks} == {"a", "b", "e"} and model.ranks_evicted_for_room == 3


@pytest.mark.slow
def test_sigterm_says_bye_and_the_rank_is_stopped(monitor: MonitorThread, tmp_path: Path) -> None:
    import signal

    proc = _quiet_training(monitor, tmp_path, 60)  # on by default
    try:
        monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step > 10, 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM  # it still dies of the signal, as without the probe
        snap = monitor.wait_for(lambda s: s.jobs[0].ranks[0].status == "stopped", 10)
        assert snap.jobs[0].ranks[0].bye_reason == "SIGTERM" and snap.jobs[0].status == "stopped"
    finally:
        proc.kill()
        proc.wait(10)


_HUNG_IN_C = """
import sys, torch, torch.distributed as dist
import probe
probe.attach()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
import time
for i in range(15):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    if i == 1:
        held_from = time.monotonic()  # step 2: the oldest record the batch holds
print("hanging", held_from, flush=True)
# rank 1 never comes: the main thread waits inside C++ (the store's rendezvous), never in Python
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=2)
"""


def test_sigterm_sends_the_steps_a_paced_batch_holds_before_the_bye(monitor: MonitorThread,
                                                                    tmp_path: Path) -> None:
    """Steps held 2 s for their batch (a long flush, as a monitor's pace asks at thousands of
    ranks) still reach the monitor when SIGTERM ends the rank meanwhile: the watcher sends them
    before the bye, whose step count is then the monitor's last step."""
    import signal

    from flowtop.tools.demo.launch import free_port_pair

    script = tmp_path / "hung.py"
    script.write_text(_HUNG_IN_C)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0",
                     FLOWTOP_FLUSH_S="2")
    proc = subprocess.Popen([sys.executable, str(script), str(free_port_pair())], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        said, held_from = proc.stdout.readline().split()
        assert said == "hanging"
        # the first step left at once (none sent for a flush); steps 2-15 wait for their batch,
        # 2 s from step 2: the signal must come before that (CLOCK_MONOTONIC is the machine's)
        proc.send_signal(signal.SIGTERM)
        if time.monotonic() - float(held_from) > 1.5:  # a box too loaded to signal within the flush
            pytest.skip("the signal came after the batch's own flush: nothing to test")
        assert proc.wait(10) == -signal.SIGTERM
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "stopped", 10)
        rank = snap.jobs[0].ranks[0]
        assert rank.bye_reason == "SIGTERM" and rank.step == 15
    finally:
        proc.kill()
        proc.wait(10)


def test_a_rank_hung_in_c_still_dies_of_sigterm_at_once_and_says_bye(monitor: MonitorThread,
                                                                      tmp_path: Path) -> None:
    import signal

    from flowtop.tools.demo.launch import free_port_pair

    script = tmp_path / "hung.py"
    script.write_text(_HUNG_IN_C)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0")
    proc = subprocess.Popen([sys.executable, str(script), str(free_port_pair())], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().split()[0] == "hanging"
        monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 15, 30)
        time.sleep(0.5)  # well inside the rendezvous
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # A Python handler alone would wait for the main thread (here: until the rendezvous
        # times out, 30 min); the sender thread says bye and re-raises the signal.
        assert proc.wait(10) == -signal.SIGTERM
        # The signal's byte wakes the sender's poll at once; it says bye and waits 0.3 s for it
        # to get out. (A sender that woke only for its next hello would take up to 2 s more.)
        assert time.monotonic() - t0 < 1.5
        snap = monitor.wait_for(lambda s: s.jobs[0].ranks[0].status == "stopped", 10)
        assert snap.jobs[0].ranks[0].bye_reason == "SIGTERM"
    finally:
        proc.kill()
        proc.wait(10)


_FORKS = """
import os, signal, sys, time, torch
import probe
probe.attach()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def train(n):
    for _ in range(n):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.02)
train(5)
child = os.fork()  # what a DataLoader worker is
if child == 0:
    time.sleep(30)
    os._exit(0)
os.kill(child, signal.SIGTERM)
assert os.waitpid(child, 0)[1] == signal.SIGTERM  # the child died of it ...
train(40)  # ... and its signal never reached this process (shared wakeup pipe)
print("survived", flush=True)
"""


@pytest.mark.slow
def test_a_forked_childs_sigterm_never_ends_the_rank(monitor: MonitorThread, tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(_FORKS)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "survived", proc.stderr[-2000:]
    snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].status == "done", 10)
    assert snap.jobs[0].ranks[0].step == 45 and snap.jobs[0].ranks[0].bye_reason == "exit"


_LATER_HANDLER = """
import signal, sys, time, torch
import probe
probe.attach()
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
previous = signal.getsignal(signal.SIGTERM)
stop = []
def graceful(signum, frame):  # what Lightning does: note it, call the handler it found, stop later
    stop.append(signum)
    if callable(previous):
        previous(signum, frame)
signal.signal(signal.SIGTERM, graceful)
print("ready", flush=True)
for _ in range(2000):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.005)
    if stop:
        break
print("stopped gracefully" if stop else "no signal", flush=True)
"""


def test_a_handler_installed_later_keeps_its_graceful_stop(monitor: MonitorThread, tmp_path: Path) -> None:
    import signal

    script = tmp_path / "graceful.py"
    script.write_text(_LATER_HANDLER)
    env = _plain_env(monitor.listen, FLOWTOP_KERNELS="0", FLOWTOP_FLOPS="0", FLOWTOP_TELEMETRY="0")
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step > 5, 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # neither the probe's watch nor its chained handler killed it
        assert proc.stdout.read().strip() == "stopped gracefully"
        snap = monitor.wait_for(lambda s: s.jobs[0].ranks[0].status == "done", 10)
        assert snap.jobs[0].ranks[0].bye_reason == "exit"
    finally:
        proc.kill()
        proc.wait(10)


def test_frames_lost_in_transit_are_counted_and_shown() -> None:
    """Frames queued in a pipe that dropped (a slow monitor reconnected) never arrive; the probe
    cannot know, so the monitor counts its sequence gaps and says so with the probe's drops."""
    from flowtop.monitor.model import Model
    from flowtop.export.textreport import render
    from flowtop.tui.widgets.job_header import JobHeader

    model = Model()
    key = wire.RankKey("j", "h", 1, 0, 0)
    for seq, step in ((0, 1), (1, 2), (77, 3), (78, 4)):  # 75 frames vanished with the old pipe
        fields = dict(_step_fields(step), drops=3)
        model.ingest(wire.decode(_frame("step", key, seq, **fields)), 1.0 + step * 0.01)
    snap = model.snapshot(1.1)
    r = snap.jobs[0].ranks[0]
    assert (r.lost_messages, r.dropped_messages) == (75, 3)
    assert "messages: 75 missing (sequence gaps: lost in transit or refused here), 3 dropped by the probes' queues (the oldest, while " \
        "nothing took them: no monitor yet, a dead relay, or one behind)" in render(snap)
    assert " lost 78" in JobHeader.render_text(snap, snap.jobs[0], 0, 1).plain


def test_kernel_frames_beyond_the_byte_rate_are_refused_before_validation() -> None:
    from flowtop.monitor.limits import KernelBudget, Limits

    t = [0.0]
    budget = KernelBudget(Limits(kernel_bytes_per_s_rank=1000, kernel_burst_rank=5000, kernel_bytes_per_s=1500,
                                 kernel_burst=8000), lambda: t[0])
    a, b = wire.RankKey("j", "h", 1, 0, 0), wire.RankKey("j", "h", 2, 1, 0)
    assert budget(a, "step", 10**9) == ""  # only kernels frames are metered
    assert budget(a, "kernels", 4000) == "" and "per-rank" in budget(a, "kernels", 2000)
    assert budget(b, "kernels", 4000) == "" and "monitor's" in budget(b, "kernels", 1000)  # 8000 - 8000
    t[0] = 2.0  # 2 s later: a has 1000 + 2000 = 3000 of its own, the monitor 3000
    assert budget(a, "kernels", 3000) == "" and budget(b, "kernels", 1) != ""
    # Through a real decode: refused before the (costly) record validation, with the reason.
    frame = wire.encode("kernels", a, 0, 1.0, {"window": 1, "step": 1, "device": "cpu", "step_dur_us": 1.0,
                                              "names": [], "ops": "not even valid", "acts": []})
    with pytest.raises(wire.WireError, match="per-rank kernel byte rate"):
        wire.decode(frame, budget)
    with pytest.raises(wire.WireError, match="ops"):
        wire.decode(frame)


def test_a_monitor_spreading_its_ticks_thinner_takes_kernel_windows_at_a_share_of_the_rate() -> None:
    """At spread 4 (flowtop.monitor.thinning: ticks crowd out frames) the monitor's overall kernel
    byte rate is a quarter, 1,500/s -> 375/s, from the instant the spread changed (what accrued
    before, at the old rate); the burst stays (a large window still fits)."""
    from flowtop.monitor.limits import KernelBudget, Limits

    t, spread = [0.0], [1]
    budget = KernelBudget(Limits(kernel_bytes_per_s_rank=10**6, kernel_burst_rank=10**7, kernel_bytes_per_s=1500,
                                 kernel_burst=8000), lambda: t[0], lambda: spread[0])
    keys = iter(wire.RankKey("j", "h", 10 + r, r, 0) for r in range(40))
    assert budget(next(keys), "kernels", 8000) == ""  # the whole burst
    spread[0] = 4
    budget.respread(0.0)
    t[0] = 4.0  # 4 s at 375/s: 1,500 bytes
    assert budget(next(keys), "kernels", 1500) == "" and "monitor's" in budget(next(keys), "kernels", 1)
    spread[0] = 1
    budget.respread(4.0)
    t[0] = 6.0  # 2 s at 1,500/s: 3,000 bytes
    assert budget(next(keys), "kernels", 3000) == "" and "monitor's" in budget(next(keys), "kernels", 1)
    spread[0] = 4
    budget.respread(8.0)  # 2 s more at 1,500/s before the change: 3,000
    t[0] = 12.0  # then 4 s at 375/s: 1,500
    assert budget(next(keys), "kernels", 4500) == "" and "monitor's" in budget(next(keys), "kernels", 1)


def test_a_window_frees_its_profiler_session_without_waiting_for_gc() -> None:
    """torch's profile objects sit in reference cycles: a session's event storage used to wait
    for a full collection (RSS +90 MB per 100 windowed steps of the demo GPT between them)."""
    import gc
    import weakref

    import torch

    from probe.kernels.windows import KernelWindowSampler, WindowScheduler

    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1, min_request_s=0), cuda=False)
    layer = torch.nn.Linear(32, 32)
    gc.disable()
    try:
        sampler.request_now()
        assert sampler.begin_step(1)
        session = weakref.ref(sampler._prof.profiler)
        layer(torch.randn(8, 32)).sum().backward()
        window = sampler.end_step(1)
        assert window is not None and window["ops"]
        assert session() is None  # freed by reference counting, with the collector off
    finally:
        gc.enable()


SPAWNED_RANK = textwrap.dedent(
    """
    import torch, torch.multiprocessing as mp, probe

    def rank_main(rank):
        print("attached", probe.attach(job="sp", rank=rank, world_size=1), flush=True)  # at once

    if __name__ == "__main__":
        mp.spawn(rank_main, nprocs=1)
    """
)


@pytest.mark.slow
def test_attach_inside_an_mp_spawn_rank_is_immediate(tmp_path: Path) -> None:
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED_RANK)
    monitor = MonitorThread()
    try:
        proc = subprocess.run([sys.executable, str(script)], env=_plain_env(monitor.listen, FLOWTOP_TELEMETRY="0"),
                              capture_output=True, text=True, timeout=120)
    finally:
        monitor.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "attached True" in proc.stdout
