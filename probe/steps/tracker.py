"""Step detection and timing on the training thread.

Boundaries come from torch's global optimizer step hooks (every framework built
on ``torch.optim``) or from explicit :func:`probe.mark_step` calls; once the
explicit marker is used, optimizer hooks stop counting steps so nothing is
counted twice. Several optimizers stepping with no forward in between are one
training step — unless the *same* optimizer steps again, which is a new step
(functional loops without modules; the zero-gradient ``step()`` that
``torch.distributed.checkpoint`` runs when it restores an optimizer). All
micro-batches between two boundaries belong to one step.

To find the model without code changes, global module hooks watch until a
boundary has seen a top-level module: the one holding most of the optimizer's
parameters becomes the *root* (its forward pre-hook measures input wait and the
input signature; its forward hook marks when the step's last forward ended,
``lead_s``, which tells which rank the others wait for in synchronous training),
and the first ``nn.Embedding`` fed integer indices counts tokens. The global
hooks are then removed, so steady-state cost is two small hooks per micro-batch
plus one per step. Forwards run without autograd (evaluation, generation) are
not part of a training step and are ignored.

Timing: wall time per step on the host, and a CUDA event recorded at each
boundary; events are only ever *queried*, never synchronised, so device times
arrive a few steps late (``dstep`` says which step they belong to).

Any failure in these hooks disables the probe (``on_fail``) — the user's
``optimizer.step()`` and ``forward()`` never see an exception from here.

This module holds what closes a step at every step: the optimizer hooks and the boundary. The
forward hooks (probe.steps.forwards), installation, discovery and teardown
(probe.steps.discovery), the reading of the step walls and the hello's step clock
(probe.steps.walls), the switching of the optimizer pre-hook (probe.steps.prehook) and the
device's CUDA events (probe.steps.devclock) are the tracker's base classes, kept apart: all but
the forward hooks run once, at sampled steps, or (the events) from the boundary.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, Callable, Deque

import torch

from probe._log import warn_once
from probe.hookutil import _has_closure, _none, eager, in_compiled_call
from probe.hookutil import _is_compiled as _is_compiled, device_of as device_of  # importable here as before
from probe.hookutil import params_device as params_device, weak as weak  # (used in probe.steps.discovery)
from probe.steps.devclock import DeviceClock, DeviceTiming
from probe.steps.discovery import Discovery
from probe.steps.forwards import ForwardHooks
from probe.steps.prehook import ForwardGate, PreHook, PreHookSwitch
from probe.steps.walls import StepWalls
from probe.transport.steprows import TrainingQueue, step_fields

if TYPE_CHECKING:
    from probe.transport.publisher import Publisher

__all__ = ["StepTracker", "eager", "in_compiled_call"]

#: Called at every boundary with (step index, wall seconds of the step).
BoundaryListener = Callable[[int, float], None]


#: Read at every hook call: module globals, not attribute chains (cold caches after a long step
#: make each lookup cost).
_now = time.perf_counter
_NO_TIME = (None, None)  # no device time (a CPU rank)


class StepTracker(Discovery, StepWalls, PreHookSwitch, DeviceTiming, ForwardHooks):
    """Detects step boundaries and measures each step; owns the torch hooks.

    The optimizer hooks and the boundary are this class's own methods, the forward hooks those of
    :class:`ForwardHooks`; the other bases hold what runs off the per-step path. No base holds
    state (empty ``__slots__``: the instance keeps the layout below).
    """

    # What the per-step hooks read and write, as slots: kept in the object itself, a few cache
    # lines side by side, not spread over the entries of a 40-attribute dict (each cold line
    # costs the hooks a miss after a long step). The rest live in __dict__.
    __slots__ = ("step", "explicit", "_root_lost", "_unsettled", "_root", "_embedding", "micro_batches", "tokens",
                 "_training_now", "in_optimizer", "listeners_boundary", "listeners_forward", "_last_boundary",
                 "_input_origin", "_input_wait", "forward_gate", "_forward_end", "_probe_s", "_stepped",
                 "_forward_since_boundary", "_clock", "_queue", "on_boundary", "quiet_until", "walls", "_on_step",
                 "_pre_hook", "_pre_hook_wanted", "signature", "_input_key", "_first_input",
                 "_first_numel", "__dict__")

    def __init__(self, on_step: Callable[[dict[str, Any]], None], on_fail: Callable[[], None] | None = None) -> None:
        self._on_step = on_step
        self._on_fail = on_fail
        self.step = 0
        self.explicit = False
        # The root and its embedding are held weakly: the probe must never keep the user's model
        # alive (a finished sweep trial's memory; a DDP reducer destroyed during interpreter
        # finalization aborts the process, see tests/test_probe_release.py).
        self._root: Callable[[], torch.nn.Module | None] = _none
        self._embedding: Callable[[], torch.nn.Module | None] = _none
        #: The root was freed (the user dropped the model: a sweep's next trial, a rebuilt
        #: model): discovery starts again at the next optimizer step (see _rediscover).
        self._root_lost = False
        self._unsettled = True  # no root yet (read at every boundary: a flag, not a weakref call)
        #: Called when a root is settled after an earlier one was freed (FLOP counting starts afresh).
        self.listeners_root: list[Callable[[], None]] = []
        self._roots = 0  # roots settled so far
        self._discover_step = 0  # the step at which discovery last started (0, or at _rediscover)
        self._uninstalled = False
        self.compiled = False  # the root is a torch.compile'd module
        self.signature: tuple[Any, ...] = ()
        #: input_key of the root forward that gave ``signature`` (None: none, or one not keyed).
        self._input_key: tuple[object, ...] | None = None
        #: The root forward's first input while it runs, when its key was built in _root_pre
        #: (else None), and that tensor's numel (-1: unknown for the key in force).
        self._first_input: torch.Tensor | None = None
        self._first_numel = -1
        #: (args, kwargs) of the root forward whose forward listeners are being called, else None.
        self.forward_inputs: tuple[Any, Any] | None = None
        self.micro_batches = 0
        self.tokens = 0
        self._float_rows = -1  # discovery: the root forward's float batch (see probe.steps.discovery)
        self._device: torch.device | None = None
        #: The CUDA events of the device, while it is a CUDA device whose events work (read at
        #: every boundary: None says "no device time" in one test).
        self._clock: DeviceClock | None = None
        self._training_now = False  # the root's last forward was a training forward
        self.in_optimizer = False
        #: FLOP counting's state (probe.flops.sampling.FlopSampler): while a forward's signature is
        #: its quiet one, before its quiet_until, the forward listeners have nothing to do and are
        #: not called (a step's forward then costs the signature alone; see _root_pre). All of
        #: them: the forward listeners serve FLOP counting, but for the layout scan of the first
        #: step, which runs before any count is in force. A listener added for anything else
        #: must not rely on being called at every step.
        self.forward_gate: ForwardGate | None = None
        #: The running optimizer step was given a closure: forward and backward run inside it.
        self.closure_step = False
        self.listeners_pre_opt: list[Callable[[], None]] = []
        self.listeners_boundary: list[BoundaryListener] = []
        self.listeners_forward: list[Callable[[tuple[Any, ...]], None]] = []
        self._last_boundary = time.perf_counter()
        self._input_origin = self._last_boundary  # last optimizer post-hook of the step
        self._input_wait: float | None = None
        self._forward_end: float | None = None
        self._probe_s = 0.0
        self._depth = 0
        # id -> weak reference (a WeakValueDictionary would be traced by torch.compile inside a
        # compiled module's call, where the discovery hooks run, and break its graph).
        self._candidates: dict[int, Callable[[], torch.nn.Module | None]] = {}
        #: The optimizers that stepped since the last boundary: the id of the one that ended the
        #: step (a slot written at each boundary: no dict to update), a set once others step with
        #: it (one optimizer per parameter group, or per parameter stepping in backward), -1
        #: before the first step.
        self._stepped: int | set[int] = -1
        self._global_handles: list[Any] = []
        self._handles: list[Any] = []
        self._pre_hook = PreHook(self._opt_pre_hook)  # registered while it has work (see drop_idle_pre_hook)
        self._pre_hook_wanted = False  # put it back at the step's end (see _pre_hook_back)
        self._root_handles: list[Any] = []
        self._forward_since_boundary = 0
        self._idle_calls = 0
        self._signatures: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see cached_signature
        # The common step's fast path (see boundary): steps below ``quiet_until`` are queued here
        # (a row in the publisher's queue) without calling ``on_boundary`` and ``_on_step``, which
        # the owner (probe.runtime) sets up and keeps ``quiet_until`` for. Without it, or at
        # and after that step, every boundary goes through them.
        self._publisher: Publisher | None = None
        self._queue: TrainingQueue | None = None  # the publisher's, where the common step appends its row
        self.on_boundary: BoundaryListener | None = None  # before the step's counters reset
        self.quiet_until = 0
        #: Unsampled steps' wall times, kept on the fast path too: appended there (one list append
        #: per step), folded into the EWMA and the last five when read (see fold_walls).
        self.walls: list[float] = []
        self._ewma_step_s: float | None = None
        self._recent_walls: Deque[float] = collections.deque(maxlen=5)

    @property
    def publisher(self) -> Publisher | None:
        """Where the common step is published (see boundary): set by the owner, None: nowhere
        but ``_on_step``."""
        return self._publisher

    @publisher.setter
    def publisher(self, publisher: Publisher | None) -> None:
        self._publisher = publisher
        self._queue = publisher.queue if publisher is not None else None

    def _is_new_step(self, optimizer: Any) -> bool:
        """A new step, unless another optimizer of this step steps with no forward between."""
        return self._forward_since_boundary > 0 or self.step == 0 or self._stepped_now(id(optimizer))

    def _stepped_now(self, key: int) -> bool:
        """The optimizer of id ``key`` stepped since the last boundary."""
        stepped = self._stepped
        return stepped == key or (type(stepped) is set and key in stepped)

    def _opt_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.in_optimizer = True
            # torch passes (optimizer,) and {} for a plain step(): no closure to look for.
            closure = self.closure_step = (len(args) > 1 or bool(kwargs)) and _has_closure(optimizer, args, kwargs)
            # With a closure the step's (last) forward and backward are still to come, inside
            # step(): pre-optimizer work waits for the boundary (listeners see closure_step).
            # Pre-optimizer listeners (FLOP counting's) act on steps the owner marked as not quiet.
            listeners = self.listeners_pre_opt
            if (listeners and self.step + 1 >= self.quiet_until and not self.explicit and not closure
                    and self._is_new_step(optimizer)):
                for listener in tuple(listeners):  # a listener may remove itself
                    listener()
        except Exception as exc:
            self._fail("optimizer pre-hook", exc)

    def _opt_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if self.in_optimizer:  # set by the pre-hook, if it is still there (see drop_idle_pre_hook)
                self.in_optimizer = self.closure_step = False
            if self.explicit:
                return
            lost = self._root_lost  # the model was dropped: this step trains another (unseen yet)
            if lost:
                self._rediscover()
            key = id(optimizer)
            # _is_new_step, or the first step after the model was dropped
            if lost or self._forward_since_boundary or self.step == 0 or self._stepped == key:
                step = self.step + 1
                if (step >= self.quiet_until or lost or self._unsettled or self.listeners_boundary
                        or self._pre_hook_wanted or self._pre_hook.handle is not None):
                    self.boundary(optimizer)  # sets _input_origin
                else:
                    # The common step: what boundary() does for a quiet step with nothing else to
                    # do, inline here (a call less: ~2 µs after a long step, in-process A/B).
                    # Keep the two alike: tests/test_probe_quiet.py compares their records.
                    t0 = _now()
                    last = self._last_boundary
                    wall = t0 - last
                    self.step = step
                    device_s, dstep = self._device_time() if self._clock is not None else _NO_TIME
                    forwards = self._forward_since_boundary
                    tokens, wait, end = self.tokens, self._input_wait, self._forward_end
                    self.micro_batches = forwards
                    self.tokens = 0
                    self._input_wait = self._forward_end = self._first_input = None
                    self._forward_since_boundary = 0
                    self.walls.append(wall)
                    q = self._queue
                    assert q is not None  # the owner sets quiet_until only with a publisher
                    t1 = _now()
                    q.append((step, t1, wall, tokens, wait, end, last, device_s, dstep, forwards,
                              self._probe_s + (t1 - t0)))
                    q.appended += 1
                    if q.asleep and self._publisher is not None:
                        self._publisher.wake()
                    t2 = self._input_origin = _now()
                    self._probe_s = t2 - t1
                    self._last_boundary = t0
                self._stepped = key
            elif self._stepped_now(key):  # this one steps again with no forward between: a new step
                self.boundary(optimizer)
                self._stepped = key
            else:  # another optimizer of the same step
                self._input_origin = _now()
                stepped = self._stepped
                if isinstance(stepped, set):
                    stepped.add(key)
                else:
                    self._stepped = {stepped, key} if stepped >= 0 else key
        except Exception as exc:
            self._fail("optimizer post-hook", exc)

    def mark(self) -> None:
        """Explicit boundary for loops without torch.optim."""
        try:
            self.explicit = True
            for listener in tuple(self.listeners_pre_opt):  # a listener may remove itself
                listener()
            self.boundary(None)
        except Exception as exc:
            self._fail("mark_step", exc)

    # --- boundary -------------------------------------------------------------------

    def boundary(self, optimizer: Any) -> None:
        """Close the current step and open the next one."""
        t0 = _now()
        last = self._last_boundary
        wall = t0 - last
        if self._unsettled or self._root_lost:
            if self._root_lost:
                self._rediscover()
            self._settle_root(optimizer)
        step = self.step = self.step + 1
        device_s, dstep = self._device_time() if self._clock is not None else _NO_TIME
        end = self._forward_end
        forwards = self._forward_since_boundary
        tokens = self.tokens
        wait = self._input_wait
        quiet = step < self.quiet_until
        if not quiet and self.on_boundary is not None:
            self.on_boundary(step, wall)  # guards itself
        if self.listeners_boundary:  # few runs have any (nvtx): one test on the common step
            for listener in self.listeners_boundary:
                try:
                    listener(step, wall)
                except Exception as exc:
                    warn_once("boundary-listener", f"step listener failed: {exc}")
        self.micro_batches = forwards
        self.tokens = 0
        self._input_wait = None
        self._forward_end = None
        self._first_input = None  # a forward that raised: its root post-hook never ran
        self._forward_since_boundary = 0
        if self._pre_hook_wanted or self._pre_hook.handle is not None:  # FLOP counting: see drop_idle_pre_hook
            self._pre_hook_at_boundary()
        if quiet:  # what the owner's _on_step does for a step with nothing sampled about it
            self.walls.append(wall)  # folded into the EWMA when read (see ewma_step_s)
            q = self._queue
            assert q is not None  # the owner sets quiet_until only with a publisher
            # A row, not a dict, appended here, not through publish(), stamped with t1: see
            # probe.transport.steprows (the sender makes it the record _on_step would publish).
            # The optimizer post-hook does the same inline for the common step.
            t1 = _now()
            q.append((step, t1, wall, tokens, wait, end, last, device_s, dstep, forwards, self._probe_s + (t1 - t0)))
            q.appended += 1  # after the append (see Publisher.publish)
            if q.asleep and self._publisher is not None:  # after the append: the sender checks
                self._publisher.wake()  # the queue after setting it (its publisher's queue)
        else:
            t1 = _now()
            self._on_step(step_fields((step, t1, wall, tokens, wait, end, last, device_s, dstep, forwards,
                                       self._probe_s + (t1 - t0))))
        t2 = self._input_origin = _now()  # the last optimizer post-hook (mark_step) of the step
        self._probe_s = t2 - t1  # the runtime's share: reported with the next step
        # Steps are the intervals between boundary instants: what the probe does here (a kernel
        # window starting or ending, a count closing) belongs to the next step's wall time, so
        # step times add up to the run's wall time, as the framework's own clocks see it.
        self._last_boundary = t0
