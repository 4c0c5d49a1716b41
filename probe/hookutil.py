"""Helpers of the probe's torch hooks: running them eagerly under torch.compile, telling a
compiled call from eager code, reading an optimizer step's arguments, and the device a model
trains on.

Kept apart from :mod:`probe.steps.tracker` (which re-exports them) so that module stays about the
step tracker itself.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable, TypeVar

import torch


def eager(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` as torch.compile must run it: eagerly, never traced. A hook that runs inside a
    compiled region (``module.compile()``, a compiled optimizer step) would otherwise be traced
    into the graph and break it at every clock read (seen: 15 graph breaks in 8 steps).

    The probe's package is put on Dynamo's skip list (:func:`_skipped_by_dynamo`): a call into
    it is one graph break and runs eagerly, and our hooks need no wrapper, whose frame switching
    cost ~2 µs per call, five calls per step. Where the skip list cannot be used, each hook is
    wrapped in ``torch.compiler.disable`` instead. Either loads Dynamo (about a second) if
    nothing has yet; creating a torch.optim optimizer loads it anyway."""
    if _skipped_by_dynamo():
        return hook
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


_SKIPPED: list[bool] = []


def _skipped_by_dynamo() -> bool:
    """Put the probe's package on Dynamo's skip list, once; True when Dynamo confirms it."""
    if not _SKIPPED:
        ok = False
        try:
            from torch._dynamo import trace_rules

            trace_rules.add("probe")
            ok = bool(trace_rules.check_file(__file__).skipped)
        except Exception:  # an older or newer Dynamo: fall back to wrapping each hook
            ok = False
        _SKIPPED.append(ok)
    return _SKIPPED[0]


def in_compiled_call() -> bool:
    """Whether the caller runs inside a call compiled by torch.compile (a hook at a graph break
    of a compiled ``optimizer.step`` or ``module.compile()`` region). Entering or leaving a
    dispatch mode there is unsafe: leaving the compiled frame restores torch's dispatch state as
    it found it, which then disagrees with the mode stack (an internal assert in the next op).
    A compiled call leaves a Dynamo wrapper frame on the stack; so do our hooks' own wrappers
    where the skip list was unavailable (see :func:`eager`)."""
    ours = 0 if _SKIPPED and _SKIPPED[0] else 1
    wrappers = 0
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        # The function wrappers only (OptimizedModule.__call__ lives in the same file: a hook of
        # a torch.compile'd module runs outside its compiled forward).
        if code.co_name in ("_fn", "compile_wrapper") and code.co_filename.endswith(_EVAL_FRAME):
            wrappers += 1
            if wrappers > ours or code.co_name == "compile_wrapper":
                return True
        f = f.f_back
    return False


_EVAL_FRAME = "_dynamo" + ("\\" if sys.platform == "win32" else "/") + "eval_frame.py"


def _is_compiled(module: torch.nn.Module) -> bool:
    """``torch.compile(module)`` (an OptimizedModule) or ``module.compile()``."""
    return type(module).__name__ == "OptimizedModule" or getattr(module, "_compiled_call_impl", None) is not None


def _has_closure(optimizer: Any, args: Any, kwargs: Any) -> bool:
    """Whether ``optimizer.step`` was called with a closure (positional or ``closure=``).
    torch hands the hooks the step's positional arguments with the optimizer itself first."""
    closure = (kwargs or {}).get("closure")
    rest = tuple(args or ())
    if rest and rest[0] is optimizer:
        rest = rest[1:]
    if closure is None and rest:
        closure = rest[0]
    return callable(closure)


def params_device(optimizer: Any) -> torch.device:
    """The device the optimizer's parameters compute on (see :func:`device_of`)."""
    params = (p for group in getattr(optimizer, "param_groups", ()) for p in group.get("params", ())
              if isinstance(p, torch.Tensor))
    return device_of(params)


def device_of(params: Any) -> torch.device:
    """The device of the first parameter if a GPU, else the current GPU if any, else the CPU."""
    for p in params:
        if p.device.type == "cuda":
            return p.device
        break
    # CPU-offloaded parameters (FSDP CPUOffload) still compute on the current GPU.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_T = TypeVar("_T")


def _none() -> None:
    return None


def weak(obj: _T | None, on_gone: Callable[[Any], None] | None = None) -> Callable[[], _T | None]:
    """A weak reference to ``obj`` (a callable that gives it, or None once it is gone): what the
    probe keeps of the user's modules, so that it never keeps a model alive. ``on_gone`` is
    weakref's callback (it runs inside the garbage collector: it should only set a flag). An
    object that takes no weak reference is held strongly."""
    if obj is None:
        return _none
    try:
        return weakref.ref(obj, on_gone)
    except TypeError:
        return lambda: obj
