"""The probe's sampled features on the training thread: FLOP counting windows and kernel
(profiler) windows, as a part of :class:`probe.runtime.Probe`.

Both run only at the steps that need them: the step tracker publishes the other steps alone
(``StepTracker.quiet_until``, kept by the runtime), so the code here is called at a step a
window may open, is open or closes, and at the steps that charge a count's cost. Every
callback guards itself: a failure logs once and turns that feature off, training goes on.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from probe._log import warn_once

if TYPE_CHECKING:
    from probe.config import ProbeConfig
    from probe.steps.tracker import StepTracker
    from probe.transport.publisher import Publisher


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1), as the kernel window scheduler aligns."""
    p = 1
    while p < n:
        p <<= 1
    return p


class SampledFeatures:
    """FLOP counting and kernel windows (a mixin of :class:`probe.runtime.Probe`, whose
    ``__init__`` sets the attributes declared here)."""

    if TYPE_CHECKING:
        cfg: ProbeConfig
        tracker: StepTracker
        publisher: Publisher
        sampled_steps: dict[int, str]
        _context: dict[str, Any]
        _flops: Any
        _kernels: Any
        _kernels_active: bool
        _kernels_next: int
        _kernels_waiting: bool
        _counting: bool
        _charge_after: int
        _count_wall_s: float | None
        _since_count: int
        _flops_close_pending: bool

        @property
        def _ewma_step_s(self) -> float | None: ...

        @property
        def _recent_walls(self) -> deque[float]: ...

        def _refresh_rare(self) -> None: ...

        def _wake(self) -> None: ...

    def _setup_flops(self) -> None:
        if not self._new_flop_sampler():
            return
        from probe.flops.sampling import CHARGE_AFTER_STEPS

        self._charge_after = CHARGE_AFTER_STEPS
        # Not _guard()ed: these run every step and guard their own work (a frame less each).
        self.tracker.listeners_forward.append(self._maybe_start_count)
        self.tracker.listeners_root.append(self._flops_for_new_root)
        self._add_boundary_listener()

    def _new_flop_sampler(self) -> bool:
        try:
            from probe.flops.sampling import FlopSampler

            self._flops = FlopSampler(
                lambda fields: self.publisher.publish_now("flops", fields),
                self.cfg.attention,
                self.cfg.recheck_steps,
                self.cfg.flops_budget,
            )
        except Exception as exc:
            warn_once("flops-setup", f"FLOP counting unavailable: {exc}")
            return False
        self.tracker.forward_gate = self._flops  # its quiet steps call no listener (see StepTracker)
        return True

    def _flops_for_new_root(self) -> None:
        """The model trained before was freed and another is trained now (a sweep's next trial):
        its counts, kept by input signature, say nothing of this one; it is counted afresh."""
        old = self._flops
        if old is None:
            return
        old.close()
        self._set_counting(False)
        self._count_wall_s, self._since_count, self._flops_close_pending = None, 0, False  # the old count's
        if not self._new_flop_sampler():
            self._flops_off()

    def _flops_off(self) -> None:
        sampler, self._flops = self._flops, None
        self.tracker.forward_gate = None
        self._set_counting(False)
        self._refresh_rare()
        if sampler is not None:
            sampler.close()

    def _setup_kernels(self) -> None:
        try:
            from probe.kernels import windows as kernels

            scheduler = kernels.WindowScheduler(
                min_interval_steps=self.cfg.kernels_min_steps,
                max_interval_steps=max(10_000, self.cfg.kernels_min_steps),
                max_interval_s=self.cfg.kernels_max_s,
                min_request_s=self.cfg.kernels_request_s,
            )
            self._kernels = kernels.KernelWindowSampler(scheduler)
        except Exception as exc:
            warn_once("kernels-setup", f"kernel windows unavailable: {exc}")
            return

        self._kernels_next = 0
        self._add_boundary_listener()
        self.publisher.on_control(self._control)

    def _add_boundary_listener(self) -> None:
        self.tracker.on_boundary = self._at_boundary

    def _at_boundary(self, step: int, wall_s: float) -> None:
        """Every boundary, FLOP counting's and kernel windows' share, in that order; each does
        nothing but a test or two unless a window is open or may be due."""
        if self._counting:
            try:
                self._finish_at_boundary(step, wall_s)
                self._set_counting(self._flops is not None and self._flops.counting)
            except Exception as exc:
                self._feature_failed("flop counting", exc, self._flops_off)
        if step + 1 < self._kernels_next:
            return  # no window can start at the coming step, none is open
        try:
            self._kernel_boundary(step, wall_s)
        except Exception as exc:
            self._feature_failed("kernel windows", exc, self._kernels_off)

    @staticmethod
    def _feature_failed(name: str, exc: BaseException, off: Callable[[], None]) -> None:
        """What :func:`_guard` does, for callbacks that guard themselves."""
        warn_once(name, f"{name} disabled after an error: {type(exc).__name__}: {exc}")
        off()

    def _kernels_off(self) -> None:
        sampler, self._kernels = self._kernels, None
        self._kernels_next = sys.maxsize
        self._kernels_active = False
        if sampler is not None:
            sampler.close()  # an open profiler session must not keep recording

    def _charge_count(self) -> None:
        if self._flops is not None and self._recent_walls and self._since_count >= self._charge_after:
            # Against the median of the last few steady steps: one slow step (a host hiccup)
            # right after a count must not make the count look free and let counts crowd in.
            typical = statistics.median(self._recent_walls)
            self._flops.charge(self._count_wall_s - typical, typical)  # type: ignore[operator]
            self._count_wall_s = None

    def _maybe_start_count(self, signature: tuple[Any, ...]) -> None:
        flops = self._flops
        if flops is None:
            return
        # A step whose count in force holds never gets here (StepTracker.forward_gate); nor does
        # one with a window to close (_flops_close_pending): a window is open, so nothing is quiet.
        try:
            self._start_count(flops, signature)
            self._refresh_rare()  # counting may have turned to the estimate
        except Exception as exc:
            self._feature_failed("flop counting", exc, self._flops_off)

    def _start_count(self, flops: Any, signature: tuple[Any, ...]) -> None:
        if self._flops_close_pending:
            self._flops_close_pending = False
            # closes the open window here, outside the compiled call
            flops.stop_counting("optimizer.step runs under torch.compile, where the "
                                "counting window cannot close", self.tracker.root)
            return
        # Never count a step that is also being profiled (each distorts the other).
        if self._kernels_active:
            return
        if flops.on_forward(self.tracker, signature, self._context):
            self._set_counting(True)
            self._wake()
            self._note_sampled(self.tracker.step + 1, "flops")  # 1-based, like the step messages

    def _set_counting(self, on: bool) -> None:
        """Whether a counting window is open. Its closing runs before the optimizer only while
        one is: a step without one calls nothing there (the common case)."""
        self._counting = on
        listeners = self.tracker.listeners_pre_opt
        if on and self._finish_count not in listeners:
            listeners.append(self._finish_count)
        elif not on and self._finish_count in listeners:
            listeners.remove(self._finish_count)

    def _finish_count(self) -> None:
        if not self._counting:
            return
        flops = self._flops
        if flops is None or not flops.counting:
            self._set_counting(False)
            return
        try:
            if not self._compiled_optimizer():
                flops.finish(self.tracker, self._context, self.tracker.micro_batches)
                self._set_counting(flops.counting)
        except Exception as exc:
            self._feature_failed("flop counting", exc, self._flops_off)

    def _compiled_optimizer(self) -> bool:
        """The optimizer step runs compiled (``torch.compile(opt.step)``): the counting window
        must not close inside it (probe.hookutil.in_compiled_call). It is closed, and FLOP counting
        turned off, at the next forward, outside the compiled call."""
        from probe.hookutil import in_compiled_call

        if not in_compiled_call():
            return False
        self._flops_close_pending = True
        return True

    def _finish_at_boundary(self, step: int, wall_s: float) -> None:
        if self._flops is not None and self._flops.counting:
            if self._compiled_optimizer():
                return
            # The pre-hook did not close the window (a closure optimizer such as LBFGS):
            # close it here, optimizer FLOPs included, rather than leave it open.
            self._flops.finish(self.tracker, self._context, 0)

    def _kernel_boundary(self, step: int, wall_s: float) -> None:
        sampler = self._kernels
        if sampler is None:
            self._kernels_next = sys.maxsize
            return
        self._kernels_next = 0  # until a due() said no, and when
        if self._kernels_active:
            self._kernels_active = False
            window = sampler.end_step(step, typical_step_s=self._ewma_step_s)
            if window is not None:
                window.setdefault("step", step)
                self.publisher.publish_now("kernels", window)
        # A window only while a monitor listens: nobody would see it, and each profiler session
        # costs memory that Kineto keeps. The due window waits until a monitor subscribes.
        if self.publisher.subscribers <= 0:
            self._kernels_waiting = True  # the sender thread wakes us when one subscribes
            self._kernels_next = sys.maxsize
            return
        self._kernels_waiting = False
        if sampler.due(step + 1, typical_step_s=self._ewma_step_s):
            self._kernels_active = bool(sampler.begin_step(step + 1))
            if self._kernels_active:
                self._note_sampled(step + 1, "kernels")
                return
        # The sampler was asked (its schedule is anchored). With windows aligned to step indices
        # (the scheduler's default), none can start before the next multiple of the power of two
        # its shortest interval rounds up to, unless the monitor asks, which _control signals (a
        # request landing between these lines waits for that step).
        sched = sampler.scheduler
        mask = _pow2_at_least(sched.min_interval_steps) - 1 if sched.align_steps else 0
        self._kernels_next = 0 if sched.requested else ((step + 1) | mask) + 1

    def _note_sampled(self, step: int, what: str) -> None:
        self.tracker.quiet_until = min(self.tracker.quiet_until, step)
        if len(self.sampled_steps) > 256:
            self.sampled_steps.clear()
        self.sampled_steps[step] = what

    def _control(self, command: str) -> None:
        """A command from the monitor (sender thread). A refused request is counted by the
        sampler's scheduler and reaches the monitor with the next step."""
        if command == "kernels_now" and self._kernels is not None:
            if self._kernels.request_now():
                self._kernels_next = 0  # ask the sampler at the next boundary
                self._wake()

    def _write_calibration(self, step: int) -> None:
        c = self._flops.last
        line = {"step": step, "executed_flops": c.executed_flops, "model_flops": c.model_flops}
        try:
            with open(self.cfg.calibrate_out, "a", encoding="utf-8") as fh:  # type: ignore[arg-type]
                fh.write(json.dumps(line) + "\n")
        except OSError as exc:
            warn_once("calibrate-out", f"cannot write {self.cfg.calibrate_out}: {exc}")
