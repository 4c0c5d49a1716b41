#!/usr/bin/env python
"""GPU check: train a small and a large GPT on one CUDA device and print ONE JSON document.

For each model: step time without and with the probe (and their ratio), FLOPs per step counted by
torch's FlopCounterMode next to the PaLM estimate, MFU/HFU against the dense peak, NVML GPU-Util and
GPM activity (SM, tensor pipes, DRAM) while training, and the top kernels of a profiled step.

    python bench/gpu_check.py            # both models, < 5 min on one H200
    python bench/gpu_check.py --small    # the small model only
    python bench/gpu_check.py --cpu-dry-run   # tiny models on the CPU: exercises every section

Without CUDA it prints {"skipped": "no CUDA"} and exits 0. Every section runs in its own try/except
and records failures under "errors", so one broken part never hides the others' numbers.
bf16 autocast, fused AdamW, random tokens generated on the device (no input pipeline).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # run from anywhere: import flowtop/probe from this checkout

BUDGET_S = 240.0  # no new section starts after this; the slowest section fits in the remaining minute
# name, GPTConfig kwargs, batch, timed steps. "large" is ≈940 M parameters at 16 k tokens per step,
# "small" ≈7 M parameters at 1 k tokens (the shapes of design.md §7).
MODELS: tuple[tuple[str, dict[str, int], int, int], ...] = (
    ("small", dict(vocab_size=8192, n_layer=4, n_head=4, n_embd=256, block_size=256), 4, 100),
    ("large", dict(vocab_size=32768, n_layer=16, n_head=16, n_embd=2048, block_size=1024), 16, 20),
)
# --cpu-dry-run: the same code path with tiny shapes on the CPU (host timers, no NVML), so the
# script can be checked on a machine without a GPU before it is spent on one.
DRY_MODELS: tuple[tuple[str, dict[str, int], int, int], ...] = (
    ("small", dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64), 2, 5),
    ("large", dict(vocab_size=1024, n_layer=2, n_head=4, n_embd=128, block_size=128), 2, 3),
)
DEV = "cuda"
T0 = time.monotonic()


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
            traceback.format_exc(limit=4))[-1500:]
        return None
    if value is not None:
        result[key] = value
    return value


def load_gpt() -> tuple[Any, Any, str]:
    """The lead's demo GPT; a marked stand-in only if it cannot be imported."""
    try:
        from flowtop.demo.gpt import GPT, GPTConfig

        return GPT, GPTConfig, "flowtop.demo.gpt"
    except Exception:
        return _StandInGPT, _StandInConfig, "STAND-IN (flowtop.demo.gpt not importable)"


# ----- STAND-IN model: used only when flowtop.demo.gpt cannot be imported ------------------------
class _StandInConfig(dict):  # type: ignore[type-arg]
    """STAND-IN for flowtop.demo.gpt.GPTConfig."""

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        self.__dict__.update(kw)


def _StandInGPT(cfg: Any) -> Any:  # noqa: N802 - mirrors the class name it replaces
    """STAND-IN for flowtop.demo.gpt.GPT: pre-LN decoder, causal SDPA, GELU MLP, untied head."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg.n_embd
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, cfg.n_head, c // cfg.n_head).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = cfg
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

        def forward(self, idx: Any, targets: Any = None) -> Any:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            loss = None if targets is None else F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1))
            return logits, loss

    return Model()
# ----- end of STAND-IN ---------------------------------------------------------------------------


def sync() -> None:
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def time_steps(step: Callable[[], None], n: int) -> dict[str, float]:
    """Per-step device times from CUDA events between consecutive steps (ms)."""
    import torch

    sync()
    wall0 = time.perf_counter()
    if DEV == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
        events[0].record()
        for i in range(n):
            step()
            events[i + 1].record()
        events[-1].synchronize()
        per = [events[i].elapsed_time(events[i + 1]) for i in range(n)]
    else:
        marks = [time.perf_counter()]
        for _ in range(n):
            step()
            marks.append(time.perf_counter())
        per = [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
    wall = (time.perf_counter() - wall0) * 1e3 / n
    return {"median_ms": statistics.median(per), "mean_ms": statistics.fmean(per),
            "min_ms": min(per), "max_ms": max(per), "wall_ms": wall, "steps": n}


def telemetry_while(step: Callable[[], None], seconds: float) -> dict[str, Any]:
    """NVML/GPM readings (1 Hz, on a thread like the probe's sender) while training ``seconds``."""
    import torch

    from probe.telemetry import DeviceTelemetry

    tel = DeviceTelemetry(cuda_device_index=torch.cuda.current_device() if DEV == "cuda" else 0)
    samples: list[dict[str, Any]] = []
    stop = threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            samples.append(tel.sample())
            stop.wait(1.0)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    t_end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < t_end or steps == 0:
        step()
        steps += 1
        if steps % 10 == 0:
            sync()  # keep the CPU from queueing far ahead of the samples
    sync()
    stop.set()
    thread.join(timeout=5)
    tel.close()
    keys = ("gpu_util", "sm_active", "sm_occupancy", "tensor_active", "tensor_hmma",
            "dram_bw_util", "power_w", "sm_clock_mhz", "temp_c", "nvlink_tx_bytes_s")
    out: dict[str, Any] = {"samples": len(samples), "steps": steps}
    for key in keys:
        vals = [s[key] for s in samples[1:] if s.get(key) is not None]  # first: GPM not ready
        out[key] = statistics.fmean(vals) if vals else None
        if not vals and samples:
            out.setdefault("reasons", {})[key] = samples[-1]["reasons"].get(key)
    out["throttle"] = sorted({r for s in samples for r in (s.get("throttle") or [])})
    out["device_name"] = samples[-1].get("name") if samples else None
    return out


def top_kernels(step: Callable[[], None], steps: int = 3, top: int = 10) -> dict[str, Any]:
    """Kernels of ``steps`` profiled steps (CUDA activity only), by device time per step."""
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
            "top": [{"name": n[:160], "us_per_step": us, "calls_per_step": c,
                     "share": us / total if total else None} for us, c, n in rows[:top]]}


def bench_model(name: str, cfg_kw: dict[str, int], batch: int, timed: int) -> dict[str, Any]:
    """All sections for one model size."""
    import torch

    res: dict[str, Any] = {"config": dict(cfg_kw), "batch": batch,
                           "tokens_per_step": batch * cfg_kw["block_size"]}
    GPT, GPTConfig, source = load_gpt()
    res["model_source"] = source
    state: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        torch.manual_seed(0)
        with torch.device(DEV):  # initialise on the GPU: a 940 M model is slow to init on CPU
            model = GPT(GPTConfig(**cfg_kw))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=DEV == "cuda")
        x = torch.randint(0, cfg_kw["vocab_size"], (batch, cfg_kw["block_size"]), device=DEV)
        y = torch.randint(0, cfg_kw["vocab_size"], (batch, cfg_kw["block_size"]), device=DEV)

        def step() -> None:
            with torch.autocast(DEV, dtype=torch.bfloat16):
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        from probe.estimate import non_embedding_params

        state.update(model=model, opt=opt, step=step)
        return {"params": sum(p.numel() for p in model.parameters()),
                "non_embedding_params": non_embedding_params(model)}

    info = section(res, "model", build)
    if "step" not in state:
        return res
    step = state["step"]
    section(res, "warmup", lambda: time_steps(step, 10 if name == "small" else 5))
    base1 = section(res, "time_without_probe", lambda: time_steps(step, timed))

    def count() -> dict[str, Any]:
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step()
        sync()
        counted = float(counter.get_total_flops())
        out: dict[str, Any] = {"counted_flops_per_step": counted}
        if info:  # PaLM model FLOPs (full attention), the figure MFU uses
            from probe.estimate import transformer_flops_per_token

            per_token = transformer_flops_per_token(info["non_embedding_params"], cfg_kw["n_layer"],
                                                    cfg_kw["n_embd"], cfg_kw["block_size"])
            out["palm_flops_per_step"] = float(per_token * res["tokens_per_step"])
            out["counted_over_palm"] = counted / out["palm_flops_per_step"]
        return out

    flops = section(res, "flops", count)

    def with_probe() -> dict[str, Any]:
        import probe

        attached = probe.attach(job="gpu_check")
        try:
            warm = time_steps(step, 10 if name == "small" else 5)  # first steps count FLOPs
            timed_res = time_steps(step, timed)
        finally:
            probe.detach()
        return {"attached": attached, "warmup": warm, **timed_res}

    probed = section(res, "time_with_probe", with_probe)
    base2 = section(res, "time_without_probe_again", lambda: time_steps(step, timed))

    def overhead() -> dict[str, Any]:
        bases = [b for b in (base1, base2) if b]
        if not probed or not bases:
            raise RuntimeError("missing timings")
        med = statistics.fmean(b["median_ms"] for b in bases)
        mean = statistics.fmean(b["mean_ms"] for b in bases)
        return {"median_ratio": probed["median_ms"] / med, "mean_ratio": probed["mean_ms"] / mean,
                "without_median_ms": med, "with_median_ms": probed["median_ms"]}

    section(res, "probe_overhead", overhead)

    def mfu() -> dict[str, Any]:
        if not flops or not base1:
            raise RuntimeError("missing FLOPs or timing")
        from probe.peaks import lookup_peak

        name_ = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)"
        found, why = lookup_peak(name_, "bf16")  # dense bf16 peak, design.md §4
        peak = found.flops if found else None
        step_s = base1["median_ms"] / 1e3
        out: dict[str, Any] = {"device": name_, "peak_bf16_flops": peak,
                               "peak_source": found.source if found else why,
                               "counted_flops_per_s": flops["counted_flops_per_step"] / step_s}
        if peak:
            # the counter's figure is executed FLOPs (flash backward = 2.5× forward): HFU-like
            out["hfu_counted"] = out["counted_flops_per_s"] / peak
            if "palm_flops_per_step" in flops:
                out["mfu_palm"] = flops["palm_flops_per_step"] / step_s / peak
        return out

    section(res, "utilisation", mfu)
    step_s = (base1 or {}).get("median_ms", 10.0) / 1e3
    section(res, "telemetry", lambda: telemetry_while(step, max(4.0, min(8.0, 40 * step_s))))
    kern = section(res, "kernels", lambda: top_kernels(step))
    if kern and base1:
        kern["gpu_busy_fraction"] = kern["kernel_us_per_step"] / 1e3 / base1["median_ms"]
    state.clear()
    sync()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return res


def main(argv: list[str]) -> int:
    global DEV
    try:
        import torch
    except Exception as exc:
        print(json.dumps({"skipped": f"no torch: {exc}"}))
        return 0
    models = MODELS
    result: dict[str, Any] = {}
    if "--cpu-dry-run" in argv:
        DEV, models = "cpu", DRY_MODELS
        result["dry_run"] = "tiny models on the CPU; numbers mean nothing"
    elif not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        return 0
    try:
        if DEV != "cuda":
            raise RuntimeError("dry run: no CUDA device")
        props = torch.cuda.get_device_properties(0)
        result["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                            "memory_gb": round(props.total_memory / 2**30, 1),
                            "torch": torch.__version__, "cuda": torch.version.cuda}
    except Exception as exc:
        result["device"] = {"error": repr(exc)}
    torch.backends.cuda.matmul.allow_tf32 = True
    for name, cfg_kw, batch, timed in models:
        if "--small" in argv and name != "small":
            continue
        if time.monotonic() - T0 > BUDGET_S:
            result[name] = {"skipped": "time budget"}
            continue
        try:
            result[name] = bench_model(name, cfg_kw, batch, timed)
        except Exception as exc:  # bench_model guards its sections; this is the last net
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    result["elapsed_s"] = round(time.monotonic() - T0, 1)
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
