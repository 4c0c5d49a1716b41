"""Hook installation, model discovery and teardown: the step tracker's cold half.

:class:`Discovery` is the base of :class:`probe.steps.tracker.StepTracker`. What it does runs
once (install, uninstall, a failure), once per model (settling the root), or until the root is
known (the global module hooks, removed then): never on a steady-state step. It is kept apart
from the per-step hooks (probe.steps.tracker, probe.steps.forwards), which are measured in
microseconds; every name those read is a global of their module.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

import torch

from probe._log import warn_once
from probe.hookutil import _is_compiled, device_of, eager, params_device, weak

if TYPE_CHECKING:
    from probe.steps.prehook import PreHook

__all__ = ["Discovery"]


def _training_forward() -> bool:
    """Whether a forward now is part of training (autograd on, not inference mode)."""
    return torch.is_grad_enabled() and not torch.is_inference_mode_enabled()


class Discovery:
    """StepTracker's installation, root discovery and teardown (see the module docstring)."""

    if not TYPE_CHECKING:
        # No instance layout of its own: StepTracker's slots and __dict__ hold all the state, at
        # the offsets they had before this base existed. (Hidden from mypy, which would check
        # every assignment below against this empty tuple, not StepTracker's slots.)
        __slots__ = ()

    if TYPE_CHECKING:  # StepTracker's state and hooks that the methods here use
        step: int
        compiled: bool
        device: torch.device | None
        listeners_root: list[Callable[[], None]]
        _on_fail: Callable[[], None] | None
        _root: Callable[[], torch.nn.Module | None]
        _embedding: Callable[[], torch.nn.Module | None]
        _root_lost: bool
        _unsettled: bool
        _roots: int
        _discover_step: int
        _uninstalled: bool
        _idle_calls: int
        _float_rows: int
        tokens: int
        _depth: int
        _forward_end: float | None
        _candidates: dict[int, Callable[[], torch.nn.Module | None]]
        _handles: list[Any]
        _global_handles: list[Any]
        _root_handles: list[Any]
        _pre_hook: PreHook

        def _root_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None: ...
        def _root_post(self, module: torch.nn.Module, args: Any, out: Any) -> None: ...
        def _embedding_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None: ...
        def _opt_post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...

    # --- installation and teardown ----------------------------------------------------

    def install(self) -> None:
        """Register the global optimizer hooks and the discovery module hooks."""
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
        )

        self._pre_hook.add()
        self._handles.append(register_optimizer_step_post_hook(eager(self._opt_post_hook)))
        self._discover()

    def _discover(self) -> None:
        """Register the discovery hooks: every module's forward, until the root is known."""
        # torch.compile(module) warns that global hooks would fire an extra time for its wrapper:
        # ours are gone before it traces (see _global_pre), so the warning would only mislead.
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        mod = torch.nn.modules.module
        self._global_handles.append(mod.register_module_forward_pre_hook(eager(self._global_pre)))
        self._global_handles.append(mod.register_module_forward_hook(eager(self._global_post)))

    @property
    def root(self) -> torch.nn.Module | None:
        """The trained top-level module once settled (held weakly), else None."""
        return self._root()

    @root.setter
    def root(self, module: torch.nn.Module | None) -> None:
        self._root = weak(module, self._root_gone)

    def _root_gone(self, _ref: Any) -> None:
        # Inside the garbage collector, perhaps while torch iterates the hooks: only a flag.
        self._root_lost = True

    def _rediscover(self) -> None:
        """The root was freed: what was learnt of it goes, discovery starts again (from an
        optimizer hook, where adding module hooks is safe)."""
        self._root_lost = False
        if self._uninstalled or self._global_handles:
            return
        for h in self._root_handles:
            h.remove()  # the root's are gone with it; an embedding that outlived it keeps its own
        self._root_handles.clear()
        self.embedding = None
        self.compiled = False
        self._unsettled = True
        self._idle_calls = 0
        self._discover_step = self.step + 1  # this optimizer step's boundary may come after
        self._discover()

    @property
    def embedding(self) -> torch.nn.Module | None:
        """The token embedding whose integer input counts tokens (held weakly), else None."""
        return self._embedding()

    @embedding.setter
    def embedding(self, module: torch.nn.Module | None) -> None:
        self._embedding = weak(module)

    def uninstall(self) -> None:
        """Remove every hook this tracker registered."""
        try:
            self._pre_hook.close()  # for good: no hook comes back
        except Exception:
            pass
        for h in self._handles + self._global_handles + self._root_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        self._global_handles.clear()
        self._root_handles.clear()
        self._uninstalled = True

    def _fail(self, where: str, exc: BaseException) -> None:
        warn_once(f"steps:{where}", f"step tracking failed in {where} ({type(exc).__name__}: {exc}); probe disabled")
        self.uninstall()
        if self._on_fail is not None:
            try:
                self._on_fail()
            except Exception:
                pass

    # --- discovery (until the root is known) -------------------------------------------

    def _global_pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        try:
            if (_is_compiled(module) and _training_forward()
                    and any(p.requires_grad for p in module.parameters())):
                # torch.compile traces what runs inside this module, global hooks included, and
                # guards on them: gone by the time it traces (it traces after this hook), they
                # cost it neither graph breaks nor a recompile when discovery ends. A trained
                # compiled module (not a frozen teacher under no_grad) is the root candidate;
                # its tokens then come from its integer input (see _settle_root).
                self._candidate(module)
                self._drop_global_hooks()
                if self._depth == 0:  # a compiled module inside a wrapper: the wrapper counted
                    self._root_pre(module, args, {})
                    self._count_input_tokens(args, {})
                return
            # Top-level modules with parameters are root candidates (a loss module is not).
            if self._depth == 0 and next(module.parameters(), None) is not None:
                self._idle_calls += 1
                self._candidate(module)
                self._root_pre(module, args, {})
                self._float_rows = _float_rows(args)
            elif self._float_rows < 0 and self.embedding is None:
                # A root called with keywords (``unet(sample=x, class_labels=y)``): global hooks get
                # no kwargs, so the batch is read from the modules that take it before the labels'.
                self._float_rows = _float_rows(args)
            if module is self.embedding:  # every micro-batch of step 1, not just the first
                self._embedding_pre(module, args)
            elif self.embedding is None and isinstance(module, torch.nn.Embedding) and args:
                idx = args[0]
                if (isinstance(idx, torch.Tensor) and not idx.is_floating_point() and _training_forward()
                        and _token_ids(idx, self._float_rows)):
                    self.embedding = module  # not a frozen encoder's under no_grad; see _settle_root
                    self._embedding_pre(module, args)
            self._depth += 1
        except Exception as exc:
            warn_once("discover", f"model discovery failed: {exc}")
        if self._idle_calls > 10_000 and self.step <= self._discover_step:
            # An inference-only process: stop paying for the global hooks.
            self._drop_global_hooks()

    def _global_post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self._forward_end = time.perf_counter()

    def _candidate(self, module: torch.nn.Module) -> None:
        ref = self._candidates.get(id(module))
        if ref is None or ref() is not module:  # new, or an id reused after a module was freed
            self._candidates[id(module)] = weak(module)

    def _drop_global_hooks(self) -> None:
        for h in self._global_handles:
            h.remove()
        self._global_handles.clear()
        self._depth = 0  # dropped inside a wrapper's forward (a compiled model): its post-hook is gone

    def _settle_root(self, optimizer: Any) -> None:
        """At a boundary: pick the root among the top-level modules seen, hook it alone.

        The root is the module holding most of the optimizer's parameters (a frozen
        teacher or reference model, though larger, is not what is trained). With no
        candidate yet (a step before any forward), discovery simply goes on.
        """
        candidates = [m for m in (ref() for ref in self._candidates.values()) if m is not None]
        if not candidates:
            if self.device is None:  # no module forward yet: time the device the parameters live on
                self.device = params_device(optimizer)
            return
        trained: set[int] = set()
        for group in getattr(optimizer, "param_groups", ()):
            trained.update(id(p) for p in group.get("params", ()))

        def score(m: torch.nn.Module) -> tuple[int, int]:
            owned = total = 0
            for p in m.parameters():
                total += p.numel()
                owned += p.numel() if id(p) in trained else 0
            return owned, total

        root = max(candidates, key=score)
        emb = self.embedding
        if emb is not None and not (any(m is emb for m in root.modules()) or id(emb.weight) in trained):
            # A frozen encoder's table outside the trained model (a diffusion model's text
            # encoder run with grad on): its ids are not the model's tokens, this step's included.
            self.embedding = None
            self.tokens = 0
        self._candidates.clear()
        self._drop_global_hooks()
        self.root = root
        self._unsettled = False
        self._roots += 1
        if self._roots > 1:
            for listener in self.listeners_root:
                try:
                    listener()
                except Exception as exc:  # the root is hooked all the same
                    warn_once("new-root", f"after a new model: {type(exc).__name__}: {exc}")
        try:
            # First of the root's pre-hooks: FSDP2's fully_shard prepends its own (the root's
            # all-gather, a wait for the other ranks), which would otherwise read as input wait.
            # Only where the root has one: a prepended hook cost ~3 µs a step more on a root
            # with none (bench/probe_costs.py --hooks, root_pre 12 -> 15-16 µs).
            first = bool(root._forward_pre_hooks)
            self._root_handles.append(root.register_forward_pre_hook(eager(self._root_pre), with_kwargs=True,
                                                                     prepend=first))
            self._root_handles.append(root.register_forward_hook(eager(self._root_post)))
            self.compiled = _is_compiled(root) or any(_is_compiled(m) for m in root.children())
            if self.compiled:
                # A hook on a module inside the compiled region would make torch.compile
                # recompile: count the root's token-id input instead.
                self._root_handles.append(root.register_forward_pre_hook(eager(self._tokens_pre), with_kwargs=True))
            elif self.embedding is not None:
                self._root_handles.append(self.embedding.register_forward_pre_hook(eager(self._embedding_pre)))
        except Exception as exc:  # e.g. ScriptModules refuse hooks: go on without a root
            warn_once("root-hooks", f"cannot hook {type(root).__name__} ({exc}); input wait and tokens unavailable")
            for h in self._root_handles:
                h.remove()
            self._root_handles.clear()
        self.device = device_of(root.parameters())

    # --- a compiled model's tokens (its root's pre-hook: the embedding cannot be hooked) ---

    def _tokens_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._count_input_tokens(args, kwargs)

    def _count_input_tokens(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Tokens of a training forward, for a compiled model whose embedding cannot be hooked:
        ``input_ids=`` when given, else the first int32/int64 tensor of at least two dimensions
        (batch × sequence; class labels and masks are not token ids)."""
        if not _training_forward():
            return
        ids = kwargs.get("input_ids") if kwargs else None
        candidates = [ids] if isinstance(ids, torch.Tensor) else list(args)
        for a in candidates:
            if isinstance(a, torch.Tensor) and a.dtype in (torch.int64, torch.int32) and a.dim() >= 2:
                self.tokens += a.numel()
                return


def _float_rows(args: tuple[Any, ...]) -> int:
    """Rows of the first floating-point input of 2+ dims of a forward (its batch: images, latents,
    features; in a tuple, list or dict argument too), else -1. See :func:`_token_ids`."""
    for a in args:
        for t in (a.values() if isinstance(a, dict) else a if isinstance(a, (tuple, list)) else (a,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() >= 2:
                return int(t.shape[0])
    return -1


def _token_ids(idx: torch.Tensor, float_rows: int) -> bool:
    """Whether an ``nn.Embedding``'s integer index is token ids, beside the forward's float batch
    of ``float_rows`` (-1: none). Token ids come one row per sample (B × L beside images in a
    multimodal model); a class label is one integer per sample (a diffusion model's ``y``: B
    tokens a step before, and a 6·N·B estimate for a model fed no tokens), position ids one row for
    the whole batch (a vision encoder's ``arange(S)`` or (1, S) buffer: S "tokens" before). A packed
    sequence's 1-D token ids come with no float batch: they count."""
    if float_rows < 0:
        return True
    return idx.dim() >= 2 and idx.shape[0] == float_rows
