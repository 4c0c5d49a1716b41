#!/usr/bin/env python
"""Does a torch.profiler window slow the training steps that come after it? (CUDA only)

Kineto keeps CUPTI attached after a profiling session unless ``TEARDOWN_CUPTI=1``; an attached
CUPTI adds a callback to every CUDA API call, which a launch-bound step feels. The probe's kernel
windows are such sessions, so the probe sets ``TEARDOWN_CUPTI=1`` unless the user set it. This
benchmark measures both settings, each in a fresh process (the variable is read by Kineto):
the small GPT of ``bench/gpt_step.py`` (launch-bound on an H200), median step time before any
profiling, after a first one-step window and after a second, and what each window step cost.

    python bench/cupti_teardown.py          # prints one JSON object
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

STEPS = 300


def child() -> dict[str, Any]:
    """One process: before / window / after / window / after."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/: gpt_step
    from gpt_step import SMALL, gpt_step

    _, step = gpt_step(SMALL, 4, "cuda")

    def steps(n: int) -> float:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        torch.cuda.synchronize()
        ev[0].record()
        for i in range(n):
            step()
            ev[i + 1].record()
        ev[-1].synchronize()
        return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(n))

    def window() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(20):
        step()
    out: dict[str, Any] = {"TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}
    out["before_ms"] = steps(STEPS)
    out["window1_ms"] = window()
    out["after1_ms"] = steps(STEPS)
    out["window2_ms"] = window()
    out["after2_ms"] = steps(STEPS)
    out["after1_over_before"] = out["after1_ms"] / out["before_ms"]
    out["after2_over_before"] = out["after2_ms"] / out["before_ms"]
    return out


def main() -> int:
    if "--child" in sys.argv:
        print(json.dumps(child()))
        return 0
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "no torch"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    results = []
    for setting in (None, "1"):
        env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
        if setting is not None:
            env["TEARDOWN_CUPTI"] = setting
        try:
            res = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True,
                                 text=True, timeout=45)  # two children within the script's 100 s
        except subprocess.TimeoutExpired:
            results.append({"TEARDOWN_CUPTI": setting, "error": "timed out after 45 s"})
            continue
        try:
            results.append(json.loads(res.stdout.strip().splitlines()[-1]))
        except (IndexError, ValueError):
            results.append({"TEARDOWN_CUPTI": setting, "error": res.stderr[-2000:]})
    print(json.dumps({"steps_per_median": STEPS, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
