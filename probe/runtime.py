"""The probe's runtime: wires step tracking, FLOP counting, kernel windows and telemetry
to the publisher. One instance per process (see :func:`probe.attach`).

Every callback that runs on the training thread is wrapped so that a failure
logs once and disables that feature — training goes on untouched.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Callable

import torch

from probe import config as config_mod
from probe._log import warn_once
from probe.identity import Identity
from probe.publisher import Publisher
from probe.steps import StepTracker

VERSION = "0.1.0"


def _guard(name: str, fn: Callable[..., None], on_fail: Callable[[], None]) -> Callable[..., None]:
    """Wrap a training-thread callback: the first exception disables the feature."""

    def wrapped(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            warn_once(name, f"{name} disabled after an error: {type(exc).__name__}: {exc}")
            on_fail()

    return wrapped


class Probe:
    """Everything the probe does inside one training process."""

    def __init__(self, cfg: config_mod.ProbeConfig, ident: Identity, flops_per_token: float | None) -> None:
        self.cfg = cfg
        self.ident = ident
        self.flops_per_token = flops_per_token if flops_per_token is not None else cfg.flops_per_token
        self.publisher = Publisher(ident.key, cfg.addr, cfg.control_addr, cfg.queue_size, curve_dir=cfg.curve_dir)
        self.tracker = StepTracker(self._on_step)
        self._started = False
        self._flops: Any = None  # flowtop FLOP counting (probe.flops), lazily built
        self._counter: Any = None  # the StepFlopCounter of the step being counted
        self._last_count: Any = None
        self._published_signature: tuple[Any, ...] | None = None
        self._kernels: Any = None  # probe.kernels.KernelWindowSampler
        self._kernels_active = False
        self._nvtx_open = False
        self._nvtx_disabled = False
        self._ewma_step_s: float | None = None
        #: Recent steps that carried a sampled instrument (step -> "flops"/"kernels"),
        #: so benchmarks can separate steady-state cost from sampled cost.
        self.sampled_steps: dict[int, str] = {}

    # --- setup ----------------------------------------------------------------------

    def install(self) -> None:
        """Install hooks; the sender thread starts at the first step."""
        self.tracker.install()
        if self.cfg.flops:
            self._setup_flops()
        if self.cfg.kernels:
            self._setup_kernels()
        if self.cfg.nvtx:
            self.tracker.listeners_boundary.append(_guard("nvtx", self._nvtx_boundary, self._nvtx_off))

    def _setup_flops(self) -> None:
        try:
            from probe import flops

            self._flops = flops.CountPolicy(recheck_every=self.cfg.recheck_steps)
        except Exception as exc:
            warn_once("flops-setup", f"FLOP counting unavailable: {exc}")
            return

        def off() -> None:
            self._flops = None
            self._counter = None

        self.tracker.listeners_forward.append(_guard("flop counting", self._maybe_start_count, off))
        self.tracker.listeners_pre_opt.append(_guard("flop counting", self._finish_count, off))

    def _setup_kernels(self) -> None:
        try:
            from probe import kernels

            scheduler = kernels.WindowScheduler(
                min_interval_steps=self.cfg.kernels_min_steps,
                max_interval_steps=max(10_000, self.cfg.kernels_min_steps),
                max_interval_s=self.cfg.kernels_max_s,
            )
            self._kernels = kernels.KernelWindowSampler(scheduler)
        except Exception as exc:
            warn_once("kernels-setup", f"kernel windows unavailable: {exc}")
            return

        def off() -> None:
            self._kernels = None

        self.tracker.listeners_boundary.append(_guard("kernel windows", self._kernel_boundary, off))
        self.publisher.on_control(self._control)

    def _setup_telemetry(self) -> None:
        try:
            from probe import telemetry

            # Built on the training thread: the current CUDA device is per thread.
            index = self.tracker.device.index if self._on_cuda() and self.tracker.device else None
            dev = (
                telemetry.DeviceTelemetry(local_rank=self.ident.local_rank, cuda_device_index=index)
                if self._on_cuda()
                else None
            )
            host = telemetry.HostTelemetry()
        except Exception as exc:
            warn_once("telemetry-setup", f"telemetry unavailable: {exc}")
            return

        def tick() -> None:
            device: dict[str, Any] = {}
            reasons: dict[str, Any] = {}
            if dev is not None:
                sample = dev.sample()
                reasons = dict(sample.pop("reasons", {}) or {})
                device = sample
            else:
                reasons = {"device": "no CUDA device in this rank"}
            proc = host.sample()
            for name, why in (proc.pop("reasons", None) or {}).items():
                reasons[f"host.{name}"] = why
            self.publisher.publish("telemetry", {"gpu": device, "proc": proc, "reasons": reasons})

        self.publisher.add_tick(self.cfg.telemetry_interval_s, tick)

    def _on_cuda(self) -> bool:
        dev = self.tracker.device
        return dev is not None and dev.type == "cuda"

    # --- per-step work ----------------------------------------------------------------

    def _on_step(self, fields: dict[str, Any]) -> None:
        if not self._started:
            self._first_step()
        wall = fields["wall_s"]
        if not self._kernels_active:
            prev = self._ewma_step_s
            self._ewma_step_s = wall if prev is None else 0.9 * prev + 0.1 * wall
        if self.cfg.calibrate_out and self._last_count is not None:
            self._write_calibration(fields["step"])
        self.publisher.publish("step", fields)

    def _first_step(self) -> None:
        self._started = True
        self.publisher.hello_fields = {
            "local_rank": self.ident.local_rank,
            "world_size": self.ident.world_size,
            "device": self._device_name(),
            "probe_version": VERSION,
            "argv": [a[:1024] for a in sys.argv[:64]],
        }
        if self.cfg.telemetry:
            self._setup_telemetry()
        self.publisher.start()

    def _device_name(self) -> str:
        dev = self.tracker.device
        try:
            if dev is not None and dev.type == "cuda":
                return torch.cuda.get_device_name(dev)
        except Exception:
            pass
        import platform

        return f"cpu ({platform.processor() or platform.machine()})"

    def _maybe_start_count(self, signature: tuple[Any, ...]) -> None:
        policy = self._flops
        if policy is None or self._counter is not None or self._kernels_active:
            return
        step = self.tracker.step  # 0-based index of the coming step (the policy's convention)
        if signature != self._published_signature:
            # Shapes changed back to ones counted before: the monitor gets that count again.
            carried = policy.carried(signature)
            if carried is not None:
                self._last_count = carried
                self._published_signature = signature
                self.publisher.publish("flops", self._flops_fields(carried))
        if policy.should_count(step, signature):
            from probe import flops

            self._counter = flops.StepFlopCounter(root=self.tracker.root, attention=self.cfg.attention)
            self._counter.start(in_forward=True)
            self._note_sampled(step + 1, "flops")  # 1-based, like the step messages

    def _finish_count(self) -> None:
        counter, self._counter = self._counter, None
        if counter is None:
            return
        result = counter.stop()
        if self._flops is not None:
            self._flops.record(self.tracker.signature, result)
        if result is None:
            return
        self._last_count = result
        self._published_signature = self.tracker.signature
        self.publisher.publish("flops", self._flops_fields(result))

    def _flops_fields(self, count: Any) -> dict[str, Any]:
        from probe import accounting

        return accounting.flops_message(
            count,
            step=self.tracker.step + 1,
            tokens=self.tracker.tokens,
            root=self.tracker.root,
            signature=self.tracker.signature,
            device=self.tracker.device,
            device_name=self._device_name(),
            flops_per_token=self.flops_per_token,
            attention=self.cfg.attention,
        )

    def _kernel_boundary(self, step: int, wall_s: float) -> None:
        sampler = self._kernels
        if sampler is None:
            return
        if self._kernels_active:
            self._kernels_active = False
            window = sampler.end_step(step, typical_step_s=self._ewma_step_s)
            if window is not None:
                window.setdefault("step", step)
                self.publisher.publish("kernels", window)
        # Never profile a step that is also being FLOP-counted (each distorts the other).
        if self._counter is None and sampler.due(step + 1, typical_step_s=self._ewma_step_s):
            self._kernels_active = bool(sampler.begin_step(step + 1))
            if self._kernels_active:
                self._note_sampled(step + 1, "kernels")

    def _note_sampled(self, step: int, what: str) -> None:
        if len(self.sampled_steps) > 256:
            self.sampled_steps.clear()
        self.sampled_steps[step] = what

    def _control(self, command: str) -> None:
        if command == "kernels_now" and self._kernels is not None:
            self._kernels.request_now()

    def _nvtx_off(self) -> None:
        self._nvtx_disabled = True

    def _nvtx_boundary(self, step: int, wall_s: float) -> None:
        if not self._on_cuda() or self._nvtx_disabled:
            return
        if self._nvtx_open:
            torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push(f"flowtop_step_{step + 1}")
        self._nvtx_open = True

    def _write_calibration(self, step: int) -> None:
        c = self._last_count
        line = {"step": step, "executed_flops": c.executed_flops, "model_flops": c.model_flops}
        try:
            with open(self.cfg.calibrate_out, "a", encoding="utf-8") as fh:  # type: ignore[arg-type]
                fh.write(json.dumps(line) + "\n")
        except OSError as exc:
            warn_once("calibrate-out", f"cannot write {self.cfg.calibrate_out}: {exc}")

    # --- shutdown ----------------------------------------------------------------------

    def close(self, reason: str = "exit") -> None:
        """Say bye (if anything was ever sent) and stop the sender within ~0.5 s."""
        self.tracker.uninstall()
        if self._started:
            self.publisher.publish("bye", {"reason": reason, "steps": self.tracker.step, "drops": self.publisher.drops})
            self.publisher.close(timeout_s=0.5)

    def abandon_in_child(self) -> None:
        """After fork in a child (DataLoader worker): go silent, touch no socket."""
        self.tracker.uninstall()
        self.publisher.abandon()
        self._started = True  # never start a sender in the child
        os.environ["FLOWTOP_DISABLE"] = "1"
