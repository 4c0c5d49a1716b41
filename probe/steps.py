"""Step detection and timing on the training thread.

Boundaries come from torch's global optimizer step hooks (every framework built
on ``torch.optim``) or from explicit :func:`probe.mark_step` calls; once the
explicit marker is used, optimizer hooks stop counting steps so nothing is
counted twice. Several optimizers stepping with no forward in between are one
training step; all micro-batches between two boundaries belong to one step.

To find the model without code changes, global module hooks watch the first
step: the top-level module with the most parameters becomes the *root* (its
forward pre-hook measures input wait and collects the input signature), and the
first ``nn.Embedding`` fed integer indices counts tokens. The global hooks are
then removed, so steady-state cost is two small hooks per micro-batch plus one
per step.

A forward hook on the root also marks when the last forward of the step ended
(``lead_s``), which tells which rank the others wait for in synchronous training.

Timing: wall time per step on the host, and a CUDA event recorded at each
boundary; events are only ever *queried*, never synchronised, so device times
arrive a few steps late (``dstep`` says which step they belong to).
"""

from __future__ import annotations

import collections
import time
from typing import Any, Callable, Deque

import torch

from probe._log import warn_once

#: Called at every boundary with (step index, wall seconds of the step).
BoundaryListener = Callable[[int, float], None]


class StepTracker:
    """Detects step boundaries and measures each step; owns the torch hooks."""

    def __init__(self, on_step: Callable[[dict[str, Any]], None]) -> None:
        self._on_step = on_step
        self.step = 0
        self.explicit = False
        self.root: torch.nn.Module | None = None
        self.embedding: torch.nn.Module | None = None
        self.signature: tuple[Any, ...] = ()
        self.micro_batches = 0
        self.tokens = 0
        self.device: torch.device | None = None
        self.listeners_pre_opt: list[Callable[[], None]] = []
        self.listeners_boundary: list[BoundaryListener] = []
        self.listeners_forward: list[Callable[[tuple[Any, ...]], None]] = []
        self._last_boundary = time.perf_counter()
        self._input_wait: float | None = None
        self._forward_end: float | None = None
        self._probe_s = 0.0
        self._depth = 0
        self._candidates: dict[int, tuple[int, torch.nn.Module]] = {}
        self._global_handles: list[Any] = []
        self._handles: list[Any] = []
        self._events: Deque[tuple[int, Any]] = collections.deque(maxlen=64)
        self._forward_since_boundary = 0
        self._idle_calls = 0

    # --- installation ---------------------------------------------------------------

    def install(self) -> None:
        """Register the global optimizer hooks and the discovery module hooks."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre_hook))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post_hook))
        mod = torch.nn.modules.module
        self._global_handles.append(mod.register_module_forward_pre_hook(self._global_pre))
        self._global_handles.append(mod.register_module_forward_hook(self._global_post))

    def uninstall(self) -> None:
        """Remove every hook this tracker registered."""
        for h in self._handles + self._global_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        self._global_handles.clear()

    # --- discovery (first step only) ------------------------------------------------

    def _global_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        try:
            if self._depth == 0:
                self._idle_calls += 1
                if id(module) not in self._candidates:
                    n = sum(p.numel() for p in module.parameters())
                    self._candidates[id(module)] = (n, module)
                self._root_pre(module, args)
            if self.embedding is None and isinstance(module, torch.nn.Embedding) and args:
                idx = args[0]
                if isinstance(idx, torch.Tensor) and not idx.is_floating_point():
                    self.embedding = module
                    self._embedding_pre(module, args)
            self._depth += 1
        except Exception as exc:
            warn_once("discover", f"model discovery failed: {exc}")
        if self._idle_calls > 10_000 and self.step == 0:
            # An inference-only process: stop paying for the global hooks.
            self._drop_global_hooks()

    def _global_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def _drop_global_hooks(self) -> None:
        for h in self._global_handles:
            h.remove()
        self._global_handles.clear()

    def _settle_root(self) -> None:
        """After the first step: keep hooks on the root and the embedding only."""
        self._drop_global_hooks()
        if self._candidates:
            _, root = max(self._candidates.values(), key=lambda c: c[0])
            self.root = root
            self._handles.append(root.register_forward_pre_hook(self._root_pre))
            self._handles.append(root.register_forward_hook(self._root_post))
            for p in root.parameters():
                self.device = p.device
                break
        if self.embedding is not None:
            self._handles.append(self.embedding.register_forward_pre_hook(self._embedding_pre))
        self._candidates.clear()

    # --- steady-state hooks ---------------------------------------------------------

    def _root_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self.root is not None and module is not self.root:
            return
        t0 = time.perf_counter()
        if self._forward_since_boundary == 0:
            self._input_wait = t0 - self._last_boundary
            self.signature = tuple(
                (tuple(a.shape), str(a.dtype)) for a in args if isinstance(a, torch.Tensor)
            )
            for listener in self.listeners_forward:
                listener(self.signature)
        self._forward_since_boundary += 1
        self._probe_s += time.perf_counter() - t0

    def _root_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self._forward_end = time.perf_counter()

    def _embedding_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        idx = args[0] if args else None
        if isinstance(idx, torch.Tensor):
            self.tokens += idx.numel()

    def _opt_pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.explicit or self._forward_since_boundary == 0 and self.step > 0:
            return
        for listener in self.listeners_pre_opt:
            listener()

    def _opt_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.explicit:
            return
        # A second optimizer stepping right after the first belongs to the same step.
        if self._forward_since_boundary == 0 and self.step > 0:
            return
        self.boundary()

    def mark(self) -> None:
        """Explicit boundary for loops without torch.optim."""
        if not self.explicit:
            self.explicit = True
        for listener in self.listeners_pre_opt:
            listener()
        self.boundary()

    # --- boundary -------------------------------------------------------------------

    def boundary(self) -> None:
        """Close the current step and open the next one."""
        t0 = time.perf_counter()
        wall = t0 - self._last_boundary
        if self.step == 0:
            self._settle_root()
        self.step += 1
        device_s, dstep = self._device_time()
        fields: dict[str, Any] = {
            "step": self.step,
            "wall_s": wall,
            "tokens": self.tokens,
            "input_wait_s": self._input_wait,
            # Lead: boundary → end of the last forward. In synchronous data parallelism every
            # rank leaves the step together (the gradient all-reduce aligns them), so the rank
            # that finishes its forward last is the one the others wait for.
            "lead_s": (self._forward_end - self._last_boundary)
            if self._forward_end is not None and self._forward_end > self._last_boundary
            else None,
            "device_s": device_s,
            "dstep": dstep,
            "micro_batches": self._forward_since_boundary,
        }
        for listener in self.listeners_boundary:
            try:
                listener(self.step, wall)
            except Exception as exc:
                warn_once("boundary-listener", f"step listener failed: {exc}")
        self.micro_batches = self._forward_since_boundary
        self.tokens = 0
        self._input_wait = None
        self._forward_end = None
        self._forward_since_boundary = 0
        self._probe_s += time.perf_counter() - t0
        fields["probe_s"] = self._probe_s
        self._probe_s = 0.0
        self._on_step(fields)
        self._last_boundary = time.perf_counter()

    def _device_time(self) -> tuple[float | None, int | None]:
        """Record this boundary's CUDA event; return the newest completed step's time."""
        if self.device is None or self.device.type != "cuda":
            return None, None
        try:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((self.step, ev))
            result: tuple[float | None, int | None] = (None, None)
            # Pop completed pairs from the front; query() never blocks.
            while len(self._events) >= 2 and self._events[1][1].query():
                s0, e0 = self._events.popleft()
                s1, e1 = self._events[0]
                result = (e0.elapsed_time(e1) / 1000.0, s1)
            return result
        except Exception as exc:
            warn_once("cuda-events", f"CUDA event timing disabled: {exc}")
            self.device = torch.device("cpu")
            return None, None
