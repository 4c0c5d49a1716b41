"""The step tracker's global optimizer pre-hook, registered only while it has work.

torch calls every global optimizer pre-hook at every ``optimizer.step()`` (~8 µs each after a
long step). The tracker's serves FLOP counting only (it closes a counting window before the
optimizer runs, and tells a closure step), so while the FLOP count in force holds it is removed,
and put back when a step may count again (see :class:`probe.steps.tracker.StepTracker`). Two
things make that safe:

* **Order.** torch calls the global pre-hooks in registration order, and the counting window
  closes in ours: a hook registered after the probe attached (a memory tracker, a gradient
  monitor) ran after it, outside the window. A hook put back goes back to where it was, after
  the hooks that were before it and before every other.
* **When.** Registering while torch loops over those hooks (a model forward run from inside
  another global pre-hook) breaks its loop ("OrderedDict mutated during iteration"): nothing is
  added or removed while an optimizer step runs, but at that step's own end (its post-hooks).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Protocol

from probe._log import warn_once
from probe.hookutil import _has_closure, eager, in_compiled_call

#: torch's step wrapper (``Optimizer.profile_hook_step``): a step's pre-hooks, its step and its
#: post-hooks run inside one call of it.
_STEP_FILE = os.path.join("torch", "optim", "optimizer.py")


def optimizer_steps() -> list[Any]:
    """The frames of the optimizer steps running now (torch's step wrapper), innermost first."""
    out = []
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "wrapper" and code.co_filename.endswith(_STEP_FILE):
            out.append(f)
        f = f.f_back
    return out


def step_call(frame: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(optimizer, args, kwargs) of the step whose wrapper frame is ``frame``, as torch hands them
    to a pre-hook (args with the optimizer first)."""
    args = tuple(frame.f_locals.get("args") or ())
    kwargs = dict(frame.f_locals.get("kwargs") or {})
    return (args[0] if args else None), args, kwargs


def _table() -> Any:
    """torch's global pre-hook table (an ordered mapping id -> hook), or None if it moved."""
    from torch.optim import optimizer

    table = getattr(optimizer, "_global_optimizer_pre_hooks", None)
    return table if hasattr(table, "move_to_end") else None


class PreHook:
    """One global optimizer pre-hook that can be removed and put back where it was."""

    __slots__ = ("_fn", "handle", "_before", "pinned")

    def __init__(self, fn: Callable[[Any, Any, Any], None]) -> None:
        self._fn = fn
        #: torch's handle while registered (torch calls it), else None.
        self.handle: Any = None
        #: The ids of the hooks registered before ours when it was removed (None: never removed).
        self._before: frozenset[int] | None = None
        #: Never added or removed again (a compiled optimizer step, a failure, uninstalled).
        self.pinned = False

    def add(self) -> None:
        """Register it (back where it was). Not while an optimizer step runs (see the module)."""
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        if self.handle is not None or self.pinned:
            return
        self.handle = register_optimizer_step_pre_hook(eager(self._fn))
        table, before = _table(), self._before
        if table is not None and before is not None:
            for key in [k for k in table if k not in before and k != self.handle.id]:
                table.move_to_end(key)  # registered after ours: it runs after ours again

    def remove(self) -> None:
        """Unregister it, remembering which hooks were before it."""
        handle, self.handle = self.handle, None
        if handle is None:
            return
        table = _table()
        if table is not None and handle.id in table:
            keys = list(table)
            self._before = frozenset(keys[:keys.index(handle.id)])
        handle.remove()

    def close(self) -> None:
        """Unregister it for good (the tracker uninstalls)."""
        self.pinned = True
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()


class ForwardGate(Protocol):
    """What the tracker reads to skip the forward listeners of a step that needs nothing."""

    quiet_signature: tuple[Any, ...] | None  # the inputs' signature of the count in force
    quiet_until: int  # ... holds for steps of a lower 0-based index


class PreHookSwitch:
    """The step tracker's switching of its :class:`PreHook` (a base of
    :class:`probe.steps.tracker.StepTracker`): removed while idle, put back for a step that counts.
    Off the per-step path: a steady step with FLOP counting on calls none of it."""

    if not TYPE_CHECKING:
        # No instance layout of its own: StepTracker's slots and __dict__ hold the state (hidden
        # from mypy, which would check the assignments below against this empty tuple).
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's, set in its __init__
        step: int
        in_optimizer: bool
        closure_step: bool
        forward_gate: ForwardGate | None
        listeners_pre_opt: list[Callable[[], None]]
        listeners_forward: list[Callable[[tuple[Any, ...]], None]]
        _pre_hook: PreHook
        _pre_hook_wanted: bool

    def drop_idle_pre_hook(self) -> None:
        """Remove the optimizer pre-hook while it has nothing to do: torch calls it at every step
        (~8 µs each after a long step), and it serves the forward and pre-optimizer listeners
        only (FLOP counting; the layout scan of the first step). The owner calls this once the
        forward listeners are final (after the first step), and the boundary calls it while FLOP
        counting is on (``forward_gate``): a step whose count is in force needs nothing before
        its optimizer, and a forward that calls the listeners puts the hook back first, where it
        was (:meth:`_pre_hook_back`, probe.steps.prehook). Kept under a compiled optimizer step,
        whose graph guards on the global hooks: removing or adding one would recompile it, so
        there it stays for good."""
        hook = self._pre_hook
        try:
            if (hook.handle is None or hook.pinned or self.listeners_pre_opt
                    or (self.listeners_forward and not self._forward_quiet())):
                return
            if in_compiled_call():
                hook.pinned = True
                return
            if len(optimizer_steps()) > 1:  # inside another step's hooks: torch may loop over them
                return
            hook.remove()
            self.in_optimizer = self.closure_step = False
        except Exception as exc:
            hook.pinned = True
            warn_once("pre-hook", f"could not remove the optimizer pre-hook ({exc}); it stays")

    def _pre_hook_back(self) -> None:
        """A forward is about to call the FLOP listeners with the pre-hook removed: put it back for
        this step's optimizer. Inside ``optimizer.step()`` (a closure's forward, or one run from
        another pre-hook) the step's pre-hooks ran or are running (registering now would break
        torch's loop over them): set what ours would have said, and put it back at the step's end."""
        try:
            steps = optimizer_steps()
            if not steps:
                self._pre_hook.add()
                return
            optimizer, args, kwargs = step_call(steps[0])
            self.in_optimizer = True
            self.closure_step = _has_closure(optimizer, args, kwargs)
            self._pre_hook_wanted = True
        except Exception as exc:
            self._pre_hook.pinned = True
            warn_once("pre-hook", f"could not put the optimizer pre-hook back ({exc}); "
                      "FLOP windows close at the boundary")

    def _pre_hook_at_boundary(self) -> None:
        """A step's end (its post-hooks): remove the pre-hook if idle, or put it back if wanted."""
        if self._pre_hook_wanted:
            if self._forward_quiet():
                self._pre_hook_wanted = False
            elif len(optimizer_steps()) <= 1:  # else inside another step's hooks: at a later boundary
                self._pre_hook_wanted = False
                self._pre_hook.add()
        elif self.forward_gate is not None:
            self.drop_idle_pre_hook()

    def _forward_quiet(self) -> bool:
        """Whether the coming step's forward calls no listener if its inputs are the last step's
        (the FLOP count in force holds until a later step)."""
        gate = self.forward_gate
        return gate is not None and gate.quiet_signature is not None and self.step < gate.quiet_until
