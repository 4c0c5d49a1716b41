"""When to count a step's FLOPs, and which count to carry between counts (docs/formulas.md,
"How a step is counted").

Counting costs from +1.8 % (large step) to +385 % (small step) of the counted step, so only
sampled steps are counted: the first steady step, steps whose input signature has no count
yet, and a periodic re-check.  Every other step carries the count of its signature.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from probe._log import warn_once

if TYPE_CHECKING:
    from probe.flops.count import FlopCount

_MAX_LEAVES = 64
_MAX_DEPTH = 4


def signature_of(args: tuple, kwargs: Mapping[str, Any]) -> tuple:
    """Shapes and dtypes of the tensors entering the root module, as a hashable tuple.

    Walks (nested) tuples, lists and mappings — HF ``BatchEncoding`` included — up to a
    small depth and leaf count.  Non-tensor values are ignored: they change freely (step
    counters, flags) without changing the FLOPs.  Never raises; returns ``("?",)`` on error.
    Runs at every step's first forward: kept to plain loops and cached dtype names.
    """
    leaves: list[tuple] = []
    try:
        for i, arg in enumerate(args):
            _walk(leaves, _INDEX[i] if i < len(_INDEX) else str(i), arg, 0)
        for key, arg in kwargs.items():
            _walk(leaves, str(key), arg, 0)
        return tuple(leaves)
    except Exception as exc:  # noqa: BLE001 - never into training
        warn_once("flops.signature", f"input signature unavailable: {type(exc).__name__}: {exc}")
        return ("?",)


#: Keyword values signature_of ignores that cached_signature can pass over too.
_IGNORED = (bool, int, float, str, type(None))
_TENSOR = torch.Tensor


def cached_signature(cache: dict[tuple[Any, ...], tuple[Any, ...]], args: tuple[Any, ...],
                     kwargs: dict[str, Any] | None) -> tuple[Any, ...]:
    """:func:`signature_of` a root's inputs, looked up in ``cache`` by their shapes and dtypes when
    they are plain tensors, positional or by keyword (``model(x, y)``, a Hugging Face model's
    ``input_ids=``, ``labels=``; scalar keywords such as ``use_cache=False`` are ignored, as
    signature_of ignores them): the same inputs give the very same tuple, so the FLOP sampler's
    "new signature?" test is an identity check, and the walk runs once per shape instead of once
    per step."""
    return keyed_signature(cache, input_key(args, kwargs), args, kwargs)


def input_key(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[object, ...] | None:
    """What :func:`signature_of` reads of plain tensor inputs (positional, or by keyword with the
    keyword's name), without building it: equal keys give equal signatures. None for inputs it
    does not cover (more or nested values, other objects, a tensor without plain sizes): then
    only signature_of tells. Never raises."""
    if len(args) > 4 or (kwargs and len(kwargs) > 8):
        return None
    key: list[object] = []
    try:
        for a in args:
            if not isinstance(a, _TENSOR):
                return None
            key.append(a.shape)
            key.append(a.dtype)
        if kwargs:
            for name, v in kwargs.items():  # a name is a str, never a shape or dtype: no clash
                if isinstance(v, _TENSOR):
                    key.append(name)
                    key.append(v.shape)
                    key.append(v.dtype)
                elif not isinstance(v, _IGNORED):
                    return None
    except Exception:  # a tensor without a plain shape (nested): signature_of copes
        return None
    return tuple(key)


def keyed_signature(cache: dict[tuple[Any, ...], tuple[Any, ...]], key: tuple[object, ...] | None,
                    args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[Any, ...]:
    """The signature of inputs whose :func:`input_key` is ``key``: the one ``cache`` holds for it, or
    :func:`signature_of` them (kept in ``cache`` when ``key`` is not None)."""
    if key is None:
        return signature_of(args, kwargs or {})
    sig = cache.get(key)
    if sig is None:
        if len(cache) >= 64:  # shapes changing every step: bounded, like the counts carried
            cache.clear()
        sig = cache[key] = signature_of(args, kwargs or {})
    return sig


_INDEX = tuple(str(i) for i in range(16))
_DTYPE_NAMES: dict[Any, str] = {}


def _walk(leaves: list[tuple], path: str, value: Any, depth: int) -> None:
    if len(leaves) >= _MAX_LEAVES:
        return
    if isinstance(value, torch.Tensor):
        dtype = value.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        leaves.append((path, tuple(value.shape), name))
    elif depth < _MAX_DEPTH and isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _walk(leaves, f"{path}.{i}", item, depth + 1)
    elif depth < _MAX_DEPTH and isinstance(value, Mapping):
        for key, item in value.items():
            _walk(leaves, f"{path}.{key}", item, depth + 1)


class CountPolicy:
    """Decides which steps get a FLOP count and carries counts per input signature.

    ``step`` is the 0-based index of the step about to run.  Steps ``< warmup`` are never
    counted (compilation, allocator and cuDNN autotuning make them unrepresentative).  A step
    is counted when it is the first steady step, when ``signature`` has no count yet (and at
    least ``min_gap`` steps passed since the last count — raise it for workloads whose shapes
    change every step), or when ``recheck_every`` steps passed since the last count (0 turns
    re-checks off).

    The signature passed is the one the caller knows when it decides: deciding in the root
    module's forward pre-hook, it is the coming step's own; deciding at the optimizer step,
    it is the previous step's, so a shape change is counted one step after it was seen.
    A signature that comes back (e.g. alternating bucket lengths) is not counted again: its
    carried count is still valid.  At most ``max_signatures`` counts are kept (least
    recently used dropped).  ``should_count`` returning True commits the
    decision (it counts as "last count"); report the outcome with :meth:`record`.
    """

    def __init__(self, warmup: int = 1, recheck_every: int = 500, min_gap: int = 0, max_signatures: int = 64) -> None:
        self.warmup = max(0, int(warmup))
        self.recheck_every = max(0, int(recheck_every))
        self.min_gap = max(0, int(min_gap))
        self.max_signatures = max(1, int(max_signatures))
        self.decisions = 0
        self._last_step: int | None = None
        self._cache: OrderedDict[tuple, FlopCount] = OrderedDict()
        self._failed: set[tuple] = set()

    def should_count(self, step: int, signature: tuple) -> bool:
        """True if the coming step should be counted."""
        if step < self.warmup:
            return False
        last = self._last_step
        due = (
            last is None
            or (signature not in self._cache and signature not in self._failed and step - last >= self.min_gap)
            or (self.recheck_every > 0 and step - last >= self.recheck_every)
        )
        if due:
            self._last_step = step
            self.decisions += 1
        return due

    def record(self, signature: tuple, count: FlopCount | None) -> None:
        """Store the result of a counted step under the signature seen during that step.

        A failed count (``None``) marks the signature so it is not retried before a re-check."""
        if count is None:
            self._failed.add(signature)
            return
        self._failed.discard(signature)
        self._cache[signature] = count
        self._cache.move_to_end(signature)
        while len(self._cache) > self.max_signatures:
            self._cache.popitem(last=False)

    def carried(self, signature: tuple) -> FlopCount | None:
        """The latest count for this signature, if any (to attribute to uncounted steps)."""
        count = self._cache.get(signature)
        if count is not None:
            self._cache.move_to_end(signature)
        return count
