"""The probe's runtime: wires step tracking, FLOP counting, kernel windows and telemetry
to the publisher. One instance per process (see :func:`probe.attach`).

Every callback that runs on the training thread is wrapped so that a failure
logs once and disables that feature — training goes on untouched.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import deque
from typing import Any, Callable

import torch

from probe import config as config_mod
from probe._log import warn_once
from probe.identity import Identity
from probe.publisher import Publisher
from probe.steps import StepTracker

VERSION = "0.1.0"


def _pow2_at_least(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1), as the kernel window scheduler aligns."""
    p = 1
    while p < n:
        p <<= 1
    return p


def _guard(name: str, fn: Callable[..., None], on_fail: Callable[[], None]) -> Callable[..., None]:
    """Wrap a training-thread callback: the first exception disables the feature."""

    def wrapped(*args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:
            warn_once(name, f"{name} disabled after an error: {type(exc).__name__}: {exc}")
            on_fail()

    wrapped.__wrapped_fn__ = fn  # type: ignore[attr-defined]  # to find it among the listeners
    return wrapped


class Probe:
    """Everything the probe does inside one training process."""

    def __init__(self, cfg: config_mod.ProbeConfig, ident: Identity, flops_per_token: float | None,
                 ident_args: Any = None) -> None:
        self.cfg = cfg
        self.ident = ident
        self._ident_args = ident_args  # probe._AttachArgs: what attach() was told (re-identify)
        self.flops_per_token = flops_per_token if flops_per_token is not None else cfg.flops_per_token
        self.publisher = Publisher(ident.key, cfg.addr, cfg.queue_size, curve_dir=cfg.curve_dir,
                                   flush_s=cfg.flush_s)
        self.tracker = StepTracker(self._on_step, on_fail=self._tracking_failed)
        self.tracker.publisher = self.publisher  # its fast path publishes the common step itself
        self._started = False
        self._flops: Any = None  # probe.flop_sampling.FlopSampler
        self._kernels: Any = None  # probe.kernels.KernelWindowSampler
        self._kernels_active = False
        self._kernels_next = sys.maxsize  # the next step index a window may start at (see _at_boundary)
        self._kernels_waiting = False  # a window waits for a monitor to listen (see _sender_round)
        self._counting = False  # a FLOP counting window may be open (set when one opens)
        self._rare = False  # per-step work few runs have is due (see _refresh_rare)
        self._refused = 0  # commands refused so far: the sender thread keeps it (see _sender_round)
        self._nvtx_open = False
        self._nvtx_disabled = False
        self._count_wall_s: float | None = None  # wall time of the last FLOP-counted step
        self._since_count = 0  # steps since the last count
        self._charge_after = 0  # steps after a count before its cost is charged (set with FLOPs on)
        self._flops_close_pending = False  # a window to close outside a compiled optimizer step
        self._found: Any = None  # probe.parallel.Found: meshes and pipeline stages on the first forward's stack
        self._coords: Any = None  # probe.parallel.Coordinates, from the first step on
        self._stage_timer: Any = None  # probe.pipeline.StageTimer of this rank's pipeline stage(s)
        self._context: dict[str, Any] = {"device_name": "unknown", "flops_per_token": self.flops_per_token,
                                         "local_ranks": ident.local_world_size}
        #: Recent steps that carried a sampled instrument (step -> "flops"/"kernels"),
        #: so benchmarks can separate steady-state cost from sampled cost.
        self.sampled_steps: dict[int, str] = {}

    # --- setup ----------------------------------------------------------------------

    def install(self) -> None:
        """Install hooks and start the sender with a first hello.

        Starting now (not at the first step) makes a rank that hangs in its first
        collective, or compiles for minutes, visible to the monitor at step 0."""
        self.tracker.install()
        self.tracker.listeners_forward.append(_guard("parallel layout", self._scan_layout, self._layout_off))
        self.publisher.hello_fields = self._hello("unknown (before the first step)")
        self.publisher.add_tick(0.0, self._sender_round)
        self.publisher.start()
        if self.cfg.flops:
            self._setup_flops()
        if self.cfg.kernels:
            self._setup_kernels()
        if self.cfg.nvtx:
            self.tracker.listeners_boundary.append(_guard("nvtx", self._nvtx_boundary, self._nvtx_off))

    def _setup_flops(self) -> None:
        try:
            from probe.flop_sampling import CHARGE_AFTER_STEPS, FlopSampler

            self._flops = FlopSampler(
                lambda fields: self.publisher.publish("flops", fields),
                self.cfg.attention,
                self.cfg.recheck_steps,
                self.cfg.flops_budget,
            )
        except Exception as exc:
            warn_once("flops-setup", f"FLOP counting unavailable: {exc}")
            return
        self._charge_after = CHARGE_AFTER_STEPS
        # Not _guard()ed: these run every step and guard their own work (a frame less each).
        self.tracker.listeners_forward.append(self._maybe_start_count)
        self.tracker.listeners_pre_opt.append(self._finish_count)
        self._add_boundary_listener()

    def _flops_off(self) -> None:
        sampler, self._flops = self._flops, None
        self._counting = False
        self._refresh_rare()
        if sampler is not None:
            sampler.close()

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

        self._kernels_next = 0
        self._add_boundary_listener()
        self.publisher.on_control(self._control)

    def _add_boundary_listener(self) -> None:
        self.tracker.on_boundary = self._at_boundary

    @property
    def _ewma_step_s(self) -> float | None:
        """EWMA of the unsampled steps' wall times (the tracker keeps it on its fast path)."""
        return self.tracker.ewma_step_s

    @property
    def _recent_walls(self) -> deque[float]:
        """The last five unsampled steps' wall times: the count charge's baseline."""
        return self.tracker.recent_walls

    def _at_boundary(self, step: int, wall_s: float) -> None:
        """Every boundary, FLOP counting's and kernel windows' share, in that order; each does
        nothing but a test or two unless a window is open or may be due."""
        if self._counting:
            try:
                self._finish_at_boundary(step, wall_s)
                self._counting = self._flops is not None and self._flops.counting
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
            self.publisher.publish_local("telemetry", {"gpu": device, "proc": proc, "reasons": reasons})

        self.publisher.add_tick(self.cfg.telemetry_interval_s, tick)

    def _on_cuda(self) -> bool:
        dev = self.tracker.device
        return dev is not None and dev.type == "cuda"

    # --- per-step work ----------------------------------------------------------------

    def _on_step(self, fields: dict[str, Any]) -> None:
        if not self._started:
            self._first_step()
        step, wall = fields["step"], fields["wall_s"]
        sampled = self.sampled_steps.get(step)
        if sampled == "flops":
            self._count_wall_s = wall  # charged once a steady step time is known
            self._since_count = 0
        else:
            # Every later step counts towards the charge (a kernel window among them must not
            # let the next count come first and overwrite this one's cost).
            self._since_count += 1
            if sampled is None and step > 1:  # step 1 pays warm-up and model discovery
                t = self.tracker
                prev = t.ewma_step_s
                t.ewma_step_s = wall if prev is None else 0.9 * prev + 0.1 * wall
                t.recent_walls.append(wall)
            if self._count_wall_s is not None:
                self._charge_count()
        if self._rare:
            fields = self._rare_step_work(fields)
        refused = self._refused
        if refused:
            fields = dict(fields, commands_refused=refused)
        self.publisher.publish("step", fields)
        self._quiet_after(step)

    def _quiet_after(self, step: int) -> None:
        """Let the tracker publish the coming steps itself (its fast path) up to the first that
        needs this runtime: a sampled step, a window that may start, a count to close or charge,
        a field only the runtime adds. Anything that changes that calls :meth:`_wake`."""
        if (self.tracker.publisher is None or self._count_wall_s is not None or self._rare or self._refused
                or self._counting):
            until = step + 1
        else:
            until = min(self._kernels_next - 1, min((s for s in self.sampled_steps if s > step), default=sys.maxsize))
        self.tracker.quiet_until = max(step + 1, until)

    def _wake(self) -> None:
        """The next boundary goes through this runtime (any thread: the sender's ticks and
        commands too; a lost race only delays it to the next round of the sender, which
        repeats it while the cause lasts)."""
        self.tracker.quiet_until = 0

    def _refresh_rare(self) -> None:
        """Whether :meth:`_rare_step_work` has anything to do, so that the common step tests one
        flag; called wherever its inputs change (the first step, counting's slow path, the
        features turning off)."""
        flops = self._flops
        self._rare = bool((flops is not None and flops.estimate_only) or self.cfg.calibrate_out
                          or self._stage_timer is not None)
        if self._rare:
            self._wake()

    def _sender_round(self) -> None:
        """Sender thread, each round: the commands refused so far (malformed ones, and requests
        the window scheduler turned down), for the next step message to carry; and the next
        boundary through this runtime while that field is due, a window was requested or a
        due window waits for the monitor that now listens (repeated while so: see _wake)."""
        sampler = self._kernels
        self._refused = self.publisher.control_rejected + (sampler.scheduler.refused if sampler is not None else 0)
        kernels = sampler is not None and (sampler.scheduler.requested
                                           or (self._kernels_waiting and self.publisher.subscribers > 0))
        if kernels:
            self._kernels_next = 0
        if kernels or self._refused:
            self._wake()

    def _charge_count(self) -> None:
        if self._flops is not None and self._recent_walls and self._since_count >= self._charge_after:
            # Against the median of the last few steady steps: one slow step (a host hiccup)
            # right after a count must not make the count look free and let counts crowd in.
            typical = statistics.median(self._recent_walls)
            self._flops.charge(self._count_wall_s - typical, typical)  # type: ignore[operator]
            self._count_wall_s = None

    def _rare_step_work(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The per-step work of setups that few runs have (compiled models' estimate,
        ``flowtop calibrate``, pipeline stages): out of the common path."""
        if self._flops is not None and self._flops.estimate_only:
            self._flops.publish_estimate(self.tracker, self._context, fields["tokens"])
        if self.cfg.calibrate_out and self._flops is not None and self._flops.last is not None:
            self._write_calibration(fields["step"])
        if self._stage_timer is not None:
            stage_s = self._stage_timer.take()
            if stage_s is not None:
                fields = dict(fields, stage_s=stage_s)
        return fields

    def _hello(self, device: str) -> dict[str, Any]:
        return {
            "local_rank": self.ident.local_rank,
            "world_size": self.ident.world_size,
            "device": device,
            "probe_version": VERSION,
            "argv": [a[:1024] for a in getattr(sys, "argv", [])[:64]],
            "rank_source": self.ident.rank_source,
            **(self._coords.hello_fields() if self._coords is not None else {}),
        }

    def _scan_layout(self, signature: tuple[Any, ...]) -> None:
        """First training forward: the training loop is on the stack, and so is the pipeline
        schedule calling this stage (probe.parallel); time the stages found (probe.pipeline)."""
        if self._found is not None:
            return
        from probe import parallel

        self._found = parallel.Found()  # set first: a scan that fails is not retried every step
        parallel.scan_stack(sys._getframe(1), self._found)
        if self._found.stages:
            from probe.pipeline import StageTimer

            cuda = any(getattr(getattr(s, "device", None), "type", "") == "cuda" for s in self._found.stages)
            self._stage_timer = StageTimer(self._found.stages, cuda=cuda)
            self._refresh_rare()

    def _layout_off(self) -> None:
        timer, self._stage_timer = self._stage_timer, None
        self._refresh_rare()
        if timer is not None:
            timer.close()

    def _read_layout(self) -> None:
        """At the first boundary: the coordinates for the hello; the stack scan is done."""
        scan = self._scan_layout
        self.tracker.listeners_forward[:] = [f for f in self.tracker.listeners_forward
                                             if getattr(f, "__wrapped_fn__", None) != scan]
        from probe import parallel

        self._coords = parallel.coordinates(self.tracker.root, self._found, self.ident.rank, self.ident.world_size)

    def _first_step(self) -> None:
        self._started = True
        self._reidentify()
        try:
            self._read_layout()
            # the FLOP estimate's attention term spans every cp shard's keys (probe.estimate)
            self._context["cp"] = self._coords.size("cp")
        except Exception as exc:  # noqa: BLE001 - the layout is a label: training goes on
            warn_once("parallel-layout", f"parallel coordinates unavailable: {type(exc).__name__}: {exc}")
        self._context["device_name"] = self._device_name()
        self.publisher.hello_fields = self._hello(self._context["device_name"])
        if self._kernels is not None:
            # Record device activity only if this rank trains on a GPU (a CPU rank on a GPU
            # host would otherwise send empty "cuda" windows).
            self._kernels._cuda = self._on_cuda()
        if self.cfg.telemetry:
            self._setup_telemetry()
        self._refresh_rare()

    def _reidentify(self) -> None:
        """Attached before ``init_process_group`` with no launcher variable (an ``attach()`` at
        the top of a script that Lightning's DDP launcher or ``mp.spawn`` runs): by the first
        step the process group knows the rank. From then on this process speaks under that
        identity; its provisional rank-0 key says bye, so no two processes stay merged as one."""
        if self.ident.rank_source != "none":
            return
        from probe import identity

        args = self._ident_args
        ident = identity.from_env(job=getattr(args, "job", None), world_size=getattr(args, "world_size", None),
                                  local_rank=getattr(args, "local_rank", None))
        if ident.rank_source != "process group" or ident.key == self.ident.key:
            return
        self.ident = ident
        self._context["local_ranks"] = ident.local_world_size
        self.publisher.rekey(ident.key, f"re-identified as rank {ident.rank} of {ident.job} "
                                        "(from the process group)")

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
        flops = self._flops
        if flops is None:
            return
        if (signature is flops.quiet_signature or signature == flops.quiet_signature) \
                and self.tracker.step < flops.quiet_until and not self._flops_close_pending:
            return  # the steady state: the count in force holds (see FlopSampler.quiet_signature)
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
            self._counting = True
            self._wake()
            self._note_sampled(self.tracker.step + 1, "flops")  # 1-based, like the step messages

    def _finish_count(self) -> None:
        if not self._counting:
            return
        flops = self._flops
        if flops is None or not flops.counting:
            self._counting = False
            return
        try:
            if not self._compiled_optimizer():
                flops.finish(self.tracker, self._context, self.tracker.micro_batches)
                self._counting = flops.counting
        except Exception as exc:
            self._feature_failed("flop counting", exc, self._flops_off)

    def _compiled_optimizer(self) -> bool:
        """The optimizer step runs compiled (``torch.compile(opt.step)``): the counting window
        must not close inside it (probe.steps.in_compiled_call). It is closed, and FLOP counting
        turned off, at the next forward, outside the compiled call."""
        from probe.steps import in_compiled_call

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
                self.publisher.publish("kernels", window)
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
        c = self._flops.last
        line = {"step": step, "executed_flops": c.executed_flops, "model_flops": c.model_flops}
        try:
            with open(self.cfg.calibrate_out, "a", encoding="utf-8") as fh:  # type: ignore[arg-type]
                fh.write(json.dumps(line) + "\n")
        except OSError as exc:
            warn_once("calibrate-out", f"cannot write {self.cfg.calibrate_out}: {exc}")

    # --- shutdown ----------------------------------------------------------------------

    def close(self, reason: str = "exit") -> None:
        """Stop counting and profiling, say bye and stop the sender within ~0.5 s."""
        self.tracker.uninstall()
        self._flops_off()
        self._kernels_off()
        self._layout_off()
        self.publisher.publish("bye", {"reason": reason, "steps": self.tracker.step, "drops": self.publisher.drops})
        self.publisher.close(timeout_s=0.5)

    def on_sigterm(self, reason: str) -> None:
        """Say bye before the process dies of SIGTERM (probe.sigterm): from the sender thread
        straight onto its socket, from the main thread through a normal detach."""
        if self.publisher.on_sender_thread():
            self.publisher.send_now("bye", {"reason": reason, "steps": self.tracker.step,
                                            "drops": self.publisher.drops})
            return
        import probe

        probe.detach(reason)

    def _tracking_failed(self) -> None:
        """Step tracking broke: the whole probe steps aside (training goes on)."""
        import probe

        probe.detach("probe error")

    def abandon_in_child(self) -> None:
        """After fork in a child (DataLoader worker): go silent, touch no socket."""
        self.tracker.uninstall()
        self.publisher.abandon()
        self._started = True  # never start a sender in the child
        config_mod.disable_in_children()
