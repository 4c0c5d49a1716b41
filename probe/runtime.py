"""The probe's runtime: wires step tracking, FLOP counting, kernel windows and telemetry
to the publisher. One instance per process (see :func:`probe.attach`).

Every callback that runs on the training thread is wrapped so that a failure
logs once and disables that feature — training goes on untouched.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any, Callable

import torch

from probe import config as config_mod
from probe._log import warn_once
from probe.identity import Identity
from probe.sampled import SampledFeatures
from probe.steps.tracker import StepTracker
from probe.transport.publisher import Publisher

VERSION = "0.1.0"
#: The tracker's fast path runs at most this many steps in a row: its list of unfolded step walls
#: (StepTracker.walls) is folded here at least that often, so it stays small.
QUIET_MAX = 1024


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


class Probe(SampledFeatures):
    """Everything the probe does inside one training process."""

    def __init__(self, cfg: config_mod.ProbeConfig, ident: Identity, flops_per_token: float | None,
                 ident_args: Any = None, detach: Callable[[str], None] | None = None) -> None:
        #: probe.detach, handed over by probe.attach (the runtime does not import its package).
        self._detach: Callable[[str], None] = detach if detach is not None else self.close
        self.cfg = cfg
        self.ident = ident
        self._ident_args = ident_args  # probe._AttachArgs: what attach() was told (re-identify)
        self.flops_per_token = flops_per_token if flops_per_token is not None else cfg.flops_per_token
        self.publisher = Publisher(ident.key, cfg.addr, cfg.queue_size, curve_dir=cfg.curve_dir,
                                   flush_s=cfg.flush_s, world_size=ident.world_size)
        self.tracker = StepTracker(self._on_step, on_fail=self._tracking_failed)
        self.tracker.publisher = self.publisher  # its fast path publishes the common step itself
        self._started = False
        self._flops: Any = None  # probe.flops.sampling.FlopSampler
        self._kernels: Any = None  # probe.kernels.windows.KernelWindowSampler
        self._kernels_active = False
        self._kernels_next = sys.maxsize  # the next step index a window may start at (see _at_boundary)
        self._kernels_waiting = False  # a window waits for a monitor to listen (see _sender_round)
        self._counting = False  # a FLOP counting window may be open (written by _set_counting only)
        self._rare = False  # per-step work few runs have is due (see _refresh_rare)
        self._refused = 0  # commands refused so far: the sender thread keeps it (see _sender_round)
        self._refused_sent = 0  # ... and the count the last step message carried
        self._dropped = 0  # commands over the sender's bound, dropped unread (probe.transport.gate)
        self._dropped_sent = 0  # ... and the count the last step message carried
        self._woken_at = -1  # the step at which the sender last woke the next boundary (see _sender_round)
        self._nvtx_open = False
        self._nvtx_disabled = False
        self._count_wall_s: float | None = None  # wall time of the last FLOP-counted step
        self._since_count = 0  # steps since the last count
        self._charge_after = 0  # steps after a count before its cost is charged (set with FLOPs on)
        self._flops_close_pending = False  # a window to close outside a compiled optimizer step
        self._found: Any = None  # probe.steps.parallel.Found: meshes and pipeline stages on the first forward's stack
        self._coords: Any = None  # probe.steps.parallel.Coordinates, from the first step on
        self._stage_timer: Any = None  # probe.steps.pipeline.StageTimer of this rank's pipeline stage(s)
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
        self.publisher.step_state = self.tracker.hello_step  # each hello's last step and its age
        self.publisher.add_tick(0.0, self._sender_round)
        self.publisher.start()
        if self.cfg.flops:
            self._setup_flops()
        if self.cfg.kernels:
            self._setup_kernels()
        if self.cfg.nvtx:
            self.tracker.listeners_boundary.append(_guard("nvtx", self._nvtx_boundary, self._nvtx_off))
        self.tracker.start_clocks()  # the setup above is the probe's, not step 1's

    @property
    def _ewma_step_s(self) -> float | None:
        """EWMA of the unsampled steps' wall times (the tracker keeps it on its fast path)."""
        return self.tracker.ewma_step_s

    @property
    def _recent_walls(self) -> deque[float]:
        """The last five unsampled steps' wall times: the count charge's baseline."""
        return self.tracker.recent_walls

    def _setup_telemetry(self) -> None:
        try:
            from probe.telemetry import readers as telemetry

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

        self.publisher.add_tick(self.cfg.telemetry_interval_s, tick, paced=True)  # fewer samples when paced

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
                self.tracker.walls.append(wall)  # the EWMA and the last five (see StepTracker.walls)
            if self._count_wall_s is not None:
                self._charge_count()
        if self._rare:
            fields = self._rare_step_work(fields)
        refused, dropped = self._refused, self._dropped
        if refused or dropped:  # the monitor keeps the largest of each: no need to repeat them
            fields = dict(fields, commands_refused=refused, commands_dropped=dropped)
            self._refused_sent, self._dropped_sent = refused, dropped
        self.publisher.publish("step", fields)
        self._quiet_after(step)

    def _quiet_after(self, step: int) -> None:
        """Let the tracker publish the coming steps itself (its fast path) up to the first that
        needs this runtime: a sampled step, a window that may start, a count to close or charge,
        a field only the runtime adds. Anything that changes that calls :meth:`_wake`."""
        self.tracker.fold_walls()  # at most QUIET_MAX walls since the last time
        if (self.tracker.publisher is None or self._count_wall_s is not None or self._rare
                or self._refused != self._refused_sent or self._dropped != self._dropped_sent or self._counting):
            until = step + 1
        else:
            until = min(self._kernels_next - 1, min((s for s in self.sampled_steps if s > step), default=sys.maxsize),
                        step + QUIET_MAX)
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
        the window scheduler turned down) and dropped unread (over the sender's bound), for the
        next step message to carry; and the next
        boundary through this runtime while that field is due, a window was requested or a
        due window waits for the monitor that now listens (repeated while so: see _wake)."""
        sampler = self._kernels
        self._refused = self.publisher.control_rejected + (sampler.scheduler.refused if sampler is not None else 0)
        self._dropped = self.publisher.commands_dropped
        kernels = sampler is not None and (sampler.scheduler.requested
                                           or (self._kernels_waiting and self.publisher.subscribers > 0))
        if kernels:
            self._kernels_next = 0
        if kernels or self._refused != self._refused_sent or self._dropped != self._dropped_sent:  # new counts, not all
            self._wake()
            step = self.tracker.step
            if step != self._woken_at:  # stepping: a boundary may undo the wake (see _wake), look
                self._woken_at = step  # again soon; a rank that does not step cannot undo it
                self.publisher.soon(0.1)

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
        schedule calling this stage (probe.steps.parallel); time the stages found (probe.steps.pipeline)."""
        if self._found is not None:
            return
        from probe.steps import parallel

        self._found = parallel.Found()  # set first: a scan that fails is not retried every step
        parallel.scan_stack(sys._getframe(1), self._found)
        if self._found.stages:
            from probe.steps.pipeline import StageTimer

            cuda = any(getattr(getattr(s, "device", None), "type", "") == "cuda" for s in self._found.stages)
            self._stage_timer = StageTimer(self._found.stages, cuda=cuda)
            self._refresh_rare()

    def _take_found(self) -> Any:
        """What the layout scan met, taken: the wrappers it met (the user's DDP model) are not
        kept, their process groups are (probe.steps.keepgroups). None when no scan ran."""
        from probe.steps import parallel
        from probe.steps.keepgroups import keep_groups

        found = self._found
        if found is None:
            return None
        self._found = parallel.Found()  # scanned: not again
        keep_groups(self.tracker.root, found)
        return found

    def _layout_off(self) -> None:
        try:
            self._take_found()
        except Exception:  # noqa: BLE001 - detaching goes on
            pass
        timer, self._stage_timer = self._stage_timer, None
        self._refresh_rare()
        if timer is not None:
            timer.close()

    def _read_layout(self) -> None:
        """At the first boundary: the coordinates for the hello; the stack scan is done."""
        scan = self._scan_layout
        self.tracker.listeners_forward[:] = [f for f in self.tracker.listeners_forward
                                             if getattr(f, "__wrapped_fn__", None) != scan]
        from probe.steps import parallel

        found = self._take_found()
        self._coords = parallel.coordinates(self.tracker.root, found, self.ident.rank, self.ident.world_size)

    def _first_step(self) -> None:
        self._started = True
        self._reidentify()
        try:
            self._read_layout()
            # the FLOP estimate's attention term spans every cp shard's keys (probe.flops.estimate)
            self._context["cp"] = self._coords.size("cp")
        except Exception as exc:  # noqa: BLE001 - the layout is a label: training goes on
            warn_once("parallel-layout", f"parallel coordinates unavailable: {type(exc).__name__}: {exc}")
        self.tracker.drop_idle_pre_hook()  # the forward listeners are final now (the scan is gone)
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
        self.publisher.start_for(ident.world_size)  # one float: the sender thread reads it whole
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

    def _nvtx_off(self) -> None:
        self._nvtx_disabled = True

    def _nvtx_boundary(self, step: int, wall_s: float) -> None:
        if not self._on_cuda() or self._nvtx_disabled:
            return
        if self._nvtx_open:
            torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push(f"flowtop_step_{step + 1}")
        self._nvtx_open = True

    # --- shutdown ----------------------------------------------------------------------

    def close(self, reason: str = "exit") -> None:
        """Stop counting and profiling, say bye and stop the sender within ~0.5 s."""
        self.tracker.uninstall()
        self._flops_off()
        self._kernels_off()
        self._layout_off()
        self.publisher.publish_now("bye", {"reason": reason, "steps": self.tracker.step, "drops": self.publisher.drops})
        self.publisher.close(timeout_s=0.5)

    def on_sigterm(self, reason: str) -> None:
        """Say bye before the process dies of SIGTERM (probe.transport.sigterm): from the sender thread
        straight onto its socket, from the main thread through a normal detach."""
        if self.publisher.on_sender_thread():
            self.publisher.send_now("bye", {"reason": reason, "steps": self.tracker.step,
                                            "drops": self.publisher.drops})
            return
        self._detach(reason)

    def _tracking_failed(self) -> None:
        """Step tracking broke: the whole probe steps aside (training goes on)."""
        self._detach("probe error")

    def abandon_in_child(self) -> None:
        """After fork in a child (DataLoader worker): go silent, touch no socket."""
        self.tracker.uninstall()
        self.publisher.abandon()
        self._started = True  # never start a sender in the child
        config_mod.disable_in_children()
