"""The dispatch mode of the step FLOP counter (:mod:`probe.flops.counter`), and the plan it keeps
per op overload: skip it, cost it by formula, report it as uncounted, or decompose it to see its
parts.

Apart from the counter because this is the part on every op's path (the counter's window, hooks and
totals are not), and the plan is a pure function of the op, cached by the counter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from probe.flops.attention import HOP_ATTENTION_OPS
from probe.flops.dtensor import DEFER, RUN, route
from probe.flops.formulas import FORMULAS, is_heavy_op_name
from probe.flops.window import Window

#: Higher-order ops that wrap one aten op to preserve its random state (AOT autograd's
#: functionalised RNG, e.g. SDPA under torch.compile + activation checkpointing): name -> where
#: the wrapped op sits in the arguments. ``run_with_rng_state`` replays a forward op in the
#: backward, i.e. it is recomputation (executed, not model FLOPs).
RNG_HOPS = {"run_and_save_rng_state": 0, "run_with_rng_state": 1}
_HOP_FORMULAS = frozenset("higher_order." + n for n in (*HOP_ATTENTION_OPS, *RNG_HOPS))

SKIP, DECOMPOSE, UNCOUNTED, FORMULA = "skip", "decompose", "uncounted", "formula"


@dataclass(frozen=True)
class Plan:
    """What to do with one op overload (cached): its action, formula and display name."""

    action: str
    name: str
    formula: Any = None
    fallback: str = SKIP  # for composites whose decomposition is unavailable


def plan_of(func: Any) -> Plan:
    """The plan of one op overload (or higher-order op)."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        name = "higher_order." + func.name()
        # costed via hop_attention_cost when known; any other HOP hides its ops from us
        plan = Plan(FORMULA if name in _HOP_FORMULAS else UNCOUNTED, name)
    else:
        schema_name = func._schema.name
        name = schema_name.replace("::", ".")
        heavy = UNCOUNTED if is_heavy_op_name(schema_name) else SKIP
        if schema_name in FORMULAS:
            plan = Plan(FORMULA, name, FORMULAS[schema_name])
        elif torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
            plan = Plan(DECOMPOSE, name, fallback=heavy)
        else:
            plan = Plan(heavy, name)
    return plan


class _Owner(Protocol):
    """What the mode reads of its counter (:class:`probe.flops.counter.StepFlopCounter`)."""

    _passthrough: bool
    _window: Window

    def _plan(self, func: Any) -> Plan: ...

    def _disable(self, exc: BaseException) -> None: ...

    def _safe(self, fn: Any, *args: Any) -> None: ...

    def _account(self, func: Any, plan: Plan, action: str, args: tuple, kwargs: dict, out: Any) -> None: ...


class CountingMode(TorchDispatchMode):
    """Runs every op unchanged; costs the ones with formulas.  Never raises its own errors."""

    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let torch.compile compile through us (a non-infra mode makes ``fullgraph=True``
        compiles — eager flex_attention is one — raise); compiled regions then show us only
        the ops they dispatch (extern matmuls), not their generated kernels."""
        return True

    def __init__(self, owner: _Owner) -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        owner = self.owner
        if owner._passthrough:
            return func(*args, **kwargs)
        if types:  # subclass arguments: DTensor's global shapes are no rank's work
            how = route(types)
            if how == DEFER:
                return NotImplemented  # DTensor runs the local ops, which come back to us
            if how == RUN:
                return func(*args, **kwargs)  # fake tensors (sharding propagation) compute nothing
        t0 = time.perf_counter()
        try:
            plan = owner._plan(func)
        except Exception as exc:  # noqa: BLE001 - our bug must not fail the op
            owner._disable(exc)
            return func(*args, **kwargs)
        if plan.action == DECOMPOSE:  # a composite reached us (e.g. inference mode): count its parts
            t1 = time.perf_counter()
            with self:
                out = func.decompose(*args, **kwargs)
            t2 = time.perf_counter()
            owner._window.overhead += (t1 - t0) + (time.perf_counter() - t2)
            if out is not NotImplemented:
                return out
            t0 = time.perf_counter()
        t1 = time.perf_counter()
        out = func(*args, **kwargs)  # inside a HOP our mode is popped: its inner ops are unseen
        t2 = time.perf_counter()
        action = plan.fallback if plan.action == DECOMPOSE else plan.action
        if action != SKIP:
            owner._safe(owner._account, func, plan, action, args, kwargs, out)
        owner._window.overhead += (t1 - t0) + (time.perf_counter() - t2)
        return out
