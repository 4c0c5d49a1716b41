#!/usr/bin/env python
"""Where the probe's training-thread time goes, per step (CUDA if present, else CPU).

The small GPT of ``bench/gpt_step.py`` trains under the probe with its features switched on one
by one (steps only; + telemetry; + FLOP counting; + kernel windows). For each, the median of the
``probe_s`` field the step messages carry (the probe's own time on the training thread in its
hooks) and the median step time; plus the unit costs of the CUDA event calls each step makes.

``probe_s`` is timed by the probe itself, from inside its hooks: what it does not see is the
entry into each hook (torch calling it) and its first lines. ``--hooks`` adds a second figure
that sees all of it: every hook torch calls for the probe is wrapped in a timer, and the median
per step of each hook's wall time is printed less the wrapper's own median (a timed no-op
called the same way, right after a step: caches are as cold as the hooks find them).

    python bench/probe_costs.py                              # prints one JSON object
    python bench/probe_costs.py --steps 100 --config "+ kernels" --hooks
"""

from __future__ import annotations

import argparse
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


class HookTimer:
    """Wall time of every hook the probe registered with torch, per call (see the docstring)."""

    def __init__(self) -> None:
        self.ns: dict[str, list[int]] = {}

    def wrap(self, name: str, hook: Any) -> Any:
        clock, out = time.perf_counter_ns, self.ns.setdefault(name, [])

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return hook(*args, **kwargs)
            finally:
                out.append(clock() - t0)

        return timed

    def install(self, p: Any) -> None:
        """Wrap the root's, the embedding's and the global optimizer hooks of probe ``p``."""
        from torch.optim import optimizer

        t = p.tracker
        tables = [("root_pre", getattr(t.root, "_forward_pre_hooks", {})),
                  ("root_post", getattr(t.root, "_forward_hooks", {})),
                  ("embedding_pre", getattr(t.embedding, "_forward_pre_hooks", {}) if t.embedding is not None else {}),
                  ("optimizer_pre", optimizer._global_optimizer_pre_hooks),
                  ("optimizer_post", optimizer._global_optimizer_post_hooks)]
        for name, table in tables:
            for key in list(table):
                table[key] = self.wrap(name, table[key])

    def per_step_us(self, steps: int) -> dict[str, float]:
        """Median µs per call of each hook less the no-op's median, and their sum per step."""
        noop = statistics.median(self.ns.get("noop", [0]))
        out: dict[str, float] = {}
        for name, ns in self.ns.items():
            if name != "noop" and ns:
                calls = len(ns) / steps
                out[name] = round(calls * (statistics.median(ns) - noop) / 1e3, 2)
        out["sum"] = round(sum(out.values()), 2)
        out["timer_noop"] = round(noop / 1e3, 2)
        return out


def tap_batches(by_step: dict[int, float]) -> None:
    """Fill ``by_step`` (step -> probe_s) from every batch of step records the sender closes."""
    from probe.transport.rounds import Round

    close = Round.close_batch

    def tapped(r: Round) -> None:
        for entry in r.batch:
            fields = entry[2]
            if fields.get("probe_s") is not None:
                by_step[fields["step"]] = fields["probe_s"]
        close(r)

    Round.close_batch = tapped  # type: ignore[method-assign]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per feature set")
    ap.add_argument("--config", action="append", help="feature sets to run (default: all)")
    ap.add_argument("--hooks", action="store_true", help="also time every hook from outside")
    ap.add_argument("--batch", type=int, default=4, help="sequences per step (256 tokens each)")
    ap.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own)")
    ap.add_argument("--fp32", action="store_true",
                    help="no bf16 autocast (a CPU without bf16 instructions takes ~20x longer a step)")
    args = ap.parse_args()
    import torch
    from gpt_step import SMALL, gpt_step  # puts the checkout on sys.path

    import probe

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    _, step = gpt_step(SMALL, args.batch, dev, bf16=not args.fp32)

    for _ in range(20):
        step()
    out: dict[str, Any] = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
                           "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI")}
    if dev == "cuda":
        out["cuda_event_us"] = event_costs()
    rows = []
    by_step: dict[int, float] = {}  # step -> probe_s, of the feature set that runs
    tap_batches(by_step)
    for name, env in CONFIGS:
        if args.config and name not in args.config:
            continue
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            probe.attach(addr="tcp://127.0.0.1:9", job="costs")  # nothing listens: sends are dropped
            p = probe._current()
            # probe_s of each step record, read where the sender closes a batch of them (its
            # thread): a spy on the training thread's publish() added ~3 µs to what it measured,
            # and the common step does not call publish() (probe.transport.steprows).
            by_step.clear()
            wall: list[float] = []
            timer = HookTimer() if args.hooks else None
            noop = timer.wrap("noop", lambda: None) if timer else None
            for i in range(args.steps):
                if timer is not None and i == 3:  # the root and its hooks are known from step 1
                    timer.install(p)
                t0 = time.perf_counter()
                step()
                wall.append(time.perf_counter() - t0)
                if noop is not None:
                    noop()
            marks = set(p.sampled_steps)
        finally:
            probe.detach()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        steady = [s for i, s in sorted(by_step.items()) if i > 2 and i not in marks]
        rows.append({"config": name, "probe_us_median": statistics.median(steady) * 1e6,
                     "probe_us_p90": sorted(steady)[int(0.9 * len(steady))] * 1e6,
                     "host_step_ms_median": statistics.median(wall[2:]) * 1e3,
                     "sampled_steps": len(marks)})
        if timer is not None:
            rows[-1]["hooks_us"] = timer.per_step_us(args.steps - 3)
    out["per_step"] = rows
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
