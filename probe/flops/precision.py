"""Compute precision of counted ops, and the per-dtype figures of the ``flops`` message.

Issue 14 part 5 (precision-aware MFU). Every costed op (GEMM, convolution, attention) carries
the dtype of its operands, named by :func:`dtype_label`:

* ``bf16``, ``fp16``, ``fp32``, ``fp64``, ``int8``;
* ``tf32``: an fp32 matmul (or cuDNN convolution) on CUDA while TF32 is allowed — the tensor
  cores then run it at the TF32 rate, so that is the peak it is measured against;
* ``fp8_e4m3`` / ``fp8_e5m2``: float8 operands (``_scaled_mm``, ``_scaled_grouped_mm``; the
  ``fnuz`` variants of AMD parts get the same labels). A GEMM mixing the two formats (the
  gradient GEMMs of the hybrid recipe: e5m2 gradients × e4m3 weights) is labelled by the e5m2
  operand; both run at the same fp8 tensor rate, the label only says which format was there.

The probe sends model and executed FLOPs per label (``flops_by_dtype``) and the dense peak of
each label on this device (``peak_by_dtype``, from :mod:`probe.flops.peaks`; a label with no peak is
left out, never filled from another dtype or device). The monitor turns them into MFU against
each op's own peak (flowtop.monitor.precision). Pure bookkeeping: no torch import at module level
beyond dtype objects, never raises into training (callers guard).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from probe.flops import peaks

#: Op kinds whose fp32 form may run as TF32 on CUDA (probe.flops.opcost.MATMUL / CONV).
_MATMUL, _CONV = "matmul", "conv"

_LABELS: dict[Any, str] = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
    torch.int8: "int8", torch.uint8: "int8",
}
for _name, _label in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e4m3fnuz", "fp8_e4m3"),
                      ("float8_e5m2", "fp8_e5m2"), ("float8_e5m2fnuz", "fp8_e5m2")):
    if hasattr(torch, _name):  # older torch lacks some of them
        _LABELS[getattr(torch, _name)] = _label

#: The dtype the "bf16-equivalent" MFU is taken against (what torchtitan and most trainers
#: report: every FLOP against the bf16 tensor peak, whatever precision it ran in).
BF16 = "bf16"


def dtype_label(dtype: torch.dtype, device_type: str, kind: str, tf32_matmul: bool, tf32_conv: bool) -> str:
    """Name the compute precision of an op: fp32 matmuls/convs on CUDA with TF32 allowed are "tf32"."""
    if dtype == torch.float32 and device_type == "cuda":
        if (kind == _MATMUL and tf32_matmul) or (kind == _CONV and tf32_conv):
            return "tf32"
    label = _LABELS.get(dtype)
    if label is None:
        label = str(dtype).replace("torch.", "")[:16]  # the wire's limit for a dtype name
    return label


def is_fp8(dtype: Any) -> bool:
    """Whether ``dtype`` is one of torch's float8 formats."""
    return str(dtype).replace("torch.", "").startswith("float8")


def fp8_operand(a: Any, b: Any) -> Any:
    """The operand that names a scaled GEMM's precision: the e5m2 one when the two differ."""
    if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor) and a.dtype != b.dtype:
        if "e5m2" in str(b.dtype):
            return b
    return a


def scaled_to(by_dtype: Mapping[str, int], total: int) -> dict[str, int]:
    """Per-dtype model FLOPs scaled to a window's bounded total (probe.flops.window.cap_backward).

    The bound removes recompute hidden in a compiled backward; it cannot say in which dtype
    that recompute ran, so every dtype keeps its share of the bounded total."""
    tallied = sum(by_dtype.values())
    if tallied <= 0 or tallied == total:
        return dict(by_dtype)
    return {k: int(round(v * total / tallied)) for k, v in by_dtype.items()}


@functools.lru_cache(maxsize=64)
def _cpu_peak(label: str, cores: float) -> peaks.Peak:
    """The CPU estimate (reads /proc/cpuinfo and psutil: kept off every counted step after the first)."""
    return peaks.cpu_peak(label, cores=cores)


def message_fields(
    model_by_dtype: Mapping[str, int],
    executed_by_dtype: Mapping[str, int],
    *,
    on_cpu: bool,
    device_name: str,
    cpu_cores: float,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``flops_by_dtype`` ({label: [model, executed]}) and ``peak_by_dtype`` ({label: FLOP/s}).

    Peaks come from the same resolution as the message's single ``peak_flops`` (the override
    ``FLOWTOP_PEAK_TFLOPS`` first, then the CPU estimate for this rank's cores, then the GPU
    table) for every label that has FLOPs, plus bf16 for the bf16-equivalent figure. A label
    without a dense peak on this device is simply absent from ``peak_by_dtype``: the monitor
    then reports no precision-aware MFU and names the label. ``peak_by_dtype_kind`` says where the
    peaks in ``peak_by_dtype`` come from (their ``Peak.kind``; "mixed" where they differ, as a
    per-dtype override beside table rows)."""
    labels = sorted(set(model_by_dtype) | set(executed_by_dtype))[:32]
    flops = {k[:16]: [float(model_by_dtype.get(k, 0)), float(executed_by_dtype.get(k, 0))] for k in labels}
    peak_of: dict[str, float] = {}
    kinds: set[str] = set()
    for label in (*labels, BF16):
        peak, _ = peaks.resolve_peak("cpu" if on_cpu else device_name, label, dict(environ) if environ else None)
        if peak is not None and on_cpu and not peak.source.startswith("override"):
            peak = _cpu_peak(label, cpu_cores)
        if peak is not None:
            peak_of[label[:16]] = float(peak.flops)
            kinds.add(peak.kind)
    # Where those peaks come from, in one word (wire 1.4): the step dtype's ``peak_kind`` speaks
    # only of ``peak_flops``, and the mix may have peaks where the step dtype has none.
    kind = {"peak_by_dtype_kind": kinds.pop() if len(kinds) == 1 else "mixed"} if kinds else {}
    return {"flops_by_dtype": flops, "peak_by_dtype": peak_of, **kind}
