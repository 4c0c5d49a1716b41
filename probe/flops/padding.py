"""Non-padding tokens of a counted step, from the ``attention_mask`` the model is given.

Convention (README "FP8, MoE and precision"): **tokens count padding**. Tokens per step are the
elements of the token-id tensor (batch × padded length, summed over micro-batches), because that
is what the GEMMs compute on, and the FLOPs per token divide by the same figure. Where a root
forward receives an ``attention_mask=`` keyword (HF models, padded batches) the probe adds, for
the counted step only, the number of its non-zero entries: ``nonpad_tokens`` in the ``flops``
message, so the monitor can show the padding fraction and the real-token rate beside it. It is
sent only when every micro-batch of the counted step had a mask of its token tensor's shape;
packed batches (THD, no padding) carry none and need none.

The same hook reads each micro-batch's sequence length T (as ``accounting.seq_len_of`` reads the
first one's from the step's input signature): with gradient accumulation over micro-batches of
different lengths, the estimate's attention term takes each micro-batch's own T
(:class:`MicroBatchKeys`, probe.flops.estimate).

The root is hooked for the counting window only; the forward it opens in is read from the step
tracker (``StepTracker.forward_inputs``). Reading the mask's sum synchronises the device once per
micro-batch of a counted step only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MicroBatchKeys:
    """Sequence lengths of a counted step's micro-batches: ``tokens`` token ids in all (Σ of each
    micro-batch's ids tensor elements), ``token_keys`` Σ of those elements × the micro-batch's T
    (the attention term is 12·L·d·T per token: Σ over micro-batches is 12·L·d·token_keys), and the
    distinct lengths seen, ascending."""

    tokens: int
    token_keys: int
    lengths: tuple[int, ...]

    @property
    def mean(self) -> float:
        """T per token, token-weighted over the micro-batches."""
        return self.token_keys / self.tokens if self.tokens > 0 else 0.0


class NonPadTokens:
    """Sums ``attention_mask`` entries over the micro-batches of one counting window."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._tokens = 0
        self._seen = 0  # micro-batches with a usable mask
        self._forwards = 0  # micro-batches of the window
        self._ids = self._keys = self._with_keys = 0  # token ids, ids × T, micro-batches with a T
        self._lengths: set[int] = set()

    def start(self, root: torch.nn.Module | None, first: tuple[Any, Any] | None) -> None:
        """Open a window. ``first``: (args, kwargs) of the root forward the window opens in
        (its pre-hooks have run: this one is not called for it). Never raises."""
        self._tokens = self._seen = self._forwards = 0
        self._ids = self._keys = self._with_keys = 0
        self._lengths = set()
        if first is not None:
            self._pre(None, first[0], first[1] or {})
        if root is None:
            return
        try:
            from probe.hookutil import eager

            self._handle = root.register_forward_pre_hook(eager(self._pre), with_kwargs=True)
        except Exception:  # noqa: BLE001 - a ScriptModule refuses hooks: no figure, no harm
            self._handle = None

    def stop(self, forwards: int) -> int | None:
        """Non-padding tokens of the window, or None unless each of its ``forwards`` root
        forwards (micro-batches) had a mask."""
        if self._handle is not None:
            try:
                self._handle.remove()
            except Exception:  # noqa: BLE001
                pass
            self._handle = None
        if forwards <= 0 or self._seen != forwards or self._forwards != forwards:
            return None
        return self._tokens

    def keys(self, forwards: int) -> MicroBatchKeys | None:
        """Each micro-batch's T, or None unless each of the window's ``forwards`` root forwards
        had one (read after :meth:`stop`)."""
        if forwards <= 0 or self._with_keys != forwards or self._forwards != forwards or self._ids <= 0:
            return None
        return MicroBatchKeys(self._ids, self._keys, tuple(sorted(self._lengths)))

    def _pre(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> None:
        # kwargs may be missing: a hook removed by an earlier hook of the same forward (the window
        # closing inside the step tracker's pre-hook) is still called, as a plain pre-hook.
        if self._handle is None and module is not None:
            return  # the window is closed
        if not torch.is_grad_enabled():
            return  # an evaluation forward inside the window is no micro-batch
        try:
            self._forwards += 1
            self._read_keys(args, kwargs or {})
            mask = kwargs.get("attention_mask") if kwargs else None
            ids = kwargs.get("input_ids") if kwargs else None
            if ids is None and args and isinstance(args[0], torch.Tensor):
                ids = args[0]
            if (isinstance(mask, torch.Tensor) and isinstance(ids, torch.Tensor) and mask.dim() == 2
                    and tuple(mask.shape) == tuple(ids.shape)):
                self._tokens += int((mask != 0).sum().item())
                self._seen += 1
        except Exception:  # noqa: BLE001 - never into training
            self._seen = -1

    def _read_keys(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The micro-batch's T as accounting.seq_len_of reads it: the last dim of the first integer
        input of rank ≥ 2 (in signature order), weighted by that input's elements."""
        from probe.flops.policy import signature_of

        for entry in signature_of(args, kwargs):
            if not isinstance(entry, tuple) or len(entry) != 3:
                continue
            _, shape, dtype = entry
            if isinstance(shape, tuple) and len(shape) >= 2 and "int" in str(dtype):
                seq, elements = int(shape[-1]), math.prod(int(n) for n in shape)
                if seq > 0 and elements > 0:
                    self._ids += elements
                    self._keys += elements * seq
                    self._with_keys += 1
                    if len(self._lengths) < 64:
                        self._lengths.add(seq)
                return
