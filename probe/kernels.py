"""Sampled kernel windows: torch.profiler over one whole training step, sent in compact form.

:class:`KernelWindowSampler` profiles exactly one step when :class:`WindowScheduler` says one is
due (or the monitor asked with ``request_now``), reads the profiler's raw event list (no
``FunctionEvent`` tree, no trace file) and returns the compact window of
``flowtop.kernels.trace`` — that module's docstring is the format's specification.  The probe may
not import flowtop, so the pure parts the format needs (FLOP formulas, operator attribution) are
mirrored here, and tests hold the two copies equal: the same profiled CPU step and the H200 trace
through both producers (``test_kernels_probe``, ``test_kernels_trace``), every formula case and
every operator of the H200 trace through both formula tables (``test_kernels_opflops``).

Protocol (training thread, at step boundaries): optionally ``due(step)``, then
``begin_step(step)`` (True when profiling started) and, at the step's end, ``end_step(step)``.

Everything here runs on the training thread and never raises into training: a failure is logged
once and switches the sampler off.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any

from probe._log import warn_once

KERNEL, MEMCPY, MEMSET, CPU_OP, RUNTIME = 0, 1, 2, 3, 4
_DEVICE = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
_RUNTIME = ("cuda_runtime", "cuda_driver")
MAX_NAME = 8192  # the wire's limit per string

# --- FLOP formulas (the dims-based table of flowtop.kernels.opflops) ------------------------------


def _mat(a: Any, b: Any) -> float | None:
    if not a or not b:
        return None
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    ba, bb = list(a[:-2]), list(b[:-2])
    w = max(len(ba), len(bb))
    ba, bb = [1] * (w - len(ba)) + ba, [1] * (w - len(bb)) + bb
    return 2.0 * math.prod(max(x, y) for x, y in zip(ba, bb)) * m * n * k


def _masked(fwd: float | None, mask: Any) -> float | None:
    if fwd is None:
        return None
    return fwd * (sum(1 for v in mask[:2] if v) if isinstance(mask, list) and len(mask) >= 2 else 2)


def _linear(x: Any, w: Any) -> float | None:
    return 2.0 * math.prod(x[:-1]) * w[0] * w[1] if x and len(w) == 2 else None


def _ints(v: Any, n: int) -> list[int] | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v] * n
    if isinstance(v, list) and v and all(isinstance(i, int) for i in v):
        return v * n if len(v) == 1 else v
    return None


def _conv(d: Any, c: Any) -> float | None:
    x, w = d[0], d[1]
    if len(x) < 3 or len(w) != len(x):
        return None
    per = math.prod(w[1:])
    if c[6] is True:
        return 2.0 * math.prod(x) * per
    n = len(x) - 2
    s, p, dil = _ints(c[3], n), _ints(c[4], n), _ints(c[5], n)
    if s is None or p is None or dil is None:
        return None
    out = [(x[2 + i] + 2 * p[i] - dil[i] * (w[2 + i] - 1) - 1) // s[i] + 1 for i in range(n)]
    return 2.0 * x[0] * w[0] * math.prod(out) * per


def _attn(q: Any, k: Any, v: Any, bhsd: bool, backward: bool) -> float | None:
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None
    if bhsd:
        pairs, d = q[0] * q[1] * q[2] * k[2], q[3]
    else:
        pairs, d = q[0] * q[1] * q[2] * k[1], q[3]
    fwd = 2.0 * pairs * (d + v[3])
    return 2.0 * fwd + 2.0 * pairs * d if backward else fwd


def _pair(i: int) -> Any:
    return lambda d, c: _mat(d[i], d[i + 1])


_F: dict[str, Any] = {f"aten::{n}": _pair(0) for n in ("mm", "bmm", "_scaled_mm", "_int_mm")}
_F.update({f"aten::{n}": _pair(1) for n in ("addmm", "_addmm_activation", "baddbmm", "addbmm")})
_F.update({
    "aten::mv": lambda d, c: 2.0 * d[0][0] * d[0][1] if len(d[0]) == 2 else None,
    "aten::addmv": lambda d, c: 2.0 * d[1][0] * d[1][1] if len(d[1]) == 2 else None,
    "aten::dot": lambda d, c: 2.0 * d[0][0] if len(d[0]) == 1 else None,
    "aten::vdot": lambda d, c: 2.0 * d[0][0] if len(d[0]) == 1 else None,
    "aten::linear_backward": lambda d, c: _masked(_linear(d[0], d[2]), c[3]),
    "aten::convolution": _conv,
    "aten::_convolution": _conv,
    "aten::convolution_overrideable": _conv,
    "aten::convolution_backward": lambda d, c: _masked(
        2.0 * math.prod(d[1] if c[7] is True else d[0]) * math.prod(d[2][1:]) if d[0] and d[2] else None, c[10]),
    "aten::_flash_attention_forward": lambda d, c: _attn(d[0], d[1], d[2], False, False),
    "aten::_flash_attention_backward": lambda d, c: _attn(d[1], d[2], d[3], False, True),
    "aten::_efficient_attention_forward": lambda d, c: _attn(d[0], d[1], d[2], False, False),
    "aten::_efficient_attention_backward": lambda d, c: _attn(d[1], d[2], d[3], False, True),
})
_F["aten::convolution_backward_overrideable"] = _F["aten::convolution_backward"]
for _s in ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attention_for_cpu",
           "fused_attention_overrideable"):
    _F[f"aten::_scaled_dot_product_{_s}"] = lambda d, c: _attn(d[0], d[1], d[2], True, False)
    _F[f"aten::_scaled_dot_product_{_s}_backward"] = lambda d, c: _attn(d[1], d[2], d[3], True, True)
_C: dict[str, Any] = {
    "aten::matmul": lambda d, c: _mat(d[0], d[1]),
    "aten::linear": lambda d, c: _linear(d[0], d[1]),
    "aten::scaled_dot_product_attention": lambda d, c: (
        2.0 * math.prod(d[0][:-2]) * d[0][-2] * d[1][-2] * (d[0][-1] + d[2][-1]) if len(d[0]) >= 2 else None),
}


def op_flops(name: str, dims: Any, concrete: Any) -> float | None:
    """FLOPs of one operator call from its input dims and concrete inputs, None when unknown."""
    f = _F.get(name) or _C.get(name)
    if f is None:
        return None
    c = list(concrete or []) + [None] * 12  # absent trailing arguments read as None
    try:
        v = f(dims, c)
    except (TypeError, ValueError, IndexError):
        return None
    return v if v is not None and v >= 0 else None


# --- compact window (the rules of flowtop.kernels.trace.build_window) ----------------------------


def build_window(ops: list[tuple], acts: list[tuple], origin: float, step_dur_us: float, device: str) -> dict[str, Any]:
    """Compact window from operator tuples ``(name, thread, start, end, ext, dims, concrete)`` and
    activity tuples ``(name, kind, start, end, stream, ext, corr)`` (µs, ``origin`` = step start)."""
    ops = sorted(ops, key=lambda o: (str(o[1]), o[2], -o[3]))
    n = len(ops)
    parent = [-1] * n
    stacks: dict[Any, list[int]] = defaultdict(list)
    for i, o in enumerate(ops):
        st = stacks[o[1]]
        while st and ops[st[-1]][3] <= o[2]:
            st.pop()
        parent[i] = st[-1] if st else -1
        st.append(i)
    below = [False] * n
    for i, o in enumerate(ops):
        if o[0] in _F:
            p = parent[i]
            while p != -1 and not below[p]:
                below[p] = True
                p = parent[p]
    counts = [o[0] in _F or (o[0] in _C and not below[i]) for i, o in enumerate(ops)]
    flops: dict[int, float | None] = {}

    def fl(i: int) -> float | None:
        if i not in flops:
            flops[i] = op_flops(ops[i][0], ops[i][5] or [], ops[i][6]) if counts[i] else None
        return flops[i]

    def attribute(i: int) -> int:
        j = i
        while j != -1 and not counts[j]:
            j = parent[j]
        return i if j == -1 else j

    work: list[tuple] = []  # (name, kind, start, dur, stream, op, corr)
    if device == "cpu":
        child = [0.0] * n
        for i, o in enumerate(ops):
            if parent[i] != -1:
                child[parent[i]] += o[3] - o[2]
        for i, o in enumerate(ops):
            work.append((o[0], KERNEL, o[2], max(0.0, o[3] - o[2] - child[i]), -1, attribute(i), -1))
    else:
        by_ext = {o[4]: i for i, o in enumerate(ops) if o[4]}
        rt_ext = {a[6]: a[5] for a in acts if a[1] == RUNTIME and a[6] and a[5]}
        for a in acts:
            if a[1] != RUNTIME:
                launcher = by_ext.get(a[5] or rt_ext.get(a[6], 0), -1)
                op = attribute(launcher) if launcher != -1 else -1
                work.append((a[0], a[1], a[2], max(0.0, a[3] - a[2]), a[4], op, a[6]))
    best: dict[int, int] = {}  # op -> its longest unit of work, which gets the op's FLOPs
    for k, w in enumerate(work):
        b = best.get(w[5])
        if w[5] != -1 and (b is None or (-w[3], w[2], w[0]) < (-work[b][3], work[b][2], work[b][0])):
            best[w[5]] = k
    shares = [-1.0] * len(work)
    for op, k in best.items():
        f = fl(op)
        shares[k] = -1.0 if f is None else f
    rows = [(w[2] - origin, w[1], w[0], w[3], w[4], w[5], f, w[6]) for w, f in zip(work, shares)]
    emitted = {i for i in range(n) if parent[i] == -1}
    if device != "cpu":
        emitted.update(w[5] for w in work if w[5] != -1)
    for i in emitted:
        f = fl(i)
        rows.append((ops[i][2] - origin, CPU_OP, ops[i][0], max(0.0, ops[i][3] - ops[i][2]), -1, -1,
                     -1.0 if f is None else f, -1))
    if device != "cpu":
        rows += [(a[2] - origin, RUNTIME, a[0], max(0.0, a[3] - a[2]), -1, -1, -1.0, a[6]) for a in acts if a[1] == RUNTIME]
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    names: dict[str, int] = {}
    device_at = {r[7]: i for i, r in enumerate(rows) if r[1] < CPU_OP and r[7] > 0}
    events = []
    for ts, kind, name, dur, stream, op, f, corr in rows:
        if kind == RUNTIME:
            link = device_at.get(corr, -1) if corr > 0 else -1
        else:
            link = names.setdefault(ops[op][0], len(names)) if op != -1 else -1
        events.append([names.setdefault(name, len(names)), kind, ts, dur, stream, link, f])
    return {"names": [s[:MAX_NAME] for s in names], "events": events, "step_dur_us": step_dur_us, "device": device}


def window_from_kineto(events: Any, trace_start_ns: int, step_dur_us: float, device: str) -> dict[str, Any]:
    """Compact window from ``prof.profiler.kineto_results.events()``.

    For a Kineto (device or runtime) event ``correlation_id()`` is the CUPTI correlation and
    ``linked_correlation_id()`` the External id of the operator it belongs to; for an operator
    ``correlation_id()`` *is* its External id.  Shapes are read only for operators with a formula.
    """
    ops: list[tuple] = []
    acts: list[tuple] = []
    t0 = trace_start_ns  # subtract in integer ns: epoch ns as a float is only good to ~256 ns
    for e in events:
        cat = e.activity_type()
        if cat == "cpu_op":
            name = e.name()
            dims = concrete = None
            if name in _F or name in _C:
                dims, concrete = e.shapes(), e.concrete_inputs()
            ops.append((name, e.start_thread_id(), (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3,
                        e.correlation_id(), dims, concrete))
        elif cat in _DEVICE or cat in _RUNTIME:
            kind = _DEVICE.get(cat, RUNTIME)
            acts.append((e.name(), kind, (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3,
                         e.device_resource_id() if kind != RUNTIME else -1, e.linked_correlation_id(), e.correlation_id()))
    return build_window(ops, acts, 0.0, step_dur_us, device)


# --- when to sample --------------------------------------------------------------------------


class WindowScheduler:
    """Spaces profiled windows so that their amortised cost stays inside a budget.

    After each window the caller reports what it cost the training thread (the profiled step's
    wall time beyond a typical step, plus the conversion); the next window comes
    ``ceil(cost / (budget × typical step))`` steps later — so ``cost / (interval × step)`` ≤
    budget — clamped to ``[min_interval_steps, max_interval_steps]``.  The budget is
    ``budget_large`` for steps ≥ ``large_step_s`` and ``budget_small`` below (design.md §7: small
    steps pay a far larger relative profiler overhead).  A window is also due after
    ``max_interval_s`` of wall time (at least ``min_interval_steps`` steps), so tables stay fresh
    on slow jobs; :meth:`request_now` makes the next step a window whatever the interval.
    """

    def __init__(
        self,
        *,
        budget_large: float = 0.005,
        budget_small: float = 0.02,
        large_step_s: float = 0.1,
        min_interval_steps: int = 10,
        max_interval_steps: int = 10_000,
        max_interval_s: float = 600.0,
    ) -> None:
        self.budget_large = budget_large
        self.budget_small = budget_small
        self.large_step_s = large_step_s
        self.min_interval_steps = min_interval_steps
        self.max_interval_steps = max_interval_steps
        self.max_interval_s = max_interval_s
        self.interval_steps = min_interval_steps
        self.requested = False
        self._anchor_step: int | None = None  # the last window's step (or the first step seen)
        self._anchor_s = 0.0

    def request_now(self) -> None:
        """Sample the next step (the monitor's manual trigger)."""
        self.requested = True

    def due(self, step: int, now_s: float) -> bool:
        """Whether step ``step`` (starting at monotonic time ``now_s``) should be profiled."""
        if self.requested:
            return True
        if self._anchor_step is None:
            self._anchor_step, self._anchor_s = step, now_s
            return False
        since = step - self._anchor_step
        if since < self.min_interval_steps:
            return False
        return since >= self.interval_steps or now_s - self._anchor_s >= self.max_interval_s

    def budget(self, typical_step_s: float) -> float:
        """The amortised-cost budget for steps of this length."""
        return self.budget_large if typical_step_s >= self.large_step_s else self.budget_small

    def record(self, step: int, now_s: float, cost_s: float, typical_step_s: float | None) -> int:
        """Account a window taken at ``step``; returns (and keeps) the next interval in steps."""
        self.requested = False
        self._anchor_step, self._anchor_s = step, now_s
        if typical_step_s is None or typical_step_s <= 0:
            steps = self.max_interval_steps  # cannot amortise without a step time: the wall cap rules
        else:
            # The small epsilon keeps an exact quotient (50.000000000000001) from adding a step.
            steps = math.ceil(max(0.0, cost_s) / (self.budget(typical_step_s) * typical_step_s) - 1e-9)
        self.interval_steps = max(self.min_interval_steps, min(self.max_interval_steps, steps))
        return self.interval_steps


# --- the sampler -------------------------------------------------------------------------------


class KernelWindowSampler:
    """Profiles one whole step when due; call :meth:`begin_step`/:meth:`end_step` at boundaries.

    Both run on the training thread.  Activities: CPU + CUDA when CUDA is available (``cuda``
    None), else CPU only; ``record_shapes`` on (FLOPs per operator call), ``with_flops``,
    ``with_stack`` and memory profiling off (they only add cost).  The sampler keeps its own EWMA
    of unsampled step times for when the caller passes no typical step time.
    """

    def __init__(
        self,
        scheduler: WindowScheduler | None = None,
        *,
        cuda: bool | None = None,
        max_events: int = 200_000,  # the wire's 8 MiB frame holds about 220 k events
        ewma_alpha: float = 0.1,
    ) -> None:
        self.scheduler = scheduler or WindowScheduler()
        self.enabled = True
        self.windows = 0
        self.last_cost_s: float | None = None
        self.last_convert_s: float | None = None
        self.total_cost_s = 0.0
        self._cuda = cuda
        self._max_events = max_events
        self._alpha = ewma_alpha
        self.typical_step_s: float | None = None
        self._prof: Any = None
        self._prof_step = -1
        self._begin_step: int | None = None
        self._begin_s = 0.0
        self._started_s = 0.0
        self._warm = False  # a first window (with the profiler's one-off start-up) was taken

    @property
    def device(self) -> str:
        """"cuda" or "cpu": what the windows record."""
        if self._cuda is None:
            import torch

            self._cuda = bool(torch.cuda.is_available())
        return "cuda" if self._cuda else "cpu"

    def request_now(self) -> None:
        """Profile the next step (the monitor's ``kernels_now`` command)."""
        self.scheduler.request_now()

    def due(self, step: int, typical_step_s: float | None = None) -> bool:
        """Whether :meth:`begin_step` would profile step ``step``.

        Optional: callers that keep some steps from the sampler (a FLOP-counted one) ask first.
        ``typical_step_s``, when given, becomes the sampler's typical step time (what
        :meth:`end_step` measures the window's cost against when it is given none).
        """
        if typical_step_s is not None and typical_step_s > 0:
            self.typical_step_s = typical_step_s
        return self.enabled and self._prof is None and self.scheduler.due(step, time.monotonic())

    def begin_step(self, step: int) -> bool:
        """Step ``step`` starts: start the profiler if a window is due; True when it started."""
        self._begin_step, self._begin_s = step, time.perf_counter()
        try:
            if not self.due(step):
                return False
            import torch
            from torch.profiler import ProfilerActivity, profile

            if getattr(torch._C._autograd, "_profiler_enabled", lambda: False)():
                warn_once("kernels-busy", "kernel window skipped: another torch.profiler session is active")
                return False
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
            prof = profile(activities=activities, record_shapes=True)
            prof.start()
            self._prof, self._prof_step, self._started_s = prof, step, time.perf_counter()
            return True
        except Exception as exc:  # never into training
            self._fail(exc)
            return False

    def end_step(self, step: int, typical_step_s: float | None = None) -> dict[str, Any] | None:
        """Step ``step`` ended: the compact window if this step was profiled, else None.

        ``typical_step_s`` is the caller's EWMA of unsampled step wall times (the sampler's own
        when None); the window's cost is its step's wall time beyond it, conversion included.
        """
        t_end = time.perf_counter()
        prof = self._prof
        if prof is None:
            if self._begin_step == step:
                dt = t_end - self._begin_s
                self.typical_step_s = dt if self.typical_step_s is None else (
                    self.typical_step_s + self._alpha * (dt - self.typical_step_s))
            return None
        self._prof = None
        try:
            prof.stop()
            if step != self._prof_step:
                return None  # boundaries out of order: not one whole step
            results = prof.profiler.kineto_results
            t_conv = time.perf_counter()
            window = window_from_kineto(results.events(), results.trace_start_ns(),
                                        (t_end - self._started_s) * 1e6, self.device)
            done = time.perf_counter()
            typical = typical_step_s if typical_step_s is not None else self.typical_step_s
            cost = (done - self._begin_s) - typical if typical else done - t_end
            self.last_convert_s, self.last_cost_s = done - t_conv, max(0.0, cost)
            self.total_cost_s += self.last_cost_s
            # The first window also pays the profiler's one-off initialisation (kineto, CUPTI: up
            # to seconds); amortising that would push the second window far out, so the second
            # comes after the minimum interval and measures the recurring cost.
            self.scheduler.record(step, time.monotonic(), self.last_cost_s if self._warm else 0.0, typical)
            self._warm = True
            if len(window["events"]) > self._max_events:
                warn_once("kernels-large", f"kernel window of {len(window['events'])} events dropped (limit {self._max_events})")
                return None
            self.windows += 1
            window.update(step=step, window=self.windows, cost_s=self.last_cost_s)
            if typical:
                # The profiler stretches host time (design.md §7), not kernel time: shares of
                # the step are better taken against the unprofiled step.
                window["typical_step_us"] = typical * 1e6
            return window
        except Exception as exc:
            self._fail(exc)
            return None

    def close(self) -> None:
        """Stop a running profiler (training ended mid-window)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception as exc:
                warn_once("kernels-close", f"profiler stop failed: {exc!r}")

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        warn_once("kernels", f"kernel windows disabled after an error: {exc!r}")
        self.close()
