#!/usr/bin/env python
"""GPU check of issue 14 parts 4, 5, 7 (MoE, FP8 / precision-aware MFU, varlen): ONE JSON on stdout.

Sections, each in its own try/except (failures under "errors", the others still run):

* ``gemm``: a bf16 GEMM and an fp8 ``torch._scaled_mm`` (e4m3 × e4m3, per-tensor scales, bf16
  out), M = N = K = 8192 by default, each timed with CUDA events over a few repetitions; the
  probe's count per dtype against 2·M·N·K, torch's FlopCounterMode beside it, the achieved
  TFLOP/s of each dtype, and the monitor's MFU of the mixed step (each dtype against its own
  peak, the bf16-equivalent beside it) from the probe's real ``flops`` message.
* ``moe``: a training step of a bf16 MoE layer whose experts run as ``torch._grouped_mm`` (groups
  padded to multiples of 16 rows, uneven routing): the probe's count against the hand formula
  router 6·T·d·E + Σ_e 12·m_e·d·f, FlopCounterMode's figure, the tokens per expert recorded.
* ``scaled_grouped``: an fp8 ``torch._scaled_grouped_mm`` forward (row-wise scales): count against
  Σ_g 2·m_g·K·N and its dtype label.
* ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` forward + backward on two documents: model
  FLOPs against 3 · 4·H·Σ s_i²·D.
* ``packed_mask``: bf16 SDPA with a block-diagonal boolean mask (which CUDA kernel takes it, and
  whether the probe reads the documents from the bias it gets): model FLOPs against
  3 · 4·B·H·Σ s_i²·D, executed against the dense square.

    python bench/gpu_moe_fp8.py            # on the GPU machine (< 2 min on one H200)
    python bench/gpu_moe_fp8.py --cpu-dry-run   # the same code on small CPU shapes (bf16/fp8 on CPU)

Without CUDA (and no --cpu-dry-run) it prints {"skipped": "no CUDA"}. The figures are measured,
never assumed: a section that cannot run says why.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _p in (ROOT, os.path.join(ROOT, "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import torch  # noqa: E402

RESULT: dict[str, Any] = {"errors": {}}


def section(name: str) -> Callable[[Callable[[], dict[str, Any]]], None]:
    def run(fn: Callable[[], dict[str, Any]]) -> None:
        t0 = time.monotonic()
        try:
            RESULT[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one broken part must not hide the others
            RESULT["errors"][name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}"
        RESULT.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 2)
    return run


def timed(fn: Callable[[], Any], dev: str, reps: int) -> float:
    """Median seconds of ``fn`` (CUDA events on the GPU, host clock on the CPU)."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def probe_count(fn: Callable[[], Any], root: Any = None) -> Any:
    from probe.flops.counter import StepFlopCounter

    counter = StepFlopCounter(root=root)
    counter.start()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return counter.stop()


def torch_count(fn: Callable[[], Any]) -> int | str:
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as m:
            fn()
        return int(m.get_total_flops())
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"[:200]


def message(count: Any, dev: str, tokens: int = 0) -> dict[str, Any]:
    from probe.flops import accounting

    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    return accounting.flops_message(count, step=1, tokens=tokens, root=None, signature=(), device=torch.device(dev),
                                    device_name=name, flops_per_token=None, attention="full")


def main(dev: str, dry: bool) -> None:
    n = 256 if dry else 8192
    reps = 3 if dry else 10
    RESULT["device"] = torch.cuda.get_device_name() if dev == "cuda" else "cpu (dry run)"
    RESULT["torch"] = torch.__version__

    @section("gemm")
    def _gemm() -> dict[str, Any]:
        from flowtop.monitor.accounting import rank_flops
        from probe.wire import flops_report

        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        x8 = a.to(torch.float8_e4m3fn)
        w8 = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major second operand
        one = torch.tensor(1.0, device=dev)

        def bf16() -> Any:
            return a @ b

        def fp8() -> Any:
            return torch._scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        def both() -> None:
            bf16()
            fp8()

        hand = 2 * n * n * n
        t_bf16, t_fp8 = timed(bf16, dev, reps), timed(fp8, dev, reps)
        count = probe_count(both)
        msg = message(count, dev)
        step_s = t_bf16 + t_fp8
        view = rank_flops(flops_report(msg), step_time_s=step_s)
        return {
            "shape": n, "hand_flops_each": hand,
            "probe_by_dtype": count.model_by_dtype, "probe_matches_hand": count.model_by_dtype == {
                "bf16": hand, "fp8_e4m3": hand},
            "torch_flop_counter": {"bf16": torch_count(bf16), "fp8": torch_count(fp8)},
            "seconds": {"bf16": t_bf16, "fp8": t_fp8},
            "tflops": {"bf16": hand / t_bf16 / 1e12, "fp8": hand / t_fp8 / 1e12},
            "peak_by_dtype": msg["peak_by_dtype"], "peak_source": msg["peak_source"],
            "mfu_mixed_step": view.mfu, "mfu_bf16_equivalent": view.mfu_bf16, "mfu_reason": view.mfu_reason,
            "mfu_by_hand": (hand / msg["peak_by_dtype"]["bf16"] + hand / msg["peak_by_dtype"]["fp8_e4m3"]) / step_s
            if {"bf16", "fp8_e4m3"} <= set(msg["peak_by_dtype"]) else None,
        }

    @section("moe")
    def _moe() -> dict[str, Any]:
        from moe_helpers import hand_step_flops
        from probe.flops.moe import ExpertLoadRecorder
        from probe.flops.counter import StepFlopCounter
        import torch.nn.functional as F

        d, f, e, k, t = (64, 128, 8, 2, 512) if dry else (2048, 4096, 8, 2, 8192)
        torch.manual_seed(0)
        router = torch.nn.Linear(d, e, bias=False, device=dev, dtype=torch.bfloat16)
        w1 = torch.nn.Parameter(torch.randn(e, d, f, device=dev, dtype=torch.bfloat16) / d**0.5)
        w2 = torch.nn.Parameter(torch.randn(e, f, d, device=dev, dtype=torch.bfloat16) / f**0.5)
        skew = torch.linspace(2.0, 0.0, e, device=dev)
        x = torch.randn(t, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        counts_seen: list[list[int]] = []

        def step() -> None:
            weights, ids = (router(x).float() + skew).softmax(-1).topk(k, dim=-1)
            flat = ids.flatten()
            counts = torch.bincount(flat, minlength=e)
            padded = (counts + 15) // 16 * 16  # CUDA grouped GEMMs want 16-row aligned groups
            counts_seen.append(padded.tolist())
            order = flat.argsort(stable=True)
            buf = x.new_zeros(int(padded.sum()), d)
            starts = torch.cumsum(padded, 0) - padded
            rank_in = torch.arange(flat.numel(), device=dev) - (torch.cumsum(counts, 0) - counts)[flat[order]]
            rows = starts[flat[order]] + rank_in
            buf = buf.index_copy(0, rows, x.repeat_interleave(k, dim=0)[order])
            offs = torch.cumsum(padded, 0).to(torch.int32)
            h = torch._grouped_mm(F.silu(torch._grouped_mm(buf, w1, offs=offs)), w2, offs=offs)
            out = h.index_select(0, rows)
            back = torch.empty_like(out).index_copy(0, order, out)
            y = (back.view(t, k, d) * weights.to(back.dtype).unsqueeze(-1)).sum(1)
            y.float().square().mean().backward()

        counter, loads = StepFlopCounter(), ExpertLoadRecorder()
        counter.start()
        counter.on_groups = loads.on_groups
        step()
        if dev == "cuda":
            torch.cuda.synchronize()
        count = counter.stop()
        load = loads.stop()
        padded = counts_seen[-1]
        hand = hand_step_flops(t, d, f, e, padded)  # padding rows inside the groups are computed
        step_s = timed(step, dev, reps)
        return {
            "shape": {"d": d, "ffn": f, "experts": e, "top_k": k, "tokens": t},
            "tokens_per_expert_padded": padded, "recorded_load": load,
            "probe_model_flops": count.model_flops, "hand_flops": hand, "probe_matches_hand": count.model_flops == hand,
            "by_op": count.by_op, "by_dtype": count.model_by_dtype,
            "torch_flop_counter": torch_count(step), "step_s": step_s,
            "tflops": hand / step_s / 1e12,
        }

    @section("scaled_grouped")
    def _scaled_grouped() -> dict[str, Any]:
        g, kk, nn_ = 4, (64 if dry else 4096), (64 if dry else 4096)
        sizes = [16, 48, 0, 64] if dry else [1024, 3072, 512, 2560]
        m = sum(sizes)
        a = torch.randn(m, kk, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(g, nn_, kk, device=dev).to(torch.float8_e4m3fn).transpose(-2, -1)
        offs = torch.tensor(sizes, device=dev).cumsum(0).to(torch.int32)
        sa = torch.ones(m, device=dev, dtype=torch.float32)
        sb = torch.ones(g, nn_, device=dev, dtype=torch.float32)

        def run() -> Any:
            return torch._scaled_grouped_mm(a, b, sa, sb, offs=offs, out_dtype=torch.bfloat16)

        count = probe_count(run)
        hand = sum(2 * s * kk * nn_ for s in sizes)
        return {"sizes": sizes, "probe": count.model_flops, "hand": hand, "matches": count.model_flops == hand,
                "by_dtype": count.model_by_dtype, "torch_flop_counter": torch_count(run),
                "seconds": timed(run, dev, reps)}

    @section("varlen")
    def _varlen() -> dict[str, Any]:
        from torch.nn.attention.varlen import varlen_attn

        h, hd, docs = 8, 64, ([3, 7] if dry else [1000, 3000])
        total = sum(docs)
        q = torch.randn(total, h, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)
        cu = torch.tensor([0, *torch.tensor(docs).cumsum(0).tolist()], device=dev, dtype=torch.int32)

        def run() -> None:
            varlen_attn(q, q, q, cu, cu, max(docs), max(docs)).sum().backward()

        count = probe_count(run)
        pairs = sum(s * s for s in docs)
        hand = 3 * 4 * h * pairs * hd
        return {"docs": docs, "probe_model": count.model_flops, "hand_model": hand,
                "matches": count.model_flops == hand, "probe_executed": count.executed_flops,
                "by_op": count.by_op, "uncounted": count.uncounted, "torch_flop_counter": torch_count(run),
                "dense_square_would_be": 3 * 4 * h * total * total * hd}


def packed_mask(dev: str, dry: bool) -> dict[str, Any]:
    import torch.nn.functional as F

    b, h, hd, docs = (2, 4, 64, [5, 11]) if dry else (4, 16, 128, [1024, 3072])
    s = sum(docs)
    mask = torch.zeros(s, s, dtype=torch.bool, device=dev)
    start = 0
    for n in docs:
        mask[start:start + n, start:start + n] = True
        start += n
    q = torch.randn(b, h, s, hd, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def run() -> None:
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask).float().sum().backward()

    count = probe_count(run)
    pairs = sum(n * n for n in docs)
    return {"docs": docs, "probe_model": count.model_flops, "hand_model": 3 * 4 * b * h * pairs * hd,
            "matches": count.model_flops == 3 * 4 * b * h * pairs * hd, "probe_executed": count.executed_flops,
            "dense_square_model": 3 * 4 * b * h * s * s * hd, "by_op": count.by_op, "uncounted": count.uncounted}


if __name__ == "__main__":
    dry = "--cpu-dry-run" in sys.argv
    if not dry and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA"}))
        sys.exit(0)
    main("cpu" if dry else "cuda", dry)
    section("packed_mask")(lambda: packed_mask("cpu" if dry else "cuda", dry))
    print(json.dumps(RESULT, indent=1, default=str))
