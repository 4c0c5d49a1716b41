"""What a shape formula returns: :class:`OpCost` (with the attention call's shape and pairs it may
carry), the op kinds and the :data:`Formula` signature.

Apart from the formulas themselves because every formula family (:mod:`probe.flops.formulas`,
:mod:`probe.flops.attention`) builds these records and the counter, the estimate and the counted
window read them: they sit below all of those.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

MATMUL = "matmul"
CONV = "conv"
ATTENTION = "attention"


@dataclass(frozen=True)
class OpCost:
    """FLOPs of one dispatched op, before recompute/phase accounting.

    ``model`` is what the math requires, ``executed`` what the kernel runs (they differ only
    for fused attention: its backward recomputes the scores, and a causal call skips the masked
    half whatever the model convention).  ``tensor`` is the operand whose dtype/device names
    the compute precision.
    """

    model: int
    executed: int
    kind: str
    tensor: torch.Tensor | None
    #: Attention calls only: the call's dense shape (the estimate reads L, d, T from them).
    shape: AttentionShape | None = None
    #: Attention calls only: its query-key pairs and masking (the estimate's T, the UI's causal note).
    pairs: AttentionPairs | None = None
    #: Grouped GEMMs over tokens only: rows per group (tokens per expert) and the offsets tensor.
    groups: tuple[int, ...] | None = None
    offsets: Any = None


@dataclass(frozen=True)
class AttentionShape:
    """Shape of one dense attention call: batch, query heads, queries, keys, query head width."""

    batch: int
    heads: int
    seq_q: int
    seq_k: int
    head_dim: int


@dataclass(frozen=True)
class AttentionPairs:
    """What one attention call attends: ``pairs`` query-key pairs the model figure takes before any
    causal halving (B·Sq·Sk; Σ sᵢ² over packed documents; Σ lq·lk over varlen offsets) for
    ``queries`` queries (B·Sq, or Σ lq); ``documents``: the op revealed packed documents;
    ``causal``: causal masking (an ``is_causal`` flag, a causal mask type, an explicit mask allowing
    no later key, causal within every document), None where the masking is not read (flex)."""

    pairs: int
    queries: int
    documents: bool
    causal: bool | None


Formula = Callable[[Mapping[str, Any], Any, bool], OpCost]
"""(bound arguments, op output, causal convention on) -> cost."""


def dims(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def same_cost(flops: int, kind: str, tensor: torch.Tensor | None) -> OpCost:
    """The cost of an op whose executed FLOPs are its model FLOPs (all but fused attention)."""
    return OpCost(flops, flops, kind, tensor)
