"""Measures over device telemetry (clocks, GPU-Util vs MFU, memory) and FLOP accounting."""

from __future__ import annotations

from typing import Any

from flowtop.monitor.hints import facts
from flowtop.monitor.hints.base import (
    Measurement,
    clamp01,
    finite,
    latest_ranks,
    rank_target,
    safe_div,
    telemetry_number,
)
from flowtop.monitor.hints.rules import RULES_BY_ID, Rule
from flowtop.monitor.snapshot import ENDED, FlopsView, JobSnapshot, RankSnapshot

_GIB = float(1 << 30)


def _live(job: JobSnapshot) -> list[RankSnapshot]:
    return [r for r in latest_ranks(job) if r.status not in ENDED]


def _reasons(r: RankSnapshot) -> list[str]:
    """Active clock-event reasons (the probe sends a list of names)."""
    value = r.telemetry.device.get("throttle") if r.telemetry is not None else None
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in value or () if v]


def power_limited(hits: list[str], power_w: float | None, limit_w: float | None,
                  frac: float | None = None) -> bool:
    """Only the software power cap holds the clocks down, and the GPU draws near its limit
    (``frac`` of it; the throttling rule's ``power_limit_frac`` by default): power-limited, as
    dense tensor-core work makes a GPU, not a cooling problem or a fault. ``hits``: the active
    reasons the rule watches (:func:`watched_reasons`)."""
    if frac is None:
        frac = RULES_BY_ID["throttling"].params["power_limit_frac"]
    return bool(hits == ["sw_power_cap"] and power_w is not None and limit_w and power_w >= frac * limit_w)


def watched_reasons(r: RankSnapshot, watched: Any = None) -> list[str]:
    """The rank's active clock-event reasons that the throttling rule counts (power/thermal)."""
    if watched is None:
        watched = RULES_BY_ID["throttling"].params["reasons"]
    return [x for x in _reasons(r) if x in watched]


def throttling(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per GPU rank: SM clock as a share of its max clock, and the power/thermal reasons."""
    out: dict[str, Measurement | None] = {}
    watched = tuple(rule.params["reasons"])
    for r in _live(job):
        clock = telemetry_number(r, "sm_clock_mhz")
        top = telemetry_number(r, "sm_clock_max_mhz")
        if clock is None or not top:
            out[rank_target(r)] = None
            continue
        hits = [x for x in _reasons(r) if x in watched]
        ev: dict[str, Any] = {
            "clock_pct": 100.0 * clock / top,
            "sm_clock_mhz": clock,
            "sm_clock_max_mhz": top,
            "power_thermal_reasons": len(hits),
            "reasons": hits,
            "temp_c": telemetry_number(r, "temp_c"),
            "power_w": telemetry_number(r, "power_w"),
            "power_limit_w": telemetry_number(r, "power_limit_w"),
        }
        at_limit = power_limited(hits, ev["power_w"], ev["power_limit_w"], rule.params["power_limit_frac"])
        out[rank_target(r)] = Measurement(
            value=ev["clock_pct"],
            evidence=ev,
            impact=clamp01(1.0 - clock / top),
            step=r.step,
            text={"reasons": ", ".join(hits) or "no power/thermal reason"},
            severity="info" if at_limit else None,
            variant="power_limit" if at_limit else "",
        )
    return out


def util_vs_mfu(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per rank: MFU in percent while NVML's GPU-Util reads high."""
    out: dict[str, Measurement | None] = {}
    for r in _live(job):
        if r.status != "live":  # a stalled or silent rank has MFU 0 by definition: the hang hints speak
            out[rank_target(r)] = None
            continue
        util = telemetry_number(r, "gpu_util")  # NVML percent
        mfu = r.mfu
        if util is None or not finite(mfu):
            out[rank_target(r)] = None
            continue
        tensor = telemetry_number(r, "tensor_active")  # GPM, percent of time
        ev: dict[str, Any] = {
            "mfu_pct": 100.0 * float(mfu),
            "gpu_util_pct": util,
            "tensor_active_pct": tensor,
            "sm_active_pct": telemetry_number(r, "sm_active"),
            "dtype": r.flops.dtype if r.flops is not None else None,
        }
        note = f"; tensor cores are active {tensor:.0f} % of the time" if tensor is not None else ""
        out[rank_target(r)] = Measurement(
            value=ev["mfu_pct"],
            evidence=ev,
            # Share of the step that reaching the threshold MFU would save.
            impact=clamp01(1.0 - safe_div(ev["mfu_pct"], rule.threshold)),
            step=r.step,
            text={"tensor_note": note},
        )
    return out


def memory_full(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Per GPU rank: device memory used ÷ total."""
    out: dict[str, Measurement | None] = {}
    for r in _live(job):
        used = telemetry_number(r, "mem_used")
        total = telemetry_number(r, "mem_total")
        if used is None or not total:
            out[rank_target(r)] = None
            continue
        ev = {"mem_used_pct": 100.0 * used / total, "mem_used_gib": used / _GIB, "mem_total_gib": total / _GIB}
        out[rank_target(r)] = Measurement(value=ev["mem_used_pct"], evidence=ev, impact=0.0, step=r.step)
    return out


def _job_flops(job: JobSnapshot) -> FlopsView | None:
    """The job's FLOP view, else the first rank's that has one."""
    if job.flops is not None:
        return job.flops
    for r in latest_ranks(job):
        if r.flops is not None:
            return r.flops
    return None


def uncounted_by_op(job: JobSnapshot) -> dict[str, int] | None:
    """Uncounted op -> calls in one counted step, the largest over the ranks (the job's FlopsView
    sums ranks); None while no rank has a FLOP count."""
    views = [r.flops for r in latest_ranks(job) if r.flops is not None] or ([job.flops] if job.flops else [])
    if not views:
        return None
    out: dict[str, int] = {}
    for v in views:
        for name, n in dict(v.uncounted_ops).items():
            if finite(n) and n > 0:
                out[str(name)] = max(out.get(str(name), 0), int(n))
    return out


def _op_key(name: str) -> str:
    return str(name).replace("::", ".")  # the probe says "aten.x", profiler rows "aten::x"


def uncounted_share(job: JobSnapshot, ops: dict[str, int]) -> tuple[float | None, str]:
    """(percent, basis): the largest share over the ranks that the uncounted ops take of a step.

    Basis "flop_size": the probe's FLOP-like size of those ops (probe.flops.uncounted, a rough
    bound from shapes) ÷ (counted model FLOPs + that size). Else "kernel_time": the kernels those
    ops launched ÷ all kernel time of the rank's latest kernel window. (None, "unknown") when
    neither is known (a probe that sends no sizes, and no window)."""
    names = {_op_key(k) for k in ops}
    by_size: list[float] = []
    by_time: list[float] = []
    for r in latest_ranks(job):
        f = r.flops
        if f is not None and f.uncounted_ops:
            sizes = {_op_key(k): v for k, v in dict(f.uncounted_size).items() if finite(v)}
            if all(_op_key(k) in sizes for k in f.uncounted_ops):  # a probe that sizes them
                size = sum(sizes.values())
                total = size + (f.model_flops_per_step or 0.0)
                by_size.append(100.0 * size / total if total > 0 else 0.0)
        kf = facts.kernel_facts(r.kernels)
        if kf is not None and kf.kernel_us > 0:
            # the table's columns: a rank's every evaluation, no KernelStat made for each kernel
            mine = sum(us for op, us in zip(kf.rows.ops, kf.rows.total_us) if op and _op_key(op) in names)
            if mine > 0:
                by_time.append(100.0 * mine / kf.kernel_us)
    if by_size:
        return max(by_size), "flop_size"
    if by_time:
        return max(by_time), "kernel_time"
    return None, "unknown"


def uncounted_ops(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: the share of a step taken by ops the FLOP counter had no formula for, in percent
    (largest over the ranks; see :func:`uncounted_share`). An unknown share counts as the whole
    step (100): without a size the ops might be anything, as before sizes were sent."""
    ops = uncounted_by_op(job)
    if ops is None:
        return {"": None}
    calls = sum(ops.values())
    top = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    share, basis = uncounted_share(job, ops) if ops else (0.0, "flop_size")
    ev: dict[str, Any] = {
        "uncounted_pct": share,
        "share_basis": basis,
        "uncounted_calls": calls,
        "uncounted_types_n": len(ops),
        "uncounted_ops": dict(top[:10]),
        "uncounted_time_pct": None,
    }
    words = tuple(rule.params["attention_words"])
    severity = None
    note = ""
    if any(w in name.lower() for name in ops for w in words):
        # The one uncounted kind we can map to kernel time: attention ops -> attention kernels.
        shares = [facts.category_share_of_busy(facts.kernel_facts(r.kernels), "attention") for r in latest_ranks(job)]
        known = [s for s in shares if s is not None]
        if known:
            ev["uncounted_time_pct"] = 100.0 * max(known)
            note = f"; those attention ops run {ev['uncounted_time_pct']:.0f} % of GPU time"
            if ev["uncounted_time_pct"] >= float(rule.params["significant_pct"]):
                severity = "warning"
    weight = {"flop_size": " of the step's FLOPs (a size bound from shapes)",
              "kernel_time": " of kernel time"}.get(basis, "")
    text = {"ops": ", ".join(f"{k} ×{v}" for k, v in top[:3]) + (" …" if len(top) > 3 else ""), "share_note": note,
            "share": f", ≈{share:.1f} %{weight}" if share is not None else ""}
    value = share if share is not None else (100.0 if calls else 0.0)
    return {"": Measurement(value=float(value), evidence=ev, impact=0.0, step=job.step, text=text, severity=severity)}


def estimate_mismatch(rule: Rule, job: JobSnapshot, now: float) -> dict[str, Measurement | None]:
    """Job: |counted model FLOPs ÷ transformer estimate − 1| in percent."""
    flops = _job_flops(job)
    ratio = flops.estimate_ratio if flops is not None else None
    if flops is None or ratio is None:
        return {"": None}
    ev: dict[str, Any] = {
        "estimate_gap_pct": 100.0 * abs(ratio - 1.0),
        "estimate_ratio": ratio,
        "counted_flops_per_step": flops.model_flops_per_step,
        "estimated_flops_per_step": flops.estimated_flops_per_step,
    }
    text = {
        "direction_word": "below" if ratio < 1.0 else "above",
        "estimate_source": flops.estimate_source or "6·N + 12·L·d·T",
    }
    return {"": Measurement(value=ev["estimate_gap_pct"], evidence=ev, impact=0.0, step=job.step, text=text)}
