#!/usr/bin/env python
"""GPU check: train a small and a large GPT on one CUDA device under the probe; print ONE JSON.

For each model, all in one process:

* step time (CUDA events between steps) without the probe, with it, and without it again; the
  ratio leaves out the steps the probe sampled (FLOP count, kernel window), which are reported
  apart;
* what a real monitor (``flowtop snapshot`` in a child process, recording every frame) showed
  while the probe was attached: counted model/executed FLOPs per step, MFU/HFU against the
  table's peak with its source, NVML GPU-Util and GPM SM/tensor/DRAM activity, power and clocks,
  the kernel window's top kernels and step anatomy, and the hints;
* cross-checks: torch's own FlopCounterMode and the 6N+12LdT estimate beside the probe's count,
  and a direct torch.profiler top-kernel list beside the probe's window.

    python bench/gpu_check.py                  # both models, < 5 min on one H200
    python bench/gpu_check.py --small          # the small model only
    python bench/gpu_check.py --out DIR        # also keep DIR/<model>.rec (flowtop replay)
    python bench/gpu_check.py --json FILE      # also write the JSON to FILE after every section,
                                               # so a run cut short still leaves its figures
    python bench/gpu_check.py --cpu-dry-run    # tiny models on the CPU: exercises every section

Without CUDA it prints {"skipped": "no CUDA"} and exits 0. Every section runs in its own
try/except and records failures under "errors", so one broken part never hides the others.
bf16 autocast, fused AdamW, random tokens generated on the device (no input pipeline).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "bench")):
    if _p not in sys.path:
        sys.path.insert(0, _p)  # run from anywhere: flowtop/probe from this checkout

BUDGET_S = 170.0  # no new section starts after this: the slowest (≈30 s) fits well within 5 min
# name, GPTConfig kwargs, batch, timed steps, seconds with the probe (telemetry needs a few).
# "large" ≈ 940 M parameters at 16 k tokens per step, "small" ≈ 7 M at 1 k tokens (docs/design.md, "Overheads").
MODELS: tuple[tuple[str, dict[str, int], int, int, float], ...] = (
    ("small", dict(vocab_size=8192, n_layer=4, n_head=4, n_embd=256, block_size=256), 4, 200, 8.0),
    ("large", dict(vocab_size=32768, n_layer=16, n_head=16, n_embd=2048, block_size=1024), 16, 20, 10.0),
)
# --cpu-dry-run: the same code path with tiny shapes on the CPU (host timers, no NVML), so the
# script can be checked on a machine without a GPU before it is spent on one.
DRY_MODELS: tuple[tuple[str, dict[str, int], int, int, float], ...] = (
    ("small", dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64), 2, 10, 3.0),
    ("large", dict(vocab_size=1024, n_layer=2, n_head=4, n_embd=128, block_size=128), 2, 5, 3.0),
)
DEV = "cuda"
T0 = time.monotonic()
RESULT: dict[str, Any] = {}  # the whole document, rewritten to JSON_PATH after every section
JSON_PATH: str | None = None


def checkpoint() -> None:
    """Write the document so far (``--json``); a run killed later keeps what it measured."""
    if JSON_PATH is None:
        return
    try:
        tmp = JSON_PATH + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(_clean(RESULT), fh, indent=2, default=str, allow_nan=False)
        os.replace(tmp, JSON_PATH)
    except (OSError, TypeError, ValueError) as exc:
        log(f"cannot write {JSON_PATH}: {exc}")


def log(msg: str) -> None:
    """Progress goes to stderr; stdout carries only the JSON."""
    sys.stderr.write(f"[gpu_check {time.monotonic() - T0:6.1f}s] {msg}\n")
    sys.stderr.flush()


def section(result: dict[str, Any], key: str, fn: Callable[[], Any]) -> Any:
    """Run one part, store its value under ``key`` or its error under ``errors[key]``."""
    if time.monotonic() - T0 > BUDGET_S:
        result.setdefault("skipped", []).append(key)
        return None
    log(key)
    try:
        value = fn()
    except Exception as exc:
        result.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}\n" + "".join(
            traceback.format_exc(limit=6))[-2000:]
        log(f"{key} failed: {exc!r}")
        return None
    if value is not None:
        result[key] = value
    checkpoint()
    return value


def sync() -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


class StepTimer:
    """Per-step device times from CUDA events recorded between steps (host clock on the CPU)."""

    def __init__(self) -> None:
        import torch

        self._cuda = DEV == "cuda"
        self._marks: list[Any] = []
        self._new = (lambda: torch.cuda.Event(enable_timing=True)) if self._cuda else None

    def mark(self) -> None:
        if self._cuda:
            ev = self._new()  # type: ignore[misc]
            ev.record()
            self._marks.append(ev)
        else:
            self._marks.append(time.perf_counter())

    def times_ms(self) -> list[float]:
        sync()
        m = self._marks
        if self._cuda:
            return [m[i].elapsed_time(m[i + 1]) for i in range(len(m) - 1)]
        return [(m[i + 1] - m[i]) * 1e3 for i in range(len(m) - 1)]


def summary(per: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(per), "mean_ms": statistics.fmean(per), "min_ms": min(per),
            "max_ms": max(per), "steps": len(per)}


def time_steps(step: Callable[[], None], n: int) -> dict[str, float]:
    timer = StepTimer()
    sync()
    timer.mark()
    for _ in range(n):
        step()
        timer.mark()
    return summary(timer.times_ms())


def top_kernels(step: Callable[[], None], steps: int = 2, top: int = 10) -> dict[str, Any]:
    """Cross-check: torch.profiler's own key averages over ``steps`` steps (device time)."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    activity = ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync()
    rows = []
    for evt in prof.key_averages():
        if getattr(evt, "is_user_annotation", False):
            continue  # ranges such as "Optimizer.step#AdamW.step" would double-count kernel time
        if DEV == "cuda":
            us = getattr(evt, "self_device_time_total", None)
            if us is None:
                us = getattr(evt, "self_cuda_time_total", 0.0)
        else:
            us = evt.self_cpu_time_total
        if us and us > 0:
            rows.append((float(us) / steps, int(evt.count) / steps, str(evt.key)))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    return {"kernel_us_per_step": total, "kernels_per_step": sum(r[1] for r in rows),
            "top": [{"name": n[:120], "us_per_step": round(us, 1), "calls_per_step": c}
                    for us, c, n in rows[:top]]}


def bench_model(res: dict[str, Any], name: str, cfg_kw: dict[str, int], batch: int, timed: int,
                probe_s: float, out_dir: str | None) -> dict[str, Any]:
    """All sections for one model size, filled into ``res`` as they finish."""
    import torch

    res.update(config=dict(cfg_kw), batch=batch, tokens_per_step=batch * cfg_kw["block_size"])
    state: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        from gpt_step import gpt_step

        model, step = gpt_step(cfg_kw, batch, DEV)
        from probe.flops.estimate import non_embedding_params

        state.update(model=model, step=step)
        return {"params": sum(p.numel() for p in model.parameters()),
                "non_embedding_params": non_embedding_params(model)}

    info = section(res, "model", build)
    if "step" not in state:
        return res
    step = state["step"]
    section(res, "warmup", lambda: time_steps(step, 10 if name == "small" else 5))
    base1 = section(res, "time_without_probe", lambda: time_steps(step, timed))

    def reference_flops() -> dict[str, Any]:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step()
        sync()
        out: dict[str, Any] = {"torch_flop_counter_per_step": float(counter.get_total_flops())}
        if info:
            from probe.flops.estimate import transformer_flops_per_token

            per_token = transformer_flops_per_token(info["non_embedding_params"], cfg_kw["n_layer"],
                                                    cfg_kw["n_embd"], cfg_kw["block_size"])
            out["estimate_6n_12ldt_per_step"] = float(per_token * res["tokens_per_step"])
        return out

    ref = section(res, "reference_flops", reference_flops)
    job = f"gpu_check-{name}"

    def with_probe() -> dict[str, Any]:
        import probe
        from monitor_proc import MonitorProcess, monitor_view

        record = os.path.join(out_dir, f"{name}.rec") if out_dir else None
        mon = MonitorProcess(record=record)
        saved = os.environ.get("FLOWTOP_KERNELS_MIN_STEPS")
        os.environ["FLOWTOP_KERNELS_MIN_STEPS"] = "8"  # a window within the first seconds
        try:
            attached = probe.attach(addr=mon.listen, job=job)
            if not attached:
                raise RuntimeError("probe.attach returned False (is pyzmq installed?)")
            timer = StepTimer()
            sync()
            timer.mark()
            t_end = time.monotonic() + probe_s
            n = 0
            while n < timed or time.monotonic() < t_end:
                step()
                timer.mark()
                n += 1
                p = probe._current()
                if n >= 2 * timed and "kernels" in p.sampled_steps.values() and time.monotonic() > t_end:
                    break
                if n > 20_000:
                    break
            times = timer.times_ms()
            marks = dict(probe._current().sampled_steps)
            # The snapshot is taken while training goes on: the telemetry it shows (sampled each
            # second) is then of training, not of a pause.
            mon.interrupt()
            t_end = time.monotonic() + 1.0
            while time.monotonic() < t_end:
                step()
            snap = mon.snapshot()
        finally:
            probe.detach()
            if saved is None:
                os.environ.pop("FLOWTOP_KERNELS_MIN_STEPS", None)
            else:
                os.environ["FLOWTOP_KERNELS_MIN_STEPS"] = saved
            mon.close()
        # times[i] is probe step i + 1; step 1 pays attach and model discovery (once per run)
        steady = [t for i, t in enumerate(times, start=1) if i > 1 and i not in marks]
        first_window = min((i for i, w in marks.items() if w == "kernels"), default=len(times) + 1)
        # Steps after a kernel window pay for a CUPTI left attached (bench/cupti_teardown.py)
        before = [t for i, t in enumerate(times, start=1) if 1 < i < first_window and i not in marks]
        after = [t for i, t in enumerate(times, start=1) if i > first_window and i not in marks]
        sampled = {what: [round(times[i - 1], 3) for i, w in sorted(marks.items()) if w == what
                          and i <= len(times)] for what in ("flops", "kernels")}
        out = {"attached": attached, **summary(steady), "sampled_step_ms": sampled,
               "median_before_first_window_ms": statistics.median(before) if before else None,
               "median_after_first_window_ms": statistics.median(after) if after else None,
               "TEARDOWN_CUPTI": os.environ.get("TEARDOWN_CUPTI"),
               "first_step_ms": round(times[0], 3), "monitor": monitor_view(snap, job)}
        if record:
            out["recording"] = record
        return out

    probed = section(res, "time_with_probe", with_probe)
    base2 = section(res, "time_without_probe_again", lambda: time_steps(step, timed))

    def overhead() -> dict[str, Any]:
        bases = [b for b in (base1, base2) if b]
        if not probed or not bases:
            raise RuntimeError("missing timings")
        med = statistics.fmean(b["median_ms"] for b in bases)
        mean = statistics.fmean(b["mean_ms"] for b in bases)
        out = {"median_ratio": probed["median_ms"] / med, "mean_ratio": probed["mean_ms"] / mean,
               "without_median_ms": med, "with_median_ms": probed["median_ms"],
               "note": "steady steps; sampled steps (FLOP count, kernel window) listed apart"}
        for what, times in probed["sampled_step_ms"].items():
            if times:
                out[f"{what}_step_extra_ms"] = statistics.median(times) - med
        return out

    section(res, "probe_overhead", overhead)

    def crosscheck() -> dict[str, Any]:
        mon = (probed or {}).get("monitor") or {}
        out: dict[str, Any] = {}
        if ref and mon.get("executed_flops_per_step"):
            out["probe_executed_over_torch_counter"] = mon["executed_flops_per_step"] / ref[
                "torch_flop_counter_per_step"]
        if ref and mon.get("flops_per_step") and ref.get("estimate_6n_12ldt_per_step"):
            out["probe_model_over_estimate"] = mon["flops_per_step"] / ref["estimate_6n_12ldt_per_step"]
        if mon.get("flops_per_step") and mon.get("peak_flops") and base1:
            # MFU from this script's own event timing, against the monitor's figure
            out["mfu_from_event_timing"] = mon["flops_per_step"] / (base1["median_ms"] / 1e3) / mon["peak_flops"]
            out["mfu_monitor"] = mon.get("mfu")
        return out

    section(res, "crosscheck", crosscheck)
    kern = section(res, "profiler_top_kernels", lambda: top_kernels(step))
    if kern and base1:
        kern["gpu_busy_fraction"] = kern["kernel_us_per_step"] / 1e3 / base1["median_ms"]
    state.clear()
    sync()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv: list[str]) -> int:
    global DEV, JSON_PATH
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"skipped": f"no torch: {exc}"}))
        return 0
    models = MODELS
    result = RESULT
    out_dir = argv[argv.index("--out") + 1] if "--out" in argv[:-1] else None
    JSON_PATH = argv[argv.index("--json") + 1] if "--json" in argv[:-1] else None
    if "--cpu-dry-run" in argv:
        DEV, models = "cpu", DRY_MODELS
        result["dry_run"] = "tiny models on the CPU; numbers mean nothing"
    elif not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    try:
        if DEV != "cuda":
            raise RuntimeError("dry run: no CUDA device")
        props = torch.cuda.get_device_properties(0)
        result["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                            "sms": props.multi_processor_count,
                            "memory_gb": round(props.total_memory / 2**30, 1),
                            "torch": torch.__version__, "cuda": torch.version.cuda}
    except Exception as exc:
        result["device"] = {"error": repr(exc)}
    torch.backends.cuda.matmul.allow_tf32 = True
    for name, cfg_kw, batch, timed, probe_s in models:
        if "--small" in argv and name != "small":
            continue
        if time.monotonic() - T0 > BUDGET_S:
            result[name] = {"skipped": "time budget"}
            continue
        try:
            result[name] = {}
            bench_model(result[name], name, cfg_kw, batch, timed, probe_s, out_dir)
        except Exception as exc:  # bench_model guards its sections; this is the last net
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    result["elapsed_s"] = round(time.monotonic() - T0, 1)
    checkpoint()
    print(json.dumps(_clean(result), indent=2, default=str, allow_nan=False))
    return 0


def _clean(obj: Any) -> Any:
    """NaN/inf become null so the output stays strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
