"""A kernel window's raw records, read from the profiler's event list: the ``names``/``ops``/``acts``
fields of the ``kernels`` message (:mod:`probe.wire`), times in µs from the window start.

Apart from the sampler (:mod:`probe.kernels.windows`), which decides when to profile and what a
window cost: this is the copy of Kineto's events into wire records, the one part that depends on
what each torch release's events expose (``activity_type()`` or not) and on the wire's limits.
"""

from __future__ import annotations

import math
from typing import Any

from probe.wire import (
    ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_RUNTIME, KERNEL_MAX_DIMS, KERNEL_MAX_INPUTS, KERNEL_MAX_LIST,
    KERNEL_MAX_NAME, KERNEL_MAX_STR, is_runtime_call,
)

__all__ = ["might_have_formula", "records_from_kineto"]

_DEVICE = {"kernel": ACT_KERNEL, "gpu_memcpy": ACT_MEMCPY, "gpu_memset": ACT_MEMSET}
_RUNTIME = ("cuda_runtime", "cuda_driver")
try:
    from torch._C._autograd import DeviceType as _DeviceType

    _CPU: Any = _DeviceType.CPU
except Exception:  # a torch without it has no Kineto events to read either
    _CPU = None

#: Substrings of every operator name with a FLOP formula on the monitor (mm, bmm, addmm, mv, dot,
#: linear, matmul, convolution, the fused attentions).  A cheap superset test instead of a copy of
#: the table: an operator that passes only costs the probe its shapes; one that fails loses FLOPs,
#: which a test guards against (test_kernels_opflops).
FORMULA_HINTS = ("mm", "mv", "dot", "linear", "matmul", "conv", "attention")


def might_have_formula(name: str) -> bool:
    """Whether operator ``name`` may have a FLOP formula (its input shapes are then sent)."""
    return name.startswith("aten::") and any(s in name for s in FORMULA_HINTS)


def _dims(shapes: Any) -> list[list[int]]:
    """Input dims within the wire's limits; a shape that does not fit becomes ``[]`` (unknown)."""
    out: list[list[int]] = []
    for s in list(shapes)[:KERNEL_MAX_INPUTS]:
        ok = isinstance(s, list) and len(s) <= KERNEL_MAX_DIMS and all(
            type(d) is int and 0 <= d < 2**62 for d in s)
        out.append(s if ok else [])
    return out


def _scalar(v: Any) -> Any:
    """One concrete input as a wire value, None for anything the wire does not carry."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v if len(v) <= KERNEL_MAX_STR else None
    if isinstance(v, list) and len(v) <= KERNEL_MAX_LIST and all(
            isinstance(i, int) and -(2**63) <= i < 2**63 for i in v):
        return v
    return None


def _activity_type(e: Any) -> str:
    return str(e.activity_type())


def _activity_type_compat(e: Any) -> str:
    """Kineto's activity category for torch releases whose events lack ``activity_type()``
    (torch ≤ 2.11), from what those events do expose (seen on an H200 with torch 2.11).

    Annotations first: a ``record_function`` range ("Optimizer.step#AdamW.step") also appears on
    the device as a ``gpu_user_annotation`` spanning its kernels, and counting it as a kernel
    would double their time. A device event is then a kernel unless its name says memcpy/memset.
    On the host, an event linked to an operator is a runtime or driver call, and so is one named
    like a CUDA API call even without a link (``cudaEventQuery`` inside a ``record_function``
    range, ``cudaDeviceSynchronize``): sent as an operator, its CUPTI correlation id would pass
    for an operator's id and collide with a real one. CUPTI's own overhead records ("Command
    Buffer Full") carry no id at all, or are known by name (CUPTI_OVERHEAD). The rest are operators.
    """
    if getattr(e, "is_user_annotation", lambda: False)():
        return "user_annotation"
    name = e.name()
    if e.device_type() != _CPU:
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset"):
            return "gpu_memset"
        return "kernel"
    if e.linked_correlation_id() > 0 or is_runtime_call(name):
        return "cuda_runtime"
    if e.correlation_id() == 0 or name in CUPTI_OVERHEAD:
        return "overhead"
    return "cpu_op"


#: The names Kineto gives CUPTI's overhead records. Most carry no id; "Activity Buffer Request"
#: came with one on an H200 (torch 2.11, CUDA 13): sent as an operator, a kernel whose External
#: id it shared was linked to it instead of its aten operator.
CUPTI_OVERHEAD = frozenset({
    "Activity Buffer Request", "Buffer Flush", "Command Buffer Full", "Driver Compiler", "Instrumentation",
    "Lazy Function Loading", "Resource", "Runtime Triggered Module Loading", "Unknown", "UVM DMA Mapping"})


def records_from_kineto(events: Any, trace_start_ns: int) -> dict[str, Any]:
    """The ``names``/``ops``/``acts`` wire fields from ``prof.profiler.kineto_results.events()``.

    For a Kineto (device or runtime) event ``correlation_id()`` is the CUPTI correlation and
    ``linked_correlation_id()`` the External id of the operator it belongs to; for an operator
    ``correlation_id()`` *is* its External id.  Shapes and concrete inputs are read only for
    operators that :func:`might_have_formula` (reading them is the costly part).
    """
    names: dict[str, int] = {}
    hint: dict[str, bool] = {}
    ops: list[list[Any]] = []
    acts: list[list[Any]] = []
    t0 = trace_start_ns  # subtract in integer ns: epoch ns as a float is only good to ~256 ns
    activity = None
    for e in events:
        if activity is None:
            activity = _activity_type if hasattr(e, "activity_type") else _activity_type_compat
        cat = activity(e)
        if cat == "cpu_op":
            name = e.name()
            idx = names.setdefault(name, len(names))
            wanted = hint.get(name)
            if wanted is None:
                wanted = hint[name] = might_have_formula(name)
            dims = concrete = None
            if wanted:
                dims = _dims(e.shapes())
                concrete = [_scalar(v) for v in list(e.concrete_inputs())[:KERNEL_MAX_INPUTS]]
            ops.append([idx, e.start_thread_id(), (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3,
                        e.correlation_id(), dims, concrete])
        elif cat in _DEVICE or cat in _RUNTIME:
            name = e.name()
            idx = names.setdefault(name, len(names))
            kind = _DEVICE.get(cat, ACT_RUNTIME)
            acts.append([idx, kind, (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3,
                         e.device_resource_id() if kind != ACT_RUNTIME else -1, e.linked_correlation_id(),
                         e.correlation_id()])
    # Long templated kernel names are cut to the wire's limit (two that then collide share a row).
    return {"names": [s[:KERNEL_MAX_NAME] for s in names], "ops": ops, "acts": acts}
