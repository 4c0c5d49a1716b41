"""The probe never blocks: no monitor listening, a full queue, and an exit that does not hang.

Behaviour only: how fast publishing, closing and training are with no monitor is measured by
bench/probe_noblock.py (figures in bench/README.md). The bounds here are hang detection (a
blocking send or a LINGER wait lasts for ever), not speed claims.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from flowtop.tools.demo.launch import free_port_pair
from probe.transport.publisher import Publisher
from probe.wire import RankKey

HANG_S = 30.0  # far beyond any loaded box's time for the work below; a blocked call never ends


def _finishes(fn, timeout_s: float = HANG_S) -> bool:  # type: ignore[no-untyped-def]
    """Run ``fn`` on a daemon thread; whether it returned within ``timeout_s``."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout_s)
    return not t.is_alive()


def test_publish_does_not_block_and_stays_bounded_when_nobody_listens() -> None:
    port = free_port_pair()
    pub = Publisher(RankKey("j", "h", 1, 0, 0), f"tcp://127.0.0.1:{port}", queue_size=100, max_age_s=0.2)
    pub.start()
    n = 20_000
    sizes: list[int] = []

    def publish_all() -> None:
        for i in range(n):
            pub.publish("step", {"step": i})
            sizes.append(len(pub._queue)) if i % 1000 == 0 else None

    try:
        assert _finishes(publish_all), f"publish blocked with nobody listening ({len(sizes)} of {n // 1000} samples)"
        assert max(sizes) <= 100 and len(pub._queue) <= 100  # the queue never grows past its bound
        deadline = time.monotonic() + HANG_S
        while pub.drops < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pub.drops == n  # nobody subscribed: everything counted as dropped, nothing sent
    finally:
        assert _finishes(lambda: pub.close(timeout_s=0.3)), "close() hung with nobody listening"


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[1])
    import probe
    assert probe.attach(addr=sys.argv[2])
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(60):
        model(torch.randn(64, 256)).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
    print(probe._current().tracker.step, flush=True)
    """
)


def test_training_with_no_monitor_completes_and_exits(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    root = str(Path(__file__).resolve().parent.parent)
    addr = f"tcp://127.0.0.1:{free_port_pair()}"  # nothing listens there
    env = {**os.environ, "FLOWTOP_KERNELS": "0", "FLOWTOP_FLOPS": "0"}
    # A send that blocked would stop the loop; a LINGER wait on the queued frames would keep the
    # interpreter alive after it: either runs into the timeout (subprocess.TimeoutExpired).
    out = subprocess.run([sys.executable, str(script), root, addr], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["60"]  # every step went through the probe's step tracker


def test_oversized_message_is_dropped_not_sent(monitor) -> None:
    from probe import wire

    pub = Publisher(RankKey("big", "h", 1, 0, 0), monitor.listen)
    pub.start()
    try:
        # A kernels frame is sent as its map (step records leave as columns of known fields only,
        # so an oversized step map cannot happen since wire 1.3); a huge kernel window can.
        pub.publish("kernels", {"step": 1, "pad": "x" * (wire.MAX_FRAME_BYTES + 1)})
        pub.publish("step", {"step": 2, "wall_s": 0.1, "tokens": 1, "drops": 0})
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step == 2, 10)
        # The connection survived (the monitor would cut it on a frame over MAXMSGSIZE).
        assert snap.jobs[0].ranks[0].step == 2
        assert pub.drops == 1 and snap.rejected == 0
    finally:
        pub.close()
