"""Sampled kernel windows: torch.profiler over one whole training step, sent as raw records.

:class:`KernelWindowSampler` profiles exactly one step when :class:`WindowScheduler` says one is
due (or the monitor asked with ``request_now``), reads the profiler's raw event list (no
``FunctionEvent`` tree, no trace file) and returns its *raw records* (:mod:`probe.kernels.records`)
— a string table, the host operator calls and the device activities / runtime calls, times in µs
from the window start (the ``kernels`` message of :mod:`probe.wire`).  The monitor does all
linking, attribution and FLOP formulas (``flowtop.monitor.kernels.trace.window_from_wire``), in the
one place that also reads Chrome traces for ``flowtop analyze``; the probe only copies fields,
which keeps the training thread's share of a window small.

Protocol (training thread, at step boundaries): optionally ``due(step)``, then
``begin_step(step)`` (True when profiling started) and, at the step's end, ``end_step(step)``.

Everything here runs on the training thread and never raises into training: a failure is logged
once and switches the sampler off.
"""

from __future__ import annotations

import time
from typing import Any

from probe import config
from probe.kernels import heap
from probe._log import warn_once
from probe.kernels.schedule import WindowScheduler
from probe.kernels.records import records_from_kineto
from probe.wire import MAX_FRAME_BYTES

__all__ = ["KernelWindowSampler", "WindowScheduler"]

#: Windows with more records than this are packed once to check that they fit in a frame (a
#: record takes ~38 bytes on the H200 fixture, so smaller windows always fit); the margin leaves
#: room for the envelope and the fields added after the records.
_MEASURE_ABOVE = 50_000
_FRAME_ROOM = MAX_FRAME_BYTES - 64 * 1024


def _packed_size(window: dict[str, Any]) -> int:
    import msgpack

    return len(msgpack.packb(window, use_bin_type=True))


def cupti_teardown_safe(cuda_version: str | None) -> bool:
    """Whether CUPTI may be torn down after a window: CUDA graphs crash on CUPTI's re-init after a
    teardown before CUDA 12.6 (torch keeps TEARDOWN_CUPTI=0 there for compiled graphs; graphs
    captured by hand get no such care), so older CUDA keeps CUPTI attached."""
    try:
        major, minor = (int(x) for x in (cuda_version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (12, 6)


def _release(prof: Any) -> None:
    """Drop the session's results now: torch's profile objects sit in reference cycles, so
    without this a session's event storage (MBs) stays until the next full GC (the RSS of a
    long run rose ~90 MB per 100 windowed steps between collections)."""
    inner = getattr(prof, "profiler", None)
    if inner is not None:
        for name in ("kineto_results", "function_events", "_function_events"):
            if hasattr(inner, name):
                try:
                    setattr(inner, name, None)
                except Exception:
                    pass
    try:
        prof.profiler = None
    except Exception:
        pass


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
        max_events: int = 200_000,  # records (ops + acts): ~38 B each on a GPU step, so ≤ ~7.5 MB
        max_retained_bytes: int = 256 << 20,
        ewma_alpha: float = 0.1,
    ) -> None:
        self.scheduler = scheduler or WindowScheduler()
        self.enabled = True
        self.windows = 0
        self.last_cost_s: float | None = None
        self.last_convert_s: float | None = None  # extraction of the last window's records
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
        #: Resident memory the windows kept (grown during windows, less what was given back
        #: between them); past ``max_retained_bytes`` windows turn off for good.
        self.retained_bytes = 0
        self._max_retained = max_retained_bytes
        self._rss_begin: int | None = None
        self._rss_after: int | None = None
        self._stopped_step: int | None = None  # the step whose end stopped the last session (see due)

    @property
    def device(self) -> str:
        """"cuda" or "cpu": what the windows record."""
        if self._cuda is None:
            import torch

            self._cuda = bool(torch.cuda.is_available())
        return "cuda" if self._cuda else "cpu"

    def request_now(self) -> bool:
        """Profile the next step (the monitor's ``kernels_now`` command); False when the
        scheduler's rate limit refused it (counted in ``scheduler.refused``)."""
        return self.scheduler.request_now(time.monotonic())

    def due(self, step: int, typical_step_s: float | None = None) -> bool:
        """Whether :meth:`begin_step` would profile step ``step``.

        Optional: callers that keep some steps from the sampler (a FLOP-counted one) ask first.
        ``typical_step_s``, when given, becomes the sampler's typical step time (what
        :meth:`end_step` measures the window's cost against when it is given none).
        """
        if typical_step_s is not None and typical_step_s > 0:
            self.typical_step_s = typical_step_s
        if self._stopped_step is not None and step == self._stopped_step + 1:
            # Boundaries run inside torch's "Optimizer.step#..." record_function range (and maybe
            # ranges of the user's), opened while the last session recorded. A range that ends
            # after a *new* session has started writes its end into the old session's freed
            # event storage: heap corruption, then SIGSEGV/SIGABRT at a later GC. So a session
            # never starts at the boundary where one stopped; one unprofiled step lets those
            # ranges close while no session is active, where their end is a no-op.
            return False
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
            if self.device == "cuda" and cupti_teardown_safe(torch.version.cuda):
                # Kineto leaves CUPTI attached after a session unless TEARDOWN_CUPTI=1, and an
                # attached CUPTI taxes every later kernel launch (on an H200, launch-bound steps
                # stayed 1.33-1.36x slower after one window; bench/cupti_teardown.py). A user's
                # own setting wins.
                config.TEARDOWN_CUPTI.set_default("1")
            # Kineto prints "USDT ... profiler_start/stop" on stderr for every session unless its
            # log level is above its USDT level (5); the training's log is not ours to fill.
            config.KINETO_LOG_LEVEL.set_default("6")
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
            prof = profile(activities=activities, record_shapes=True)
            self._rss_begin = rss = heap.rss_bytes()
            if rss is not None and self._rss_after is not None:
                # What the last window's payload (sent and freed since) gave back is not kept.
                self.retained_bytes = max(0, self.retained_bytes - max(0, self._rss_after - rss))
            prof.start()
            self._prof, self._prof_step, self._started_s = prof, step, time.perf_counter()
            return True
        except Exception as exc:  # never into training
            self._fail(exc)
            return False

    def end_step(self, step: int, typical_step_s: float | None = None) -> dict[str, Any] | None:
        """Step ``step`` ended: the window's wire fields if this step was profiled, else None.

        The fields are those of the ``kernels`` message (:mod:`probe.wire`): the raw records of
        :func:`records_from_kineto` plus ``window``, ``step``, ``device``, ``step_dur_us``,
        ``cost_s`` and, when known, ``typical_step_us``.  ``typical_step_s`` is the caller's EWMA
        of unsampled step wall times (the sampler's own when None); the window's cost is its
        step's wall time beyond it, the extraction of the records included.
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
        self._stopped_step = step
        try:
            prof.stop()
            if step != self._prof_step:
                self._drop(prof)
                return None  # boundaries out of order: not one whole step
            results = prof.profiler.kineto_results
            t_conv = time.perf_counter()
            events = results.events()
            if len(events) > self._max_events:
                # A window that ran through an evaluation or a checkpoint: too big to be one
                # step's table. Drop it before paying for the conversion on the training thread.
                self.scheduler.record(step, time.monotonic(), time.perf_counter() - self._begin_s, typical_step_s)
                warn_once("kernels-large", f"kernel window of {len(events)} records dropped (too large to send)")
                del events, results
                self._drop(prof)
                return None
            window = records_from_kineto(events, results.trace_start_ns())
            del events, results
            self._drop(prof)
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
            records = len(window["ops"]) + len(window["acts"])
            if records > self._max_events or (records > _MEASURE_ABOVE and _packed_size(window) > _FRAME_ROOM):
                # A frame over the monitor's limit would make it drop the connection.
                warn_once("kernels-large", f"kernel window of {records} records dropped (too large to send)")
                return None
            self.windows += 1
            window.update(step=step, window=self.windows, cost_s=self.last_cost_s, device=self.device,
                          step_dur_us=(t_end - self._started_s) * 1e6)
            if typical:
                # The profiler stretches host time (docs/design.md, "Overheads"), not kernel time: shares of
                # the step are better taken against the unprofiled step.
                window["typical_step_us"] = typical * 1e6
            return window
        except Exception as exc:
            self._fail(exc)
            return None

    def _drop(self, prof: Any) -> None:
        """Free a stopped session now and count the memory it kept (on every path)."""
        _release(prof)
        self._account_memory()

    def _account_memory(self) -> None:
        """Trim the heap the session left and count what stays; too much turns windows off.

        Kineto keeps some memory per session (a long run with windows grew without bound:
        1.07 GB after 1,500 steps), so windows stop once they have kept ``max_retained_bytes``.
        """
        heap.trim()
        rss = self._rss_after = heap.rss_bytes()
        if rss is None or self._rss_begin is None:
            return
        self.retained_bytes += max(0, rss - self._rss_begin)
        if self.retained_bytes > self._max_retained:
            self.enabled = False
            warn_once("kernels-memory", f"kernel windows turned off: {self.windows + 1} windows kept "
                      f"{self.retained_bytes / 2**20:.0f} MB of memory (limit {self._max_retained / 2**20:.0f} MB)")

    def close(self) -> None:
        """Stop a running profiler (training ended mid-window)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            self._stopped_step = self._prof_step
            try:
                prof.stop()
            except Exception as exc:
                warn_once("kernels-close", f"profiler stop failed: {exc!r}")

    def _fail(self, exc: BaseException) -> None:
        self.enabled = False
        warn_once("kernels", f"kernel windows disabled after an error: {exc!r}")
        self.close()
