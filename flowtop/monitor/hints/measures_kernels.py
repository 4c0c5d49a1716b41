"""Measures over the sampled kernel windows: communication, launch-bound, memory-bound, fp32
matmuls, unfused attention and optimizer, uneven kernels across ranks, the attention FLOP note."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from flowtop.monitor.hints import facts
from flowtop.monitor.hints.base import IdentityMemo, Measurement, clamp01, is_cuda, latest_ranks, rank_target, safe_div
from flowtop.monitor.hints.facts import KernelFacts
from flowtop.monitor.hints.measures_device import uncounted_by_op
from flowtop.monitor.hints.rules import Rule
from flowtop.monitor.kernels.aggregate import KernelStat
from flowtop.monitor.snapshot import ENDED, JobSnapshot, RankSnapshot


def _windows(job: JobSnapshot, cuda_only: bool = True) -> Iterable[tuple[RankSnapshot, KernelFacts | None]]:
    """(rank, its latest kernel window) for ranks still running (GPU windows when cuda_only)."""
    for r in latest_ranks(job):
        if r.status in ENDED:
            continue
        f = facts.kernel_facts(r.kernels)
        if cuda_only and f is not None and f.device != "cuda":
            continue  # a CPU window has no launches, tensor cores or device queue
        yield r, f


def _has(low: str, patterns: Iterable[str]) -> bool:
    """Whether a lower-cased name contains any of the (lower-case) patterns."""
    return any(p in low for p in patterns)


def _pct(part: float, whole: float) -> float:
    return 100.0 * safe_div(part, whole)


#: A rank's window measure: (rule, window) -> measurement at step 0, or (rule, window, step).
WindowFn = Callable[[Rule, KernelFacts], "Measurement | None"]
StepFn = Callable[[Rule, KernelFacts, int], "Measurement | None"]


def _per_window(fn: WindowFn) -> StepFn:
    """A rank's measure that reads only its window (and the rule): computed once per window and
    rule (memoized by identity, as the row scans below), then given the rank's step now. A
    window stays the same object for minutes while every rank is measured every round."""
    memo = IdentityMemo(fn)

    def measure(rule: Rule, f: KernelFacts, step: int) -> Measurement | None:
        m = memo(rule, f)
        return None if m is None else m._replace(step=step)

    return measure


def _comm(rule: Rule, f: KernelFacts) -> Measurement | None:
    if f.step_us <= 0:
        return None
    ev: dict[str, Any] = {
        "comm_pct": _pct(f.comm_us, f.step_us),
        "overlap_pct": _pct(f.comm_overlap_us, f.comm_us) if f.comm_us > 0 else None,
        "comm_us_per_step": f.comm_us / f.steps,
        "window_steps": f.steps,
    }
    exposed = safe_div(f.comm_us - f.comm_overlap_us, f.step_us)
    return Measurement(ev["comm_pct"], ev, clamp01(exposed), 0, steps_covered=f.steps)


def _launch(rule: Rule, f: KernelFacts) -> Measurement | None:
    if f.step_us <= 0 or not f.launches or f.short_kernels is None:
        return None
    busy = safe_div(f.busy_us, f.step_us)
    ev = {
        "busy_pct": 100.0 * busy,
        "idle_pct": 100.0 * (1.0 - min(busy, 1.0)),
        "short_kernel_pct": _pct(f.short_kernels, f.launches),
        "launches_per_step": f.launches / f.steps,
        "short_kernels_per_step": f.short_kernels / f.steps,
        "busy_us_per_step": f.busy_us / f.steps,
        "step_us": f.step_us / f.steps,
        "window_steps": f.steps,
    }
    return Measurement(ev["busy_pct"], ev, clamp01(1.0 - busy), 0, steps_covered=f.steps)


def _memory(rule: Rule, f: KernelFacts) -> Measurement | None:
    if f.kernel_us <= 0:
        return None
    cats = tuple(rule.params["categories"])
    parts = sorted(((c, f.category_us.get(c, 0.0)) for c in cats), key=lambda kv: (-kv[1], kv[0]))
    mem = sum(us for _, us in parts)
    ev = {
        "memory_pct": _pct(mem, f.kernel_us),
        "memory_us_per_step": mem / f.steps,
        "kernel_us_per_step": f.kernel_us / f.steps,
        "window_steps": f.steps,
    }
    top = ", ".join(f"{c} {_pct(us, f.kernel_us):.0f} %" for c, us in parts[:3] if us > 0)
    return Measurement(ev["memory_pct"], ev, clamp01(safe_div(mem, f.step_us)), 0, steps_covered=f.steps,
                       text={"top_categories": top})


_comm_of, _launch_of, _memory_of = _per_window(_comm), _per_window(_launch), _per_window(_memory)


def _each_window(rule: Rule, job: JobSnapshot, of: StepFn) -> dict[str, Measurement | None]:
    return {rank_target(r): None if f is None else of(rule, f, r.step) for r, f in _windows(job)}


def comm_exposed(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: communication kernel time ÷ step, and how much of it compute hides."""
    return _each_window(rule, job, _comm_of)


def launch_bound(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per GPU rank: device busy share of the step, and the share of kernels shorter than a launch."""
    return _each_window(rule, job, _launch_of)


def memory_bound(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per GPU rank: share of kernel time in memory-bound categories."""
    return _each_window(rule, job, _memory_of)


def _fp32_gemm(row: KernelStat, params: Any) -> bool:
    return _has(row.low, params["fp32_patterns"]) and not _has(row.low, params["tensor_patterns"])


# Row scans depend only on (rule, window): memoized, since a window stays the same object for
# many snapshots and a job may have a thousand ranks.

def _scan_fp32(rule: Rule, f: KernelFacts) -> tuple[float, float, str | None]:
    """(matmul µs, fp32 non-tensor-core matmul µs, the largest such kernel's short name)."""
    gemm = [k for k in f.rows if k.category == "gemm"]
    fp32 = [k for k in gemm if _fp32_gemm(k, rule.params)]
    top = max(fp32, key=lambda k: k.total_us).short if fp32 else None
    return sum(k.total_us for k in gemm), sum(k.total_us for k in fp32), top


def _scan_attention(rule: Rule, f: KernelFacts) -> tuple[int, int, int, float]:
    """(forward softmax calls, matmul calls, attention calls, forward softmax µs)."""
    p = rule.params
    soft = [k for k in f.rows if _has(k.low, p["softmax_patterns"])
            and not _has(k.low, p["exclude_patterns"]) and not _has(k.low, p["backward_patterns"])]
    # Attention's matmuls are batched (scores, weighted sum): a row that is itself a plain
    # matmul operator (a CPU window's aten::addmm of a Linear: an MoE router's before its
    # softmax) is not counted. A GPU kernel's row is not an operator: one cuBLAS kernel name
    # serves mm, addmm and bmm alike and the row names only the op with the most time, so all
    # its calls count (else attention's bmm calls on a Linear's kernel went uncounted; a review).
    plain = p["unbatched_ops"]
    gemm = sum(k.calls for k in f.rows if k.category == "gemm" and k.name not in plain)
    return (sum(k.calls for k in soft), gemm,
            sum(k.calls for k in f.rows if k.category == "attention"), sum(k.total_us for k in soft))


def _scan_optimizer(rule: Rule, f: KernelFacts) -> tuple[float, int, int]:
    """(per-tensor optimizer µs, their calls, fused/multi-tensor optimizer calls)."""
    p = rule.params
    per_tensor = [k for k in f.rows if k.category != "optimizer"
                  and (k.op in p["per_tensor_ops"] or k.name in p["per_tensor_ops"])]
    fused = [k for k in f.rows if k.category == "optimizer" and _has(k.low, p["fused_patterns"])]
    return sum(k.total_us for k in per_tensor), sum(k.calls for k in per_tensor), sum(k.calls for k in fused)


_fp32_memo = IdentityMemo(_scan_fp32)
_attention_memo = IdentityMemo(_scan_attention)
_optimizer_memo = IdentityMemo(_scan_optimizer)


def fp32_matmul(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per GPU rank: share of matmul time in fp32 non-tensor-core kernels (or an fp32 FLOP dtype)."""
    p = rule.params
    out: dict[str, Measurement | None] = {}
    for r in latest_ranks(job):
        if r.status in ENDED or not is_cuda(r):
            continue
        f = facts.kernel_facts(r.kernels)
        f = f if f is not None and f.device == "cuda" else None
        dtype = r.flops.dtype if r.flops is not None else None
        if f is None and dtype is None:
            out[rank_target(r)] = None
            continue
        gemm_us, fp32_us, fp32_top = _fp32_memo(rule, f) if f else (0.0, 0.0, None)
        by_kernels = _pct(fp32_us, gemm_us)
        by_dtype = 100.0 if dtype == "fp32" else 0.0
        ev: dict[str, Any] = {
            "fp32_gemm_pct": max(by_kernels, by_dtype),
            "fp32_gemm_by_kernels_pct": by_kernels if f else None,
            "fp32_gemm_us_per_step": fp32_us / f.steps if f else None,
            "gemm_us_per_step": gemm_us / f.steps if f else None,
            "dtype": dtype,
            "fp32_kernel": fp32_top,
        }
        if f and gemm_us > 0:
            impact = safe_div(max(fp32_us, gemm_us * by_dtype / 100.0), f.step_us) * float(p["saving"])
        else:
            impact = float(p["default_impact"])
        via = []
        if by_kernels > 0:
            via.append("by kernel names")
        if by_dtype > 0:
            via.append("FLOP count dtype fp32")
        out[rank_target(r)] = Measurement(
            ev["fp32_gemm_pct"], ev, clamp01(impact), r.step, steps_covered=f.steps if f else 1,
            text={"via": "; " + " and ".join(via) if via else ""},
        )
    return out


def attention_unfused(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: forward softmax kernels per step while no attention kernel ran."""
    out: dict[str, Measurement | None] = {}
    for r, f in _windows(job, cuda_only=False):
        if f is None:
            out[rank_target(r)] = None
            continue
        soft_n, gemm_n, attn_n, soft_us = _attention_memo(rule, f)
        soft_calls, gemm_calls, attn_calls = soft_n / f.steps, gemm_n / f.steps, attn_n / f.steps
        ev = {
            "softmax_calls_per_step": soft_calls,
            "gemm_calls_per_step": gemm_calls,
            "attention_calls_per_step": attn_calls,
            "gemm_per_softmax": safe_div(gemm_calls, soft_calls) if soft_calls else None,
            "softmax_pct_of_step": _pct(soft_us, f.step_us),
            "window_steps": f.steps,
        }
        # Lower bound of the time at stake: the softmax passes over the score matrix themselves.
        out[rank_target(r)] = Measurement(
            soft_calls, ev, clamp01(safe_div(soft_us, f.step_us)), r.step, steps_covered=f.steps
        )
    return out


def optimizer_unfused(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: time in per-tensor optimizer kernels, when no fused/multi-tensor kernel ran."""
    out: dict[str, Measurement | None] = {}
    for r, f in _windows(job, cuda_only=False):
        if f is None or f.step_us <= 0:
            out[rank_target(r)] = None
            continue
        opt_us, opt_calls, fused_calls = _optimizer_memo(rule, f)
        ev = {
            "optimizer_pct": _pct(opt_us, f.step_us),
            "optimizer_calls_per_step": opt_calls / f.steps,
            "fused_calls_per_step": fused_calls / f.steps,
            "optimizer_us_per_step": opt_us / f.steps,
            "window_steps": f.steps,
        }
        out[rank_target(r)] = Measurement(
            ev["optimizer_pct"], ev, clamp01(safe_div(opt_us, f.step_us)), r.step, steps_covered=f.steps
        )
    return out


def uneven_kernel(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per kernel (ranks merged): (max − min) ÷ mean of its time across ranks."""
    # One window per rank is one moment per rank, taken at different steps: wait for a few.
    merged = job.kernels_merged
    if merged is None or merged.min_windows < int(rule.params["min_windows"]):
        return {}
    step_us = merged.mean_step_us
    out: dict[str, Measurement | None] = {}
    for k in merged.kernels[: int(rule.params["max_rows"])]:  # most uneven (max - min µs) first
        if len(k.per_rank_us) < 2 or k.mean_us <= 0:
            continue
        diff = k.max_us - k.min_us
        ev: dict[str, Any] = {
            "spread_pct": 100.0 * k.spread,
            "step_share_pct": _pct(diff, step_us),
            # the difference's standard error (the two ranks' scatter over their windows), % of it
            "noise_pct": 100.0 * k.noise_us / diff if diff > 0 else 100.0,
            "slowest_rank": k.max_rank,
            "fastest_rank": k.min_rank,
            "max_us": k.max_us,
            "min_us": k.min_us,
            "mean_us": k.mean_us,
            "kernel": k.name,
            "category": k.category,
            "window_steps": 1,
        }
        m = Measurement(ev["spread_pct"], ev, clamp01(safe_div(diff, step_us)), job.step, steps_covered=1)
        prev = out.get(k.short)
        if prev is None or prev.impact < m.impact:  # two full names can share a short name
            out[k.short] = m
    return out


def attention_flops_note(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: the largest share of kernel time in fused attention among the ranks' windows."""
    uncounted = uncounted_by_op(job) or {}
    words = ("attention", "sdpa", "flash")
    if any(_has(name.lower(), words) for name in uncounted):
        return {"": Measurement(0.0, {"attention_pct": 0.0}, 0.0, job.step)}  # uncounted_ops says it
    shares = [facts.category_share_of_busy(f, "attention") for _, f in _windows(job)]
    known = [s for s in shares if s is not None]
    if not known:
        return {"": None}
    ev = {"attention_pct": 100.0 * max(known), "window_steps": 1}
    return {"": Measurement(ev["attention_pct"], ev, 0.0, job.step, steps_covered=1)}
