"""Precision-aware MFU: each op's FLOPs against the dense peak of its own dtype. No Textual.

Issue 14 part 5. The probe sends model and executed FLOPs per operand dtype label
(``flops_by_dtype``: bf16, fp16, tf32, fp32, fp8_e4m3, fp8_e5m2, …) and the device's dense peak
for each label (``peak_by_dtype``; probe.flops.precision). Conventions (README "FP8, MoE and precision"):

* **MFU** = ideal time ÷ step time, ideal time = Σ_d F_d / peak_d: the time the step's model
  FLOPs would take if every op ran at the dense peak of its own dtype. Written as a rate,
  MFU = model FLOP/s ÷ P_mix with the *mix peak* ``P_mix = F / Σ_d (F_d / peak_d)`` (a harmonic
  mean of the peaks weighted by FLOPs), which is what ``peak_flops`` holds then. A step all in
  one dtype gets exactly the old figure (its dtype's peak). HFU likewise with executed FLOPs.
* **bf16-equivalent MFU** = model FLOP/s ÷ the bf16 peak: every FLOP as if it ran in bf16 (what
  most trainers print; an fp8 step can read above 100 % there, which is why it is labelled and
  shown beside the other, never instead of it).
* A dtype with FLOPs but no dense peak on the device (say fp64 on a GPU) leaves MFU unknown, with
  the dtype and its share named: no peak is borrowed from another dtype or device.
* ``--peak-tflops`` (the monitor's override) replaces every dtype's peak with its one figure.
* Job: Σ model FLOP/s ÷ Σ P_mix of the ranks (as for one dtype: a slow rank is not hidden).

flowtop.monitor.accounting is the only caller: one place computes MFU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from probe.wire import FlopsReport

BF16 = "bf16"
CONVENTION = ("MFU = ideal time / step time, ideal time = sum over dtypes of model FLOPs / that dtype's dense peak; "
              "bf16-equivalent = model FLOP/s / the bf16 dense peak")


@dataclass(frozen=True)
class DtypeMix:
    """FLOPs per dtype of a counted step and the peaks they are measured against."""

    model_flops: Mapping[str, float]  # per step, per dtype label
    executed_flops: Mapping[str, float]
    peaks: Mapping[str, float]  # dense peak per label, FLOP/s (job: Σ over ranks)
    peak_flops: float | None  # P_mix of the model FLOPs: F / Σ F_d/peak_d (None: a dtype lacks a peak)
    executed_peak_flops: float | None  # the same over executed FLOPs (HFU)
    bf16_peak_flops: float | None  # the bf16-equivalent figure's peak
    missing: tuple[str, ...] = ()  # labels with FLOPs and no peak
    convention: str = CONVENTION
    shares: Mapping[str, float] = field(default_factory=dict)  # model FLOP share per label (0..1)


def _mix_peak(flops: Mapping[str, float], peaks: Mapping[str, float]) -> float | None:
    total = sum(v for v in flops.values() if v > 0)
    if total <= 0:
        return None
    ideal = 0.0
    for label, f in flops.items():
        if f <= 0:
            continue
        peak = peaks.get(label)
        if not peak:
            return None
        ideal += f / peak
    return total / ideal if ideal > 0 else None


def mix_of(msg: FlopsReport, peak_override: float | None = None) -> DtypeMix | None:
    """The rank's :class:`DtypeMix` from its ``flops`` message (None: an older probe, or no
    costed op named a dtype: the single-dtype figures stand)."""
    by_dtype = msg.flops_by_dtype
    if not by_dtype:
        return None
    model = {k: v.model for k, v in by_dtype.items()}
    executed = {k: v.executed for k, v in by_dtype.items()}
    if sum(model.values()) <= 0 and sum(executed.values()) <= 0:
        return None
    labels = set(model) | {BF16}
    if peak_override:
        peaks = {k: float(peak_override) for k in labels}
    else:
        peaks = {k: v for k, v in msg.peak_by_dtype.items() if v}
    total = sum(model.values())
    missing = tuple(sorted(k for k in model if (model[k] > 0 or executed[k] > 0) and not peaks.get(k)))
    return DtypeMix(
        model_flops=model,
        executed_flops=executed,
        peaks={k: v for k, v in peaks.items() if k in model or k == BF16},
        peak_flops=_mix_peak(model, peaks),
        executed_peak_flops=_mix_peak(executed, peaks),
        bf16_peak_flops=peaks.get(BF16),
        missing=missing,
        shares={k: v / total for k, v in model.items()} if total > 0 else {},
    )


def missing_reason(mix: DtypeMix, source: str = "") -> str:
    """Why a mix has no MFU: the dtypes without a dense peak and their share of the FLOPs, and what
    the rank said of its peak (``source``: no table entry, an override it could not read)."""
    parts = [f"{k} ({mix.shares.get(k, 0.0):.1%} of model FLOPs)" for k in mix.missing]
    said = f" ({source})" if source else ""
    return f"no dense peak for {', '.join(parts)} on this device{said}; use --peak-tflops"


def job_mix(mixes: Sequence[DtypeMix | None]) -> DtypeMix | None:
    """Σ over ranks: FLOPs per dtype, peaks (P_mix and the bf16 peak summed like the ranks' peaks)."""
    if not mixes or any(m is None for m in mixes):
        return None
    ms = [m for m in mixes if m is not None]

    def sums(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in ms:
            for k, v in getattr(m, name).items():
                out[k] = out.get(k, 0.0) + v
        return out

    def total(name: str) -> float | None:
        vals = [getattr(m, name) for m in ms]
        return sum(vals) if all(v for v in vals) else None

    model = sums("model_flops")
    all_flops = sum(model.values())
    return DtypeMix(
        model_flops=model,
        executed_flops=sums("executed_flops"),
        peaks=sums("peaks"),
        peak_flops=total("peak_flops"),
        executed_peak_flops=total("executed_peak_flops"),
        bf16_peak_flops=total("bf16_peak_flops"),
        missing=tuple(sorted({k for m in ms for k in m.missing})),
        shares={k: v / all_flops for k, v in model.items()} if all_flops > 0 else {},
    )


def label(mix: DtypeMix | None) -> str:
    """Short text of a mix for the UI: "bf16 92% · fp32 8%"."""
    if mix is None or not mix.shares:
        return ""
    items = sorted(mix.shares.items(), key=lambda kv: -kv[1])
    return " · ".join(f"{k} {v:.0%}" if v >= 0.005 else f"{k} <1%" for k, v in items)


def bf16_eq_differs(mix: DtypeMix | None, mfu_bf16: float | None) -> bool:
    """Whether a rank's bf16-equivalent MFU says something its MFU does not: it has one, and
    FLOPs in a dtype other than bf16 (fp8 work reads higher there, fp32 lower). The rank
    table and ``flowtop snapshot`` show it beside MFU for a job with such a rank."""
    return mix is not None and mfu_bf16 is not None and any(
        share > 0 for name, share in mix.shares.items() if name != BF16)
