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
from typing import Any, Callable

from probe.hookutil import eager

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
