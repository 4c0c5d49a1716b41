"""Kernel windows: the compact window, built from profiler records (probe wire or Chrome trace).

A *window* is one profiled training step.  The probe sends the profiler's *raw records* (message
kind ``kernels``, validated by :mod:`probe.wire`), times in µs from the window start::

    names: list[str]     string table; every ``name`` below is an index into it
    ops:   list[list]    host operator calls [name, thread, start_us, end_us, ext, dims, concrete]
    acts:  list[list]    device activities and runtime calls
                         [name, kind, start_us, end_us, stream, ext, corr]
    step_dur_us, device ("cuda" | "cpu"), window, step, cost_s, typical_step_us (optional)

``ext`` is the External id linking an operator to what it launched (0: none), ``corr`` the CUPTI
correlation of a launch call and its device activity; ``dims``/``concrete`` are the recorded input
shapes and concrete inputs, present only on operators that may have a FLOP formula.
:func:`window_from_wire` turns them into a :class:`KernelWindow` with :func:`build_window` — the
same builder :func:`flowtop.monitor.kernels.chrome.load_trace` uses for a torch.profiler Chrome
trace (``flowtop analyze``), so linking, attribution and FLOP formulas
(:mod:`flowtop.monitor.kernels.opflops`) live in one place.

The compact window (:class:`KernelWindow`) holds ``names`` (string table) and ``events``, each
``(name, kind, ts_us, dur_us, stream, op, flops)``.

``kind``: 0 kernel, 1 memcpy, 2 memset, 3 cpu_op (host operator), 4 runtime (``cudaLaunchKernel``,
``cuLaunchKernelEx``, ``cudaMemsetAsync``, ``cudaDeviceSynchronize`` ...).  ``ts_us`` is relative
to the window start, ``stream`` is the CUDA stream (−1 on the host).  ``flops`` is a float, −1 when
unknown.  The meaning of ``op`` depends on the kind:

* device events (0, 1, 2): the name index of the host operator that launched it, −1 if none.  Of
  the operators enclosing the launch, the *innermost one with a FLOP formula* is chosen
  (:mod:`flowtop.monitor.kernels.opflops`): a cuDNN attention kernel is linked by the profiler to
  ``aten::_cudnn_attention_forward``, which has no formula, so it is attributed to its parent
  ``aten::_scaled_dot_product_cudnn_attention``; a GEMM under ``aten::linear → aten::matmul →
  aten::mm`` goes to ``aten::mm`` (the innermost, exact shapes).  When no enclosing operator has
  a formula, the launching (innermost) operator is kept.  The operator call's FLOPs all go to
  the *longest* kernel attributed to it, where its arithmetic runs: the flash kernel of cuDNN's
  attention backward, not the small ``dot(dO, O)`` and ``dQ`` conversion kernels it also
  launches; the GEMM of a split-K matmul, not its reduction.  Its other kernels get −1.
* cpu_op (3): −1; ``flops`` is the call's FLOPs when it counts (see opflops), else −1.  Only the
  operators needed are kept: top-level operators (per thread) and operators named by a device
  event's ``op``.
* runtime (4): the *event index* of the device event this call launched (same CUPTI
  correlation), −1 for calls that launched nothing.

On a CPU-only window there is no device queue: the operators are the work.  Each operator call
then yields one kind-0 event on stream −1 whose duration is its *exclusive* (self) time, so the
table adds up without double counting (``aten::linear`` does not also count its ``aten::addmm``);
attribution and FLOPs follow the rules above (the convolution's FLOPs land on the
``aten::mkldnn_convolution`` call doing the work below ``aten::_convolution``, its longest slice);
kind 3 holds the top-level operators only, whose union is the busy time.

Events are ordered by (ts, kind, name).  The window starts at the profiler start (probe) or at
the first kept event or ``ProfilerStep#`` annotation (Chrome trace).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from flowtop.monitor.kernels.opflops import COMPOSITE_OPS, FORMULA_OPS, op_flops
from flowtop.monitor.sanitize import printable
from probe.wire import ACT_CPU_OP, ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_RUNTIME, is_runtime_call

# The wire's record kinds (one definition, probe.wire.kernels), under the names this package reads.
KERNEL, MEMCPY, MEMSET, CPU_OP, RUNTIME = ACT_KERNEL, ACT_MEMCPY, ACT_MEMSET, ACT_CPU_OP, ACT_RUNTIME
DEVICE_KINDS = (KERNEL, MEMCPY, MEMSET)


class TraceError(ValueError):
    """A trace file or wire window that cannot be read."""


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One event of a window (see the module docstring for ``op``)."""

    name: int
    kind: int
    ts_us: float
    dur_us: float
    stream: int
    op: int
    flops: float


@dataclass(frozen=True)
class KernelWindow:
    """One profiled step in the compact format."""

    names: tuple[str, ...]
    events: tuple[KernelEvent, ...]
    step_dur_us: float
    device: str
    step: int | None = None
    window: int | None = None
    cost_s: float | None = None
    #: Typical *unprofiled* step wall time, when known (the profiler inflates host time).
    typical_step_us: float | None = None


def window_from_wire(fields: Mapping[str, Any]) -> KernelWindow:
    """The window of a probe's ``kernels`` message (its raw records, see the module docstring).

    Raises :class:`TraceError` for fields that do not hold together — an index that points
    nowhere, an unknown kind — even when each field passed the wire's own checks.
    """
    try:
        names = fields["names"]
        if not isinstance(names, list) or not all(isinstance(s, str) for s in names):
            raise ValueError("names is not a list of strings")
        # Kernel names reach the terminal (printable); interned, the ranks' windows share them.
        names = [sys.intern(printable(s)) for s in names]
        device = fields["device"]
        if device not in ("cuda", "cpu"):
            raise ValueError(f"unknown device {device!r:.20}")
        step_dur = _finite(fields["step_dur_us"])
        ops = [_op_record(names, i, o) for i, o in enumerate(fields["ops"])]
        # A probe on torch ≤ 2.11 sent CUDA API calls made outside any operator as operators,
        # with their CUPTI correlation id where an operator's id belongs (probe.kernels.records): drop
        # them, or a kernel could be attributed to "cudaStreamIsCapturing".
        if device == "cuda":
            ops = [o for o in ops if not is_runtime_call(o.name)]
        acts = [_act_record(names, i, a) for i, a in enumerate(fields["acts"])]
        step, window, cost = fields.get("step"), fields.get("window"), fields.get("cost_s")
        typical = fields.get("typical_step_us")
        extra: dict[str, Any] = {
            "step": int(step) if step is not None else None,
            "window": int(window) if window is not None else None,
            "cost_s": float(cost) if cost is not None else None,
            "typical_step_us": float(typical) if typical else None,
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(f"malformed kernel window: {exc}") from None
    return replace(build_window(ops, acts, origin=0.0, step_dur_us=step_dur, device=device), **extra)


def _finite(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{v!r:.20} is not a finite number")
    return float(v)


def _index(v: Any, size: int, what: str) -> int:
    if type(v) is not int or not 0 <= v < size:  # a negative index would read from the end
        raise ValueError(f"{what} {v!r:.20} out of range (0..{size - 1})")
    return v


def _op_record(names: list[str], i: int, o: Any) -> OpRecord:
    if not isinstance(o, (list, tuple)) or len(o) != 7:
        raise ValueError(f"op {i} is not a list of 7 fields")
    name, thread, start, end, ext, dims, concrete = o
    if type(thread) is not int or type(ext) is not int:
        raise ValueError(f"op {i}: thread and ext must be integers")
    return OpRecord(names[_index(name, len(names), f"op {i}: name index")], thread,
                    _finite(start), _finite(end), ext, dims, concrete)


def _act_record(names: list[str], i: int, a: Any) -> ActivityRecord:
    if not isinstance(a, (list, tuple)) or len(a) != 7:
        raise ValueError(f"activity {i} is not a list of 7 fields")
    name, kind, start, end, stream, ext, corr = a
    if kind not in (*DEVICE_KINDS, RUNTIME) or type(kind) is not int:
        raise ValueError(f"activity {i}: unknown kind {kind!r:.20}")
    if type(stream) is not int or type(ext) is not int or type(corr) is not int:
        raise ValueError(f"activity {i}: stream, ext and corr must be integers")
    return ActivityRecord(names[_index(name, len(names), f"activity {i}: name index")], kind,
                          _finite(start), _finite(end), stream, ext, corr)


# --- building a window from profiler records ---------------------------------------------------

@dataclass(frozen=True, slots=True)
class OpRecord:
    """A host operator call: ``ext`` is its External id, ``thread`` its thread key."""

    name: str
    thread: Any
    start: float
    end: float
    ext: int
    dims: Any = None
    concrete: Any = None


@dataclass(frozen=True, slots=True)
class ActivityRecord:
    """A device event (kind 0–2) or runtime call (kind 4); ``ext`` links it to an operator."""

    name: str
    kind: int
    start: float
    end: float
    stream: int
    ext: int
    corr: int


def build_window(
    ops: list[OpRecord],
    activities: list[ActivityRecord],
    *,
    origin: float,
    step_dur_us: float,
    device: str,
) -> KernelWindow:
    """The compact window of one step (times in µs on any common clock, ``origin`` = step start)."""
    ops = sorted(ops, key=lambda o: (str(o.thread), o.start, -o.end))
    n = len(ops)
    parent = [-1] * n
    stacks: dict[Any, list[int]] = defaultdict(list)
    for i, o in enumerate(ops):
        stack = stacks[o.thread]
        while stack and ops[stack[-1]].end <= o.start:
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    below_formula = [False] * n  # some descendant has a formula: an operator above it must not count
    for i, o in enumerate(ops):
        if o.name in FORMULA_OPS:
            p = parent[i]
            while p != -1 and not below_formula[p]:
                below_formula[p] = True
                p = parent[p]

    # Only the innermost operator with a formula counts: aten::convolution over
    # aten::_convolution (both with formulas) must not count the same work twice.
    counts = [(o.name in FORMULA_OPS or o.name in COMPOSITE_OPS) and not below_formula[i] for i, o in enumerate(ops)]
    # The innermost counting operator enclosing each call (itself included), -1 when none; a
    # parent sorts before its children, so one pass suffices (hostile nesting stays linear).
    counting = [-1] * n
    for i in range(n):
        counting[i] = i if counts[i] else (counting[parent[i]] if parent[i] != -1 else -1)

    flops_of: dict[int, float | None] = {}

    def op_flops_of(i: int) -> float | None:
        if i not in flops_of:
            flops_of[i] = op_flops(ops[i].name, ops[i].dims or [], ops[i].concrete) if counts[i] else None
        return flops_of[i]

    def attribute(i: int) -> int:
        return counting[i] if counting[i] != -1 else i

    # (name, kind, start, dur, stream, op index or -1, corr)
    work: list[tuple[str, int, float, float, int, int, int]] = []
    if device == "cpu":
        child_time = [0.0] * n
        for i, o in enumerate(ops):
            if parent[i] != -1:
                child_time[parent[i]] += o.end - o.start
        for i, o in enumerate(ops):
            work.append((o.name, KERNEL, o.start, max(0.0, o.end - o.start - child_time[i]), -1, attribute(i), -1))
    else:
        by_ext = {o.ext: i for i, o in enumerate(ops) if o.ext}
        runtime_ext = {a.corr: a.ext for a in activities if a.kind == RUNTIME and a.corr and a.ext}
        for a in activities:
            if a.kind in DEVICE_KINDS:
                launcher = by_ext.get(a.ext or runtime_ext.get(a.corr, 0), -1)
                op = attribute(launcher) if launcher != -1 else -1
                work.append((a.name, a.kind, a.start, max(0.0, a.end - a.start), a.stream, op, a.corr))

    # On the CPU a formula operator's own body does its arithmetic (its children are bookkeeping:
    # resolve_conj, empty, as_strided): its FLOPs stay on its own unit, one per op in op order. By
    # the longest unit, a child that was preempted under load took them (a matmul's on aten::empty).
    own = {i for i in range(n) if counts[i] and ops[i].name in FORMULA_OPS} if device == "cpu" else set()
    work_flops = assign_flops([(w[3], w[2], w[0], -1 if w[5] in own else w[5]) for w in work], op_flops_of)
    for i in own:
        f = op_flops_of(i)
        work_flops[i] = -1.0 if f is None else f

    rows: list[tuple[float, int, str, float, int, int, float, int]] = []  # ts, kind, name, dur, stream, op, flops, corr
    for w, f in zip(work, work_flops):
        rows.append((w[2] - origin, w[1], w[0], w[3], w[4], w[5], f, w[6]))
    emitted = {i for i, o in enumerate(ops) if parent[i] == -1}
    if device != "cpu":
        emitted.update(w[5] for w in work if w[5] != -1)
    for i in emitted:
        o = ops[i]
        fl = op_flops_of(i)
        rows.append((o.start - origin, CPU_OP, o.name, max(0.0, o.end - o.start), -1, -1,
                     -1.0 if fl is None else fl, -1))
    if device != "cpu":
        for a in activities:
            if a.kind == RUNTIME:
                rows.append((a.start - origin, RUNTIME, a.name, max(0.0, a.end - a.start), -1, -1, -1.0, a.corr))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))

    names: dict[str, int] = {}

    def intern(s: str) -> int:
        return names.setdefault(s, len(names))

    device_at = {r[7]: i for i, r in enumerate(rows) if r[1] in DEVICE_KINDS and r[7] > 0}
    events = []
    for ts, kind, name, dur, stream, op, f, corr in rows:
        if kind == RUNTIME:
            link = device_at.get(corr, -1) if corr > 0 else -1
        else:
            link = intern(ops[op].name) if op != -1 else -1
        events.append(KernelEvent(intern(name), kind, ts, dur, stream, link, f))
    return KernelWindow(tuple(names), tuple(events), step_dur_us, device)


def assign_flops(work: list[tuple[float, float, str, int]], op_flops_of: Any) -> list[float]:
    """FLOPs per unit of work ``(dur, start, name, op index)``: each operator call's FLOPs go to
    its longest unit (ties: earliest, then by name); the others get −1."""
    out = [-1.0] * len(work)
    best: dict[int, int] = {}
    for k, (dur, start, name, op) in enumerate(work):
        if op != -1:
            b = best.get(op)
            if b is None or (-dur, start, name) < (-work[b][0], work[b][1], work[b][2]):
                best[op] = k
    for op, k in best.items():
        total = op_flops_of(op)
        if total is not None:
            out[k] = total
    return out
