"""Kernel top-list and step anatomy of one window, ranks merged, and a cumulative table.

Definitions (the UI and ``flowtop analyze`` show these numbers; kernel names: docs/design.md):

* *device work*: kernels, memcpy and memset (kinds 0–2).  On a CPU window the work is the
  operators' exclusive time (see :mod:`flowtop.monitor.kernels.trace`).
* *step*: the profiled step's host wall time — unless the device work of the window spans
  longer (a GPU-bound job: the host queues the step and moves on, on an H200 a 180 ms step was
  queued in 75 ms), then the span from its first start to its last end. ``step_basis`` says which.
* *share*: a kernel's summed device time ÷ the step.
* *busy*: the length of the UNION of device-work intervals over all streams (two streams running
  at once count once); on a CPU window the union of the top-level operators. *idle* = step −
  busy, the sum of the gaps (the step span covers all of the window's work).
* *communication*: union of communication kernels; *overlap*: its intersection with the union of
  all other kernels (compute hiding the transfer).
* *launches*: device events in the window (each one is one launch call).
* *short kernels*: device time shorter than the runtime call that launched it (linked by
  correlation, kind 4); when a kernel's launch call is not in the window, shorter than
  :data:`SHORT_KERNEL_FALLBACK_US` — a typical launch cost, since below it the GPU finishes sooner
  than the host can feed it.
* *idle gaps*: the largest stretches of the step with no device work, with the host operators or
  runtime calls that overlapped them most (what the host was doing while the GPU waited).
* *achieved TFLOP/s*: attributed FLOPs ÷ the device time of the calls that carry FLOPs.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flowtop.monitor.kernels.classify import CATEGORIES, classify, short_name
# A window's kernel rows and their table live in .table (re-exported: the records' one import).
from flowtop.monitor.kernels.table import KernelStat as KernelStat
from flowtop.monitor.kernels.table import KernelTable as KernelTable
from flowtop.monitor.kernels.table import Rows
from flowtop.monitor.kernels.table import _setstate_interned
from flowtop.monitor.kernels.trace import CPU_OP, DEVICE_KINDS, KERNEL, RUNTIME, KernelWindow

SHORT_KERNEL_FALLBACK_US = 5.0
TOP_GAPS = 5
GAP_HOST_OPS = 3


@dataclass(frozen=True, slots=True)  # a window holds them as columns (Rows), made as read
class CategoryStat:
    """Totals of one category in a window."""

    __setstate__ = _setstate_interned

    category: str
    calls: int
    total_us: float
    share: float
    flops: float | None


@dataclass(frozen=True, slots=True)  # a window holds them as columns (Rows), made as read
class IdleGap:
    """A stretch of the step with no device work."""

    __setstate__ = _setstate_interned

    start_us: float
    dur_us: float
    host_ops: tuple[str, ...]


@dataclass(frozen=True, slots=True)  # a rank each: no __dict__ for the collector to walk
class StepAnatomy:
    """Where the step's wall time went on the device."""

    step_us: float
    busy_us: float
    idle_us: float
    busy_frac: float | None
    comm_us: float
    comm_overlap_us: float
    comm_overlap_frac: float | None
    launches: int | None
    short_kernels: int | None
    short_kernel_us: float | None
    short_note: str
    gaps: Sequence[IdleGap]  # Rows as _anatomy builds them (a tuple made by hand)
    flops: float | None
    tflops: float | None  # attributed FLOPs ÷ the step (host wall time, or the device span)
    #: Typical unprofiled step (when the probe knows it) and the busy share against it:
    #: the profiler stretches host time, not kernel time, so this is the better estimate
    #: of how busy the device is in steps nobody profiles.
    typical_step_us: float | None = None
    busy_frac_typical: float | None = None
    #: "host": the step is the profiled step's host wall time; "device": its device work
    #: spanned longer than that (the GPU ran behind the host), so the step is that span.
    step_basis: str = "host"


class WeakSlotted:
    """Base of a slotted record that stays weakly referenceable (the hints' memos key on windows,
    flowtop.monitor.hints.base.IdentityMemo; dataclass's own weakref_slot needs Python 3.11, and
    mypy checks for 3.10)."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True, slots=True)  # a rank each: no __dict__ for the collector to walk
class KernelWindowStats(WeakSlotted):
    """Aggregate of one window: kernels largest first, categories, anatomy."""

    device: str
    step: int | None
    window: int | None
    step_us: float
    kernels: Sequence[KernelStat]  # a KernelTable as aggregate builds it (a tuple made by hand)
    categories: Sequence[CategoryStat]  # Rows as aggregate builds them (a tuple made by hand)
    anatomy: StepAnatomy
    cost_s: float | None


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals."""
    return sum(e - s for s, e in merge_intervals(intervals))


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint cover of the intervals (touching ones merged)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def intersection_length(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Overlap of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def step_span(window: KernelWindow) -> tuple[float, float, str]:
    """``(origin, length, basis)`` of the step a window's shares are taken against.

    The host wall time of the profiled step from the window's start. A CPU window's last operator
    may end after the host clock stopped: the step stretches to it. Device work that runs past the
    host's end moves the step to end with it, still lasting the host time — or the device span,
    from the first device work to the last, when that is longer (the GPU ran behind the host;
    basis "device"). Kernels the previous step had queued are not in the window (launched before
    the profiler started), so that span starts with this step's first kernel."""
    kinds = (CPU_OP,) if window.device == "cpu" else DEVICE_KINDS
    work = [(e.ts_us, e.ts_us + e.dur_us) for e in window.events if e.kind in kinds]
    host = window.step_dur_us
    if not work:
        return 0.0, host, "host"
    first = min(s for s, _ in work)
    last = max(e for _, e in work)
    if window.device == "cpu" or last <= host:
        return 0.0, max(host, last), "host"
    # Device work ran past the host's end: the step ends with it and lasts the host time, or the
    # device span when that is longer (a GPU behind the host). Continuous as the tail grows.
    length = max(host, last - first)
    return last - length, length, "device" if last - first > host else "host"


def aggregate(window: KernelWindow) -> KernelWindowStats:
    """Top list, categories and anatomy of one window."""
    names, events = window.names, window.events
    span = step_span(window)
    step = span[1]
    work = [e for e in events if e.kind in DEVICE_KINDS]
    per: dict[int, list] = {}  # name -> [calls, total, flops, flops_us, Counter(op -> us), calls with flops]
    for e in work:
        row = per.setdefault(e.name, [0, 0.0, 0.0, 0.0, Counter(), 0])
        row[0] += 1
        row[1] += e.dur_us
        if e.flops >= 0:
            row[2] += e.flops
            row[3] += e.dur_us
            row[5] += 1
        if e.op >= 0:
            row[4][e.op] += e.dur_us
    kernels = []
    for idx, (calls, total, flops, flops_us, ops, with_flops) in per.items():
        name = names[idx]
        kernels.append(KernelStat(
            name=name,
            short=sys.intern(short_name(name)),
            category=classify(name),
            calls=calls,
            total_us=total,
            share=total / step if step > 0 else 0.0,
            flops=flops if with_flops else None,
            tflops=flops / flops_us / 1e6 if flops_us > 0 else None,
            op=names[max(sorted(ops), key=lambda o: ops[o])] if ops else "",
        ))
    kernels.sort(key=lambda k: (-k.total_us, k.name))

    cats: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, False])
    for k in kernels:
        c = cats[k.category]
        c[0] += k.calls
        c[1] += k.total_us
        if k.flops is not None:
            c[2] += k.flops
            c[3] = True
    categories = Rows(CategoryStat, sorted(
        (CategoryStat(cat, c[0], c[1], c[1] / step if step > 0 else 0.0, c[2] if c[3] else None)
         for cat, c in cats.items()),
        key=lambda c: (-c.total_us, CATEGORIES.index(c.category)),
    ))
    return KernelWindowStats(
        device=window.device,
        step=window.step,
        window=window.window,
        step_us=step,
        kernels=KernelTable(kernels),
        categories=categories,
        anatomy=_anatomy(window, work, kernels, span),
        cost_s=window.cost_s,
    )


def _anatomy(window: KernelWindow, work: list, kernels: list[KernelStat],
             span: tuple[float, float, str]) -> StepAnatomy:
    names, events = window.names, window.events
    origin, step, basis = span
    on_cpu = window.device == "cpu"
    busy_src = [e for e in events if e.kind == CPU_OP] if on_cpu else work
    busy = merge_intervals((e.ts_us, e.ts_us + e.dur_us) for e in busy_src)  # inside the step span
    busy_us = sum((e - s for s, e in busy), 0.0)
    category = {k.name: k.category for k in kernels}
    comm = merge_intervals((e.ts_us, e.ts_us + e.dur_us) for e in work if category[names[e.name]] == "communication")
    compute = merge_intervals((e.ts_us, e.ts_us + e.dur_us) for e in work
                              if e.kind == KERNEL and category[names[e.name]] != "communication")
    comm_us = sum((e - s for s, e in comm), 0.0)
    overlap = intersection_length(comm, compute)

    launches = short = None
    short_us: float | None = None
    note = "no launches on a CPU window"
    if not on_cpu:
        launch_dur = {e.op: e.dur_us for e in events if e.kind == RUNTIME and e.op >= 0}
        linked = short = 0
        short_us = 0.0
        for i, e in enumerate(events):
            if e.kind not in DEVICE_KINDS:
                continue
            limit = launch_dur.get(i)
            linked += limit is not None
            if e.dur_us < (SHORT_KERNEL_FALLBACK_US if limit is None else limit):
                short += 1
                short_us += e.dur_us
        launches = len(work)
        note = (f"device time < its launch call ({linked} of {launches} linked); "
                f"< {SHORT_KERNEL_FALLBACK_US:g} µs when the launch call is unknown")

    flops = [e.flops for e in work if e.flops >= 0]
    total_flops = sum(flops) if flops else None
    return StepAnatomy(
        step_us=step,
        busy_us=busy_us,
        idle_us=max(0.0, step - busy_us),
        busy_frac=_ratio(busy_us, step),
        comm_us=comm_us,
        comm_overlap_us=overlap,
        comm_overlap_frac=_ratio(overlap, comm_us),
        launches=launches,
        short_kernels=short,
        short_kernel_us=short_us,
        short_note=note,
        gaps=_gaps(window, busy, origin, step),
        flops=total_flops,
        tflops=total_flops / step / 1e6 if total_flops is not None and step > 0 else None,
        typical_step_us=window.typical_step_us,
        busy_frac_typical=min(1.0, busy_us / window.typical_step_us) if window.typical_step_us else None,
        step_basis=basis,
    )


def _gaps(window: KernelWindow, busy: list[tuple[float, float]], origin: float,
          step: float) -> Rows[IdleGap]:
    """The longest stretches of the step with no device work (``busy`` is inside the step)."""
    edges = [origin] + [x for s, e in busy for x in (s, e)] + [origin + step]
    holes = [(edges[i], edges[i + 1]) for i in range(0, len(edges) - 1, 2) if edges[i + 1] > edges[i]]
    holes.sort(key=lambda h: (-(h[1] - h[0]), h[0]))
    host = [e for e in window.events if e.kind in (CPU_OP, RUNTIME)]
    out = []
    for s, e in holes[:TOP_GAPS]:
        during: defaultdict[str, float] = defaultdict(float)
        for h in host:
            lo, hi = max(s, h.ts_us), min(e, h.ts_us + h.dur_us)
            if hi > lo:
                during[window.names[h.name]] += hi - lo
        top = sorted(during.items(), key=lambda kv: (-kv[1], kv[0]))[:GAP_HOST_OPS]
        out.append(IdleGap(s, e - s, tuple(n for n, _ in top)))
    return Rows(IdleGap, out)
