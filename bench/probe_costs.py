#!/usr/bin/env python
"""Where the probe's training-thread time goes, per step (CUDA if present, else CPU).

The small GPT of ``bench/gpt_step.py`` trains under the probe with its features switched on one
by one (steps only; + telemetry; + FLOP counting; + kernel windows). For each, the median of the
``probe_s`` field the step messages carry (the probe's own time on the training thread in its
hooks) and the median step time; plus the unit costs of the CUDA event calls each step makes.

    python bench/probe_costs.py            # prints one JSON object
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: gpt_step

STEPS = 300
CONFIGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("steps only", {"FLOWTOP_TELEMETRY": "0", "FLOWTOP_FLOPS": "0", "FLOWTOP_KERNELS": "0"}),
    ("+ telemetry", {"FLOWTOP_TELEMETRY": "1", "FLOWTOP_FLOPS": "0", "FLOWTOP_KERNELS": "0"}),
    ("+ flops", {"FLOWTOP_TELEMETRY": "1", "FLOWTOP_FLOPS": "1", "FLOWTOP_KERNELS": "0"}),
    ("+ kernels", {"FLOWTOP_TELEMETRY": "1", "FLOWTOP_FLOPS": "1", "FLOWTOP_KERNELS": "1",
                   "FLOWTOP_KERNELS_MIN_STEPS": "64"}),
)


def event_costs(n: int = 2000) -> dict[str, float]:
    """Microseconds per call of what the step tracker does with CUDA events each step."""
    import torch

    t0 = time.perf_counter()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    t1 = time.perf_counter()
    for e in evs:
        e.record()
    t2 = time.perf_counter()
    for e in evs:
        e.query()
    t3 = time.perf_counter()
    return {"create_us": (t1 - t0) / n * 1e6, "record_us": (t2 - t1) / n * 1e6,
            "query_us": (t3 - t2) / n * 1e6}


def main() -> int:
    import torch
    from gpt_step import SMALL, gpt_step  # puts the checkout on sys.path

    import probe

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _, step = gpt_step(SMALL, 4, dev)

    for _ in range(20):
        step()
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}
    if dev == "cuda":
        out["cuda_event_us"] = event_costs()
    rows = []
    for name, env in CONFIGS:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        probe_s: list[float] = []
        try:
            probe.attach(addr="tcp://127.0.0.1:9", job="costs")  # nothing listens: sends are dropped
            p = probe._current()
            publish = p.publisher.publish

            def spy(kind: str, fields: dict[str, Any], publish: Any = publish) -> None:
                if kind == "step" and fields.get("probe_s") is not None:
                    probe_s.append(fields["probe_s"])
                publish(kind, fields)

            p.publisher.publish = spy  # type: ignore[method-assign]
            wall: list[float] = []
            for _ in range(STEPS):
                t0 = time.perf_counter()
                step()
                wall.append(time.perf_counter() - t0)
            marks = set(p.sampled_steps)
        finally:
            probe.detach()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        steady = [s for i, s in enumerate(probe_s, start=1) if i > 2 and i not in marks]
        rows.append({"config": name, "probe_us_median": statistics.median(steady) * 1e6,
                     "probe_us_p90": sorted(steady)[int(0.9 * len(steady))] * 1e6,
                     "host_step_ms_median": statistics.median(wall[2:]) * 1e3,
                     "sampled_steps": len(marks)})
    out["per_step"] = rows
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
