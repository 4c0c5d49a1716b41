"""Kernel windows from a torch.profiler Chrome trace (``flowtop analyze``, the tests' fixtures). No Textual.

Split from :mod:`flowtop.monitor.kernels.trace`, which defines the window and builds it from
profiler records (:func:`~flowtop.monitor.kernels.trace.build_window`): here a Chrome trace's
events are read into those records, so that a trace and a probe's window are linked, attributed
and counted by the one builder.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flowtop.monitor.kernels.trace import (
    DEVICE_KINDS,
    MEMCPY,
    MEMSET,
    KERNEL,
    RUNTIME,
    ActivityRecord,
    KernelWindow,
    OpRecord,
    TraceError,
    build_window,
)

_DEVICE_CATS = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
_RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


def window_from_chrome(trace: Mapping[str, Any]) -> KernelWindow:
    """A window from a parsed torch.profiler Chrome trace.

    Kept: ``cpu_op``, ``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``cuda_runtime``/``cuda_driver``.
    Dropped: ``gpu_user_annotation`` (ranges such as ``Optimizer.step#AdamW.step`` on the GPU
    timeline — counting them would double the time of the kernels they enclose),
    ``user_annotation``, python functions and profiler overhead.  The step is the span of the
    ``ProfilerStep#N`` annotations when present (all of them: a multi-step trace is one window),
    else the extent of the kept events.
    """
    raw = trace.get("traceEvents")
    if not isinstance(raw, list):
        raise TraceError("not a Chrome trace: no traceEvents list")
    steps = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X"
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    ops: list[OpRecord] = []
    acts: list[ActivityRecord] = []
    for e in _complete_events(raw):
        cat, args = e["cat"], e.get("args") or {}
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        ext = _int(args.get("External id"))
        if cat == "cpu_op" and not e["name"].startswith("ProfilerStep#"):
            ops.append(OpRecord(e["name"], (e.get("pid"), e.get("tid")), start, end, ext,
                                args.get("Input Dims"), args.get("Concrete Inputs")))
        elif cat in _DEVICE_CATS:
            stream = _int(args.get("stream", e.get("tid")), -1)
            acts.append(ActivityRecord(e["name"], _DEVICE_CATS[cat], start, end, stream, ext,
                                       _int(args.get("correlation"))))
        elif cat in _RUNTIME_CATS:
            acts.append(ActivityRecord(e["name"], RUNTIME, start, end, -1, ext, _int(args.get("correlation"))))
    if steps:
        lo = min(float(s["ts"]) for s in steps)
        hi = max(float(s["ts"]) + float(s.get("dur", 0)) for s in steps)
        ops = [o for o in ops if o.end > lo and o.start < hi]
        acts = [a for a in acts if a.end > lo and a.start < hi or a.kind in DEVICE_KINDS and a.start >= lo]
    else:
        spans = [(o.start, o.end) for o in ops] + [(a.start, a.end) for a in acts]
        if not spans:
            raise TraceError("the trace holds no operator or kernel events")
        lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    has_device = any(a.kind in DEVICE_KINDS for a in acts) or bool(trace.get("deviceProperties"))
    return build_window(ops, acts, origin=lo, step_dur_us=hi - lo, device="cuda" if has_device else "cpu")


def _int(value: Any, default: int = 0) -> int:
    """``value`` as an int (a trace's ids and streams may be strings), ``default`` when it is none."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _complete_events(raw: Iterable[Any]) -> Iterable[dict[str, Any]]:
    """The complete ("X") events of the kept categories with a name, a start and a duration."""
    keep = {"cpu_op", *_DEVICE_CATS, *_RUNTIME_CATS}
    for e in raw:
        if (isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in keep
                and isinstance(e.get("name"), str) and isinstance(e.get("ts"), (int, float))
                and isinstance(e.get("dur"), (int, float))):
            yield e


def load_trace(path: str | Path) -> KernelWindow:
    """Read a Chrome trace (``.json`` or ``.json.gz``); raises :class:`TraceError` when unreadable."""
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = fh.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        trace = json.loads(data)
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"cannot read {p}: {exc}") from None
    if not isinstance(trace, dict):
        raise TraceError(f"{p} is not a Chrome trace (top level is not an object)")
    return window_from_chrome(trace)
