"""FLOPs of grouped GEMMs (``torch._grouped_mm``, ``torch._scaled_grouped_mm``) from their groups.

MoE experts run one grouped GEMM per expert projection (torchtitan: 3 per expert MLP, w1/w3/w2),
the tokens routed to expert g being rows ``offs[g-1]:offs[g]`` of the input. The cost is what the
routing asked for on this rank, so it follows uneven routing exactly:

    Σ_g 2 · m_g · K · N      (m_g tokens of group g, K×N the expert's weight)

The four operand layouts of ``_grouped_mm`` (``offs`` holds cumulative group ends along the
grouped dimension, int32):

=========  ==================  ==================  ===============  ============================
self       mat2                grouped dim         output           FLOPs
=========  ==================  ==================  ===============  ============================
(M, K)     (G, K, N)           M (tokens)          (M, N)           2·K·N·offs[-1]
(G, M, K)  (K, N)              N                   (M, N)           2·M·K·offs[-1]
(M, K)     (K, N)              K (contraction)     (G, M, N)        2·M·N·offs[-1]   (weight grads)
(G, M, K)  (G, K, N)           none: batched       (G, M, N)        2·G·M·K·N
=========  ==================  ==================  ===============  ============================

Convention: groups are as the offsets give them. Rows a kernel pads each group with for
alignment (torchtitan pads groups to a multiple of 8/16/128 rows) lie inside the offsets: they
are computed and counted. Rows past the last offset are not computed (the CPU kernel leaves them
unwritten) and not counted. Reading the offsets' values synchronises the device once per call:
this only happens on sampled (counted) steps. Fake/meta offsets, and offsets inside a CUDA graph
capture, have no values: the whole grouped dimension is counted then (an upper bound).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

#: The last offsets read, by identity: a layer's w1/w3/w2 GEMMs and their backward share one
#: offsets tensor, so one device synchronisation per MoE layer call instead of six.
_last: dict[str, Any] = {"ref": None, "version": -1, "ends": None}


def _dims(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _readable(t: Any) -> bool:
    """Whether a tensor's values can be read here (not meta/fake, not under graph capture)."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return False
    if type(t).__name__ in ("FakeTensor", "FunctionalTensor"):
        return False
    if t.device.type == "cuda":
        try:
            return not torch.cuda.is_current_stream_capturing()
        except Exception:  # noqa: BLE001 - no CUDA runtime: nothing is capturing
            return True
    return True


def group_sizes(offs: Any, extent: int) -> tuple[int, ...] | None:
    """Per-group sizes from cumulative ``offs`` (None when they cannot be read).

    Each end is clipped to ``extent`` (the grouped dimension's size): a kernel never reads past it."""
    if not _readable(offs) or offs.dim() != 1:
        return None
    ref = _last["ref"]
    if ref is not None and ref() is offs and _last["version"] == offs._version:
        raw = _last["ends"]
    else:
        raw = [int(v) for v in offs.tolist()]
        _last.update(ref=weakref.ref(offs), version=offs._version, ends=raw)
    ends = [min(max(0, v), extent) for v in raw]
    sizes, prev = [], 0
    for end in ends:
        sizes.append(max(0, end - prev))
        prev = max(prev, end)
    return tuple(sizes)


def grouped_mm_flops(a: Any, b: Any, offs: Any) -> tuple[int, tuple[int, ...] | None]:
    """(FLOPs, token group sizes) of one grouped GEMM (the table in the module docstring).

    The group sizes are returned for the token-grouped layout only (2-D × 3-D: the experts'
    forward and input-gradient GEMMs), where they are tokens per expert."""
    ad, bd = _dims(a), _dims(b)
    if len(ad) == 3 and len(bd) == 3:  # batched: every group has the full shape
        return 2 * ad[0] * ad[1] * ad[2] * bd[2], None
    if len(ad) == 2 and len(bd) == 3:
        grouped, rest, extent = "tokens", ad[1] * bd[2], ad[0]
    elif len(ad) == 3 and len(bd) == 2:
        grouped, rest, extent = "n", ad[1] * ad[2], bd[1]
    elif len(ad) == 2 and len(bd) == 2:
        grouped, rest, extent = "k", ad[0] * bd[1], ad[1]
    else:
        return 0, None
    sizes = group_sizes(offs, extent) if offs is not None else None
    rows = sum(sizes) if sizes is not None else extent
    return 2 * rest * rows, (sizes if grouped == "tokens" else None)


def total_flops(sizes: tuple[int, ...], k: int, n: int) -> int:
    """Σ_g 2·m_g·K·N: the hand formula, for tests and the GPU check."""
    return sum(2 * m * k * n for m in sizes)


__all__ = ["grouped_mm_flops", "group_sizes", "total_flops"]
