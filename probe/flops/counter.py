"""Counting the FLOPs of one whole training step, on sampled steps only (docs/formulas.md,
"How a step is counted": counting every step would cost +385 % of a small one).

A :class:`StepFlopCounter` pushes a ``TorchDispatchMode`` (:mod:`probe.flops.dispatch`) for the
window between two optimizer steps (all micro-batches).  Every aten op that reaches it is executed
unchanged and, when it has a shape formula (:mod:`probe.flops.formulas`), costed.  We use our own
mode instead of ``torch.utils.flop_counter.FlopCounterMode`` because that one counts 0 for CPU
attention (``_scaled_dot_product_flash_attention_for_cpu``: verified on torch 2.13), never halves
causal attention, cannot tell recomputation from the first forward, and ignores unknown heavy ops.

Two figures come out:

* **model FLOPs** (for MFU): forward + backward as the math requires; attention backward is
  2 × forward; activation-checkpoint recomputation is excluded.
* **executed FLOPs** (for HFU): what ran; fused attention backward (flash, efficient, cuDNN,
  CPU flash, flex) recomputes the scores (2.5 × forward); a fused call made with causal masking
  runs half the square whatever the model convention; recomputation is included.

Recompute detection: ops dispatched inside the autograd engine
(``torch._C._current_graph_task_id() != -1``) while grad mode is on are forward ops being
recomputed — both reentrant (``CheckpointFunction.backward`` runs the function under
``torch.enable_grad()``) and non-reentrant checkpointing (the unpack hook recomputes under
``torch.autograd.enable_grad()``) do this (torch/utils/checkpoint.py).  A backward run with
``create_graph=True`` (double backward) also has grad mode on and is therefore counted as
recompute: a known limitation.

Nothing is derived by formula from the forward ("3 × forward"): frozen parameters and inputs
that need no gradient simply do not dispatch the corresponding backward matmuls.

Counts are local to the rank: a DTensor op is handed back to DTensor (``NotImplemented``) and
its ops on the local shards are costed (TP, sequence parallel, FSDP2 + TP; probe.flops.dtensor).
FSDP computes on gathered plain tensors and is counted per rank as it should be.

Not covered: kernels that bypass the dispatcher — torch.compile/Inductor generated kernels
(we see only the extern matmuls a compiled region dispatches; its fused attention or
triton matmuls are invisible) and custom CUDA extensions.  Use a meta replay of the eager
module for compiled models.  The mode declares ``ignore_compile_internals`` so that
``torch.compile(fullgraph=True)`` (used internally by eager flex_attention) keeps working
while it is active; a torch function mode was ruled out because Dynamo traces it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from probe._log import warn_once
from probe.flops.count import FlopCount
from probe.flops.accounting import unwrap
from probe.flops.attention import hop_attention_cost
from probe.flops.dispatch import RNG_HOPS, UNCOUNTED, CountingMode, Plan, plan_of
from probe.flops.dtensor import ParallelLayout, layout_of
from probe.flops.formulas import FORMULAS, bind_arguments, is_heavy_op_name
from probe.flops.opcost import MATMUL
from probe.flops.policy import CountPolicy, signature_of
from probe.flops.precision import dtype_label
from probe.flops.replicated import ReplicatedLinears
from probe.flops.uncounted import flop_like_size
from probe.flops.window import BATCHED, Window, cap_backward, of_activations, to_count

__all__ = ["FlopCount", "StepFlopCounter", "CountPolicy", "signature_of", "dtype_label"]

ATTENTION_CONVENTIONS = ("full", "causal")


class StepFlopCounter:
    """Counts model and executed FLOPs of one training step.

    ``start()`` is called by the step tracker right after an optimizer step (training thread);
    ``stop()`` from the optimizer-step *pre* hook, i.e. after the last micro-batch's backward
    and before the optimizer runs — so optimizer FLOPs (elementwise anyway) are not counted.
    Call both on the training thread.  Neither ever raises: any failure returns ``None``,
    is logged once and disables the counter for good (``broken``).

    ``root``: the model's root module; when given, its forward calls in the window are the
    ``micro_batches`` figure.  ``attention``: "full" (default, PaLM/torchtitan) or "causal"
    (halves SDPA kernels called with causal masking: CPU flash, flash, efficient, cuDNN).
    Hand-written attention and SDPA's math fallback (taken e.g. on CPU with dropout, or on
    meta tensors) reach us as plain bmm ops whose masking cannot be known: they are always
    counted as the full square — which is also what those kernels execute.
    ``max_window_s``: a window left open longer than this (no optimizer step came) stops
    accounting and is closed at the next ``start``/``stop``/root forward.
    """

    def __init__(
        self, root: torch.nn.Module | None = None, attention: str = "full", max_window_s: float = 600.0,
        module_hooks: bool = True,
    ) -> None:
        if attention not in ATTENTION_CONVENTIONS:
            warn_once("flops.attention", f"unknown attention convention {attention!r}; using 'full'")
            attention = "full"
        self.attention = attention
        self.root = root
        self.max_window_s = max_window_s
        self.broken = False
        self._active = False
        self._passthrough = True
        self._window = Window()
        self._plans: dict[Any, Any] = {}
        self._dispatch_mode: CountingMode | None = None
        self._hook: Any = None
        self._thread = 0
        self._started = 0.0
        self._tf32_matmul = False
        self._tf32_conv = False
        self._autocast: str | None = None
        #: Called with each forward op cost that carries group sizes (MoE grouped GEMMs; probe.flops.moe).
        self.on_groups: Any = None
        # Linears a tensor-parallel group runs whole: their model FLOPs are the group's once
        # (probe.flops.replicated). Not in a torch.compile'd model, whose hooks would recompile it.
        self._replicated = ReplicatedLinears() if module_hooks else None
        #: The root's DTensor layout, read when the window opened (None: none, or no root).
        self.layout: ParallelLayout | None = None

    @property
    def active(self) -> bool:
        """True while a counting window is open."""
        return self._active

    def start(self, in_forward: bool = False) -> None:
        """Open a counting window (no-op once broken).

        ``in_forward``: set when called from inside the root module's forward pre-hook; that
        forward has already started, so it is counted as the first micro-batch here."""
        try:
            if self._dispatch_mode is not None and not self._close():
                raise RuntimeError("a previous counting window could not be closed")
            if self.broken:
                return
            self._window = Window()
            self._window.micro_batches = 1 if in_forward else 0
            self._tf32_matmul = bool(torch.backends.cuda.matmul.allow_tf32) or (
                torch.get_float32_matmul_precision() != "highest")
            self._tf32_conv = bool(torch.backends.cudnn.allow_tf32) and bool(torch.backends.cudnn.enabled)
            self._autocast = self._autocast_label()
            if self.root is not None:
                from probe.hookutil import eager  # runs eagerly inside a compiled region

                self._hook = self.root.register_forward_pre_hook(eager(self._on_root_forward))
                model = unwrap(self.root)
                self.layout = layout_of(model)  # the step's message reads it too (probe.flops.sampling)
                if self._replicated is not None:
                    self._replicated.start(model, self.layout)
            self._thread = threading.get_ident()
            self._dispatch_mode = CountingMode(self)
            self._dispatch_mode.__enter__()
            self._started = time.perf_counter()
            self._passthrough = False
            self._active = True
        except Exception as exc:  # noqa: BLE001 - must never reach training
            self._fail(exc)

    def stop(self) -> FlopCount | None:
        """Close the window and return its count, or ``None`` (not started, expired, broken)."""
        if not self._active:
            return None
        try:
            expired = time.perf_counter() - self._started > self.max_window_s
            if not self._close():
                warn_once("flops.close", "FLOP counter could not leave the dispatch stack (stopped on another "
                          "thread, or another mode left above it); it stays idle until it can")
                return None
            if self.broken or expired:
                return None
            win = self._window
            model, note = cap_backward(win)
            shared = self._replicated.take() if self._replicated is not None else 0
            if shared:  # see probe.flops.replicated
                model -= shared
                note = "; ".join(filter(None, (note, f"Linears run whole on each rank of a tensor-parallel group: "
                                                     f"{shared / max(1, model + shared):.1%} of the count is the "
                                                     "other ranks' share")))
            return to_count(win, model, note, self.attention, self._compute_dtype(win))
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return None

    # --- internals ---------------------------------------------------------------------

    def _close(self) -> bool:
        """End accounting and pop our modes; True once nothing of ours is left installed.

        Modes are popped only from the thread that pushed them and only when they are on
        top of its stacks; otherwise they stay in passthrough and the root pre-hook (or the
        next ``start``) retries."""
        self._passthrough = True
        self._active = False
        if self._dispatch_mode is not None and threading.get_ident() != self._thread:
            return False
        if self._dispatch_mode is not None:
            if _get_current_dispatch_mode() is not self._dispatch_mode:
                return False
            self._dispatch_mode.__exit__(None, None, None)
            self._dispatch_mode = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._replicated is not None:
            self._replicated.close()
        return True

    def _fail(self, exc: BaseException) -> None:
        self.broken = True
        warn_once("flops.count", f"FLOP counting disabled: {type(exc).__name__}: {exc}")
        try:
            self._close()
        except Exception:  # noqa: BLE001 - a mode we cannot pop stays in passthrough
            self._passthrough = True

    def _disable(self, exc: BaseException) -> None:
        """Stop accounting (from inside the dispatch handler, where modes cannot be popped)."""
        self.broken = True
        self._passthrough = True
        warn_once("flops.count", f"FLOP counting disabled: {type(exc).__name__}: {exc}")

    def _safe(self, fn: Any, *args: Any) -> None:
        """Run bookkeeping; a failure disables counting but the op's result is unaffected."""
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001
            self._disable(exc)

    def _on_root_forward(self, module: Any, args: Any) -> None:
        if self._passthrough:
            if not self._active and self._dispatch_mode is not None:
                self._safe(self._close)  # retry a close that could not happen earlier
            return
        if time.perf_counter() - self._started > self.max_window_s:
            self._passthrough = True
            warn_once("flops.expired", "FLOP counting window left open too long (no optimizer step?); abandoned")
            return
        self._window.micro_batches += 1

    def _plan(self, func: Any) -> Plan:
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = plan_of(func)
        return plan

    def _account(self, func: Any, plan: Plan, action: str, args: tuple, kwargs: dict, out: Any) -> None:
        win = self._window
        if action == UNCOUNTED:
            win.uncounted[plan.name] += 1
            win.uncounted_size[plan.name] += flop_like_size(plan.name, args, kwargs, out)
            return
        causal = self.attention == "causal"
        name, recompute = plan.name, False
        if plan.formula is not None:
            cost = plan.formula(bind_arguments(func, args, kwargs), out, causal)
            first = BATCHED.get(name)
            if first is not None and of_activations(first, args):
                win.activation_products += cost.executed
        elif func.name() in RNG_HOPS:
            at = RNG_HOPS[func.name()]
            op, recompute = args[at], func.name() == "run_with_rng_state"
            name = op._schema.name.replace("::", ".")
            formula = FORMULAS.get(op._schema.name)
            if formula is None:
                if is_heavy_op_name(op._schema.name):
                    win.uncounted[name] += 1
                    win.uncounted_size[name] += flop_like_size(name, args[at + 1:], kwargs, out)
                return
            inner_out = out if recompute else out[1]  # run_and_save returns (state, output)
            cost = formula(bind_arguments(op, args[at + 1:], kwargs), inner_out, causal)
        else:  # higher-order attention op
            cost = hop_attention_cost(func.name(), args, causal)
        self._add(win, name, cost, recompute)

    def _add(self, win: Window, name: str, cost: Any, recompute: bool = False) -> None:
        model, executed = cost.model, cost.executed
        in_backward = torch._C._current_graph_task_id() != -1
        if recompute or (in_backward and torch.is_grad_enabled()):
            model = 0  # a forward op run by the autograd engine: activation-checkpoint recompute
        elif in_backward:
            win.backward_model += model
        else:
            win.forward_model += model
            if cost.shape is not None:
                win.attention_shapes[cost.shape] += 1
            seen = cost.pairs
            if seen is not None:
                win.attn_calls += 1
                win.attn_pairs += seen.pairs
                win.attn_queries += seen.queries
                win.attn_documents += seen.documents
                win.attn_causal += seen.causal is True
                win.attn_bidirectional += seen.causal is False
            if cost.groups is not None and self.on_groups is not None:
                self.on_groups(cost)
        if time.perf_counter() - self._started > self.max_window_s:
            self._passthrough = True
            return
        win.model += model
        win.executed += executed
        win.by_op[name] += executed
        t = cost.tensor
        if t is not None and executed:
            label = dtype_label(t.dtype, t.device.type, cost.kind, self._tf32_matmul, self._tf32_conv)
            win.by_dtype[label] += executed
            win.model_by_dtype[label] += model

    def _autocast_label(self) -> str | None:
        """Autocast dtype active at ``start`` (fallback when no costed op names a dtype)."""
        try:
            for dev in ("cuda", "cpu"):
                if torch.is_autocast_enabled(dev):
                    return dtype_label(torch.get_autocast_dtype(dev), dev, MATMUL, False, False)
        except (AttributeError, TypeError, RuntimeError):  # torch < 2.4 lacks the device argument
            pass
        return None

    def _compute_dtype(self, win: Window) -> str:
        """FLOP-weighted dominant operand dtype of the costed ops.

        Our mode sits below autocast, so operands already carry the autocast dtype: the
        weighted majority *is* the compute dtype, and ops autocast leaves in fp32 do not
        hide it.  Fallbacks: the autocast dtype at start, then the root's parameter dtype."""
        if win.by_dtype:
            return max(win.by_dtype.items(), key=lambda kv: kv[1])[0]
        if self._autocast is not None:
            return self._autocast
        if self.root is not None:
            for p in self.root.parameters():
                return dtype_label(p.dtype, p.device.type, MATMUL, self._tf32_matmul, self._tf32_conv)
        return "unknown"
