#!/usr/bin/env python
"""The probe with no monitor listening: what publishing, closing and training cost.

The figures tests/test_probe_noblock.py used to assert as timings (it now checks behaviour
only: nothing blocks, nothing hangs). Prints one JSON object:

* ``publish_us``: mean wall time of ``Publisher.publish`` over N calls while nobody subscribes
  (a deque append; it was asserted < 50 µs);
* ``close_s``: ``Publisher.close(timeout_s=0.3)`` with everything dropped (was asserted < 2 s);
* ``step_ms`` with and without the probe, a small MLP trained in subprocesses whose monitor
  address nobody listens on, interleaved runs, medians, and their ratio (was asserted < 1.5);
* ``exit_s``: from a training subprocess's last step to its exit as seen by the parent
  (LINGER 0: was asserted < 5 s).

    python bench/probe_noblock.py [--calls 20000] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from flowtop.tools.demo.launch import free_port_pair  # noqa: E402
from probe.transport.publisher import Publisher  # noqa: E402
from probe.wire import RankKey  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    sys.path.insert(0, sys.argv[2])
    if sys.argv[1] == "1":
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


def publish_costs(calls: int) -> dict[str, float]:
    pub = Publisher(RankKey("j", "h", 1, 0, 0), f"tcp://127.0.0.1:{free_port_pair()}", queue_size=100, max_age_s=0.2)
    pub.start()
    try:
        t0 = time.perf_counter()
        for i in range(calls):
            pub.publish("step", {"step": i})
        per_call = (time.perf_counter() - t0) / calls
    finally:
        t0 = time.monotonic()
        pub.close(timeout_s=0.3)
        close_s = time.monotonic() - t0
    return {"publish_us": round(per_call * 1e6, 2), "close_s": round(close_s, 3)}


def training(runs: int) -> dict[str, object]:
    addr = f"tcp://127.0.0.1:{free_port_pair()}"  # nothing listens there
    env = {**os.environ, "FLOWTOP_KERNELS": "0", "FLOWTOP_FLOPS": "0"}
    medians: dict[str, list[float]] = {"0": [], "1": []}
    exits: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "loop.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        for _ in range(runs):
            for probe_on in ("0", "1"):
                out = subprocess.run([sys.executable, script, probe_on, ROOT, addr], capture_output=True,
                                     text=True, timeout=300, env=env, check=True)
                ended = time.time()
                median_s, printed_at = (float(x) for x in out.stdout.split())
                medians[probe_on].append(median_s)
                if probe_on == "1":
                    exits.append(ended - printed_at)
    off, on = statistics.median(medians["0"]), statistics.median(medians["1"])
    return {"step_ms_without": round(off * 1e3, 3), "step_ms_with": round(on * 1e3, 3),
            "ratio": round(on / off, 3), "exit_s_max": round(max(exits), 3), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=2, help="training runs with and without the probe (interleaved)")
    a = ap.parse_args(argv)
    print(json.dumps({**publish_costs(a.calls), **training(a.runs), "load_avg_1m": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
