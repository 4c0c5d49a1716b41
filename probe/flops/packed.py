"""Packed sequences (THD): attention FLOPs per document when the op reveals the boundaries.

Several documents packed into one row of length S attend only within themselves, so the math
needs Σ sᵢ² query-key pairs per row, not S². Convention (README "FP8, MoE and precision"):

* **the op reveals the boundaries** → model FLOPs count Σ sᵢ·sᵢ (per packed document):
  - varlen attention (``cu_seqlens``: flash varlen, ``torch.nn.attention.varlen``), in
    probe.flops.attention (``Σ lq·lk`` from the offsets);
  - SDPA with an explicit ``attn_mask`` that is block-diagonal over ≥ 2 documents
    (:func:`mask_documents`), full or causal within each document. The dense kernel still
    computes the whole square with the mask applied, so *executed* FLOPs stay S² per row;
    under the "causal" convention a mask that is causal within every document halves the
    model figure as ``is_causal`` does.
* a square mask that allows no key after its query (a causal mask passed explicitly, padding
  masked or not: :func:`mask_is_causal`) is causal to the convention, as ``is_causal`` is.
* **otherwise** (no mask, ``is_causal`` only, a mask that is not block-diagonal — padding,
  sliding windows, ALiBi-style biases —, masks broadcast over several heads, cross-attention)
  the whole packed row counts S², the default "full" convention of 6N+12LdT, which is
  blind to documents too.

A mask entry allows a pair when it is True (bool) or above ``MASKED_AT`` (−10⁴): ``-inf``, HF's
``finfo.min`` and the −65536 torch hands cuDNN attention for a False entry all mask; smaller
additive values are biases, allowed. Reading the
mask synchronises the device and scans Bm·S² entries, in row chunks of bounded memory, on
sampled steps only; the result is cached for the mask tensor (every layer of a micro-batch and
its backward pass the same one). Masks above ``MAX_ENTRIES`` are not scanned (full square).
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from probe.flops.grouped import _readable

#: Largest mask (batch rows × S × S entries) scanned for documents.
MAX_ENTRIES = 1 << 31
_CHUNK_ENTRIES = 1 << 24  # rows scanned at once: ≈ 16 M entries (uint8 + int64 temporaries)


@dataclass(frozen=True)
class Documents:
    """Documents found in a block-diagonal mask: lengths per mask batch row, causality."""

    lengths: tuple[tuple[int, ...], ...]  # per mask batch row (1 row: broadcast over the batch)
    causal: bool  # every row attends only to itself and earlier positions of its document

    def pairs(self, batch: int) -> int:
        """Σ sᵢ² over the documents of a batch of ``batch`` rows."""
        per_row = [sum(s * s for s in row) for row in self.lengths]
        return per_row[0] * batch if len(per_row) == 1 else sum(per_row)


_cache: dict[str, Any] = {"ref": None, "version": -1, "result": None}


#: An additive mask value at or below this masks its pair: exp(−10⁴) is 0 in every float format,
#: so softmax gives the pair no weight. torch turns a boolean mask into −65536 (bf16) for cuDNN
#: attention (seen on an H200, torch 2.11): half the dtype's lowest value missed it, and a packed
#: row counted its full square there.
MASKED_AT = -1e4


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    if mask.dtype == torch.bool:
        return mask
    return mask > MASKED_AT


def _row_documents(allowed: torch.Tensor) -> tuple[tuple[int, ...], bool] | None:
    """Documents of one (S, S) allowed-matrix, or None when it is not block-diagonal."""
    size = int(allowed.shape[-1])
    rows = max(1, _CHUNK_ENTRIES // max(1, size))
    firsts, lasts = [], []
    for r0 in range(0, size, rows):
        chunk = allowed[r0:r0 + rows].to(torch.uint8)
        counts = chunk.sum(-1)
        if bool((counts == 0).any()):
            return None  # a fully masked row: not a packed layout we can read
        chunk_first = chunk.argmax(-1)
        chunk_last = size - 1 - chunk.flip(-1).argmax(-1)
        if not bool((counts == chunk_last - chunk_first + 1).all()):
            return None  # holes inside a row (strided or random masks)
        firsts.append(chunk_first)
        lasts.append(chunk_last)
    first = torch.cat(firsts).tolist()
    last = torch.cat(lasts).tolist()
    starts = [i for i in range(size) if first[i] == i]
    if not starts or starts[0] != 0:
        return None
    bounds = starts[1:] + [size]
    causal = True
    doc = 0
    for i in range(size):
        while i >= bounds[doc]:
            doc += 1
        start, end = starts[doc], bounds[doc] - 1
        if first[i] != start or last[i] > end:
            return None  # attends outside its block: a sliding window, padding, ...
        if last[i] != i:
            causal = False
            if last[i] != end:
                return None
    return tuple(b - a for a, b in zip(starts, bounds)), causal


def mask_documents(mask: Any, seq_q: int, seq_k: int) -> Documents | None:
    """Documents of a block-diagonal SDPA mask over ≥ 2 documents in some row, else None."""
    try:
        if not isinstance(mask, torch.Tensor) or seq_q != seq_k or not _readable(mask):
            return None
        ref = _cache["ref"]
        if ref is not None and ref() is mask and _cache["version"] == mask._version:
            return _cache["result"]
        result = _scan(mask, seq_q)
        _cache.update(ref=weakref.ref(mask), version=mask._version, result=result)
        return result
    except Exception:  # noqa: BLE001 - a layout we cannot read is counted as the full square
        return None


def _scan(mask: torch.Tensor, size: int) -> Documents | None:
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (size, size):
        return None
    # Masks broadcast right-aligned against (B, H, Sq, Sk): a 3-D mask's first dim is heads. A
    # dim expanded with stride 0 (SDPA expands the bias it hands the CUDA kernels) holds one mask.
    if mask.dim() == 4:
        if int(mask.shape[1]) != 1 and mask.stride(1) != 0:
            return None  # per-head masks: not scanned (every head would need its own pass)
        mask = mask[:, 0]
        if int(mask.shape[0]) > 1 and mask.stride(0) == 0:
            mask = mask[:1]
    elif mask.dim() == 3:
        if int(mask.shape[0]) != 1 and mask.stride(0) != 0:
            return None
        mask = mask[:1]
    elif mask.dim() == 2:
        mask = mask.unsqueeze(0)
    else:
        return None
    if int(mask.shape[0]) * size * size > MAX_ENTRIES:
        return None
    lengths, causal = [], True
    for b in range(int(mask.shape[0])):
        found = _row_documents(_allowed(mask[b]))
        if found is None:
            return None
        lengths.append(found[0])
        causal = causal and found[1]
    if all(len(row) < 2 for row in lengths):
        return None  # one document per row: the ordinary full-square (or causal-flag) case
    return Documents(tuple(lengths), causal)


_causal_cache: dict[str, Any] = {"ref": None, "version": -1, "result": False}


def mask_is_causal(mask: Any, seq_q: int, seq_k: int) -> bool:
    """Whether a square SDPA mask allows no key after its query, in every batch row and head: a
    causal mask passed explicitly, padding masked or not (a Hugging Face model's 4-D mask for a
    padded batch). The causal convention then halves its model FLOPs as ``is_causal`` does (the
    padded positions counted, as tokens count them); the kernel still ran the whole square. A
    fully masked row that was unmasked (left padding under Hugging Face's SDPA path) reads as
    not causal: the full square, as before. Cached per mask tensor; never raises."""
    try:
        if (not isinstance(mask, torch.Tensor) or seq_q != seq_k or mask.dim() < 2
                or tuple(mask.shape[-2:]) != (seq_q, seq_k) or not _readable(mask)):
            return False
        cache = _causal_cache
        ref = cache["ref"]
        if ref is not None and ref() is mask and cache["version"] == mask._version:
            return bool(cache["result"])
        result = _no_pair_after_its_query(mask)
        cache.update(ref=weakref.ref(mask), version=mask._version, result=result)
        return result
    except Exception:  # noqa: BLE001 - unread: the full square
        return False


def _no_pair_after_its_query(mask: torch.Tensor) -> bool:
    # One (S, S) matrix per index of the leading dims, a dim broadcast with stride 0 read once.
    lead = [range(1 if st == 0 else n) for n, st in zip(mask.shape[:-2], mask.stride()[:-2])]
    size = int(mask.shape[-1])
    if size * size * math.prod(map(len, lead)) > MAX_ENTRIES:
        return False
    for idx in itertools.product(*lead):
        if bool(torch.triu(_allowed(mask[idx]), 1).any()):
            return False
    return True
