"""The step tracker's forward hooks: the root module's pre- and post-forward hooks and the
embedding's pre-hook, which measure a step's forward side (input wait, the inputs' signature and
the forward listeners it feeds, the end of the last forward, tokens).

:class:`ForwardHooks` is a base of :class:`probe.steps.tracker.StepTracker`, like its other bases
holding no state of its own. Kept apart from the optimizer hooks and the boundary
(probe.steps.tracker), which close a step; both run at every step and are measured in
microseconds: they are registered as bound methods once the root is settled
(probe.steps.discovery), so their class costs no lookup per call, and every name they read is a
global of this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Callable

import torch

from probe.flops.policy import input_key, keyed_signature

if TYPE_CHECKING:
    from probe.steps.prehook import ForwardGate, PreHook

__all__ = ["ForwardHooks"]

#: Read at every hook call: module globals, not attribute chains (cold caches after a long step
#: make each lookup cost).
_now = time.perf_counter
_grad_on = torch.is_grad_enabled
_inference_on = torch.is_inference_mode_enabled
_TENSOR = torch.Tensor


class ForwardHooks:
    """StepTracker's forward hooks (see the module docstring)."""

    if not TYPE_CHECKING:
        # No instance layout of its own: StepTracker's slots and __dict__ hold the state (hidden
        # from mypy, which would check the assignments below against this empty tuple).
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's state and methods that the hooks here use
        step: int
        signature: tuple[Any, ...]
        tokens: int
        in_optimizer: bool
        closure_step: bool
        forward_gate: ForwardGate | None
        forward_inputs: tuple[Any, Any] | None
        listeners_forward: list[Callable[[tuple[Any, ...]], None]]
        _training_now: bool
        _forward_since_boundary: int
        _input_origin: float
        _input_wait: float | None
        _forward_end: float | None
        _input_key: tuple[object, ...] | None
        _first_input: torch.Tensor | None
        _first_numel: int
        _signatures: dict[tuple[Any, ...], tuple[Any, ...]]
        _probe_s: float
        _pre_hook: PreHook

        def _pre_hook_back(self) -> None: ...
        def _fail(self, where: str, exc: BaseException) -> None: ...

    def _root_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Called for the root alone: its own hook, or discovery's global hook while there is none.
        # Decided once per root forward: the embedding and the forward's end read the flag
        # (each torch call costs microseconds when the caches are cold after a long step).
        if not _grad_on() or _inference_on():
            self._training_now = False
            return
        self._training_now = True
        if self._forward_since_boundary:  # a later micro-batch: only counted
            self._forward_since_boundary += 1
            return
        t0 = _now()
        self._input_wait = t0 - self._input_origin
        listeners: Sequence[Callable[[tuple[Any, ...]], None]] = self.listeners_forward
        if listeners:  # the input signature serves FLOP counting only
            try:
                # The steady step's inputs have the last step's shapes and dtypes: told by one
                # compare with the last key read, in C; ``model(x)`` and ``model(x, y)`` build
                # theirs here, without a call (each costs after a long step, from cold caches).
                key: tuple[object, ...] | None = None
                first = None  # args[0], when a plain tensor whose shape the key holds
                if not kwargs and 0 < len(args) < 3:
                    a = args[0]
                    if type(a) is _TENSOR:
                        try:
                            if len(args) == 1:
                                key = (a.shape, a.dtype)
                            else:
                                b = args[1]
                                if type(b) is _TENSOR:
                                    key = (a.shape, a.dtype, b.shape, b.dtype)
                            first = a
                        except Exception:  # a nested tensor has no plain shape: input_key says None
                            key = None
                if key is None:
                    key = input_key(args, kwargs)
                if key is not None and key == self._input_key:
                    sig = self.signature
                else:
                    sig = self.signature = keyed_signature(self._signatures, key, args, kwargs)
                    self._input_key = key
                    self._first_numel = first.numel() if first is not None else -1
                # The embedding is mostly fed this very tensor: its hook then takes the tokens
                # from here, not from another torch call (held for this forward alone).
                self._first_input = first if self._first_numel >= 0 else None
                gate = self.forward_gate
                if gate is not None and self.step < gate.quiet_until and (
                        sig is gate.quiet_signature or sig == gate.quiet_signature):
                    listeners = ()  # the steady state: the count in force holds
                # A closure optimizer (Lightning's automatic optimization, LBFGS) runs the
                # step's forward inside step(): that forward is the step's forward too.
                if listeners and self._pre_hook.handle is None and not self._pre_hook.pinned:
                    self._pre_hook_back()  # for this step's optimizer
                if listeners and (not self.in_optimizer or self.closure_step):
                    self.forward_inputs = (args, kwargs)  # for listeners that read values (probe.flops.padding)
                    try:
                        for listener in listeners:
                            listener(self.signature)
                    finally:
                        self.forward_inputs = None  # never the user's batch past its forward
            except Exception as exc:
                self._fail("forward", exc)
        self._forward_since_boundary = 1
        self._probe_s += _now() - t0

    def _root_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._training_now:
            self._forward_end = _now()
            self._first_input = None  # never the user's batch past its forward

    def _embedding_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self._training_now and args:
            x = args[0]
            if x is self._first_input:  # the root's first input (see _root_pre): its size is known
                self.tokens += self._first_numel
            elif isinstance(x, torch.Tensor):
                self.tokens += x.numel()

    @property
    def forwards_this_step(self) -> int:
        """Root forwards (micro-batches) since the last boundary."""
        return self._forward_since_boundary
