"""The probe never blocks: no monitor listening, a full queue, and a prompt exit."""

from __future__ import annotations

import statistics
import subprocess
import sys
import textwrap
import time

from flowtop.demo.launch import free_port_pair
from probe.publisher import Publisher
from probe.wire import RankKey


def test_publish_is_constant_time_and_bounded_when_nobody_listens() -> None:
    port = free_port_pair()
    pub = Publisher(RankKey("j", "h", 1, 0, 0), f"tcp://127.0.0.1:{port}", queue_size=100, max_age_s=0.2)
    pub.start()
    try:
        n = 20_000
        t0 = time.perf_counter()
        for i in range(n):
            pub.publish("step", {"step": i})
        per_call = (time.perf_counter() - t0) / n
        # A deque append: microseconds at most, even on a loaded 2-core CI box.
        assert per_call < 50e-6
        assert len(pub._queue) <= 100
        deadline = time.monotonic() + 5
        while pub.drops < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub.drops == n  # nobody subscribed: everything counted as dropped
    finally:
        t0 = time.monotonic()
        pub.close(timeout_s=0.3)
        assert time.monotonic() - t0 < 2.0


SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    sys.path.insert(0, sys.argv[2])
    use_probe = sys.argv[1] == "1"
    if use_probe:
        import probe
        assert probe.attach(addr=sys.argv[3])
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []
    for _ in range(60):
        t0 = time.perf_counter()
        model(torch.randn(64, 256)).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
        times.append(time.perf_counter() - t0)
    times.sort()
    print(times[len(times) // 2])
    print(time.time(), flush=True)
    """
)


def test_no_monitor_training_speed_and_prompt_exit(tmp_path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"  # nothing listens there
    env = {"FLOWTOP_KERNELS": "0", "FLOWTOP_FLOPS": "0", "PATH": "/usr/bin:/bin"}
    medians = {}
    for probe_on in ("0", "1", "0", "1"):
        out = subprocess.run(
            [sys.executable, str(script), probe_on, root, addr], capture_output=True, text=True, timeout=120,
            env={**__import__("os").environ, **env},
        )
        ended = time.time()
        assert out.returncode == 0, out.stderr
        median_s, printed_at = (float(x) for x in out.stdout.split())
        # No LINGER hang: the interpreter is gone within a few seconds of the last step.
        assert ended - printed_at < 5.0
        medians.setdefault(probe_on, []).append(median_s)
    ratio = statistics.median(medians["1"]) / statistics.median(medians["0"])
    # "Unchanged within noise" on a shared 2-core box: a generous bound that a
    # blocking send (seconds per step) or a per-step sync would still break.
    assert ratio < 1.5, medians


def test_oversized_message_is_dropped_not_sent(monitor) -> None:
    from probe import wire

    pub = Publisher(RankKey("big", "h", 1, 0, 0), monitor.listen)
    pub.start()
    try:
        pub.publish("step", {"step": 1, "wall_s": 0.1, "tokens": 1, "drops": 0, "pad": "x" * (wire.MAX_FRAME_BYTES + 1)})
        pub.publish("step", {"step": 2, "wall_s": 0.1, "tokens": 1, "drops": 0})
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 2, 10)
        # The connection survived (the monitor would cut it on a frame over MAXMSGSIZE).
        assert snap.jobs[0].ranks[0].step == 2
        assert pub.drops == 1 and snap.rejected == 0
    finally:
        pub.close()
