"""A FLOP-like size for heavy-named ops that have no formula (probe.flops.counter' "uncounted" list).

Why: a name says an op *may* do matmul-like work (``is_heavy_op_name``); it does not say how much.
A tiny ``linalg_det`` or an FFT of a few hundred points next to a model's GEMMs is no reason to
say "MFU is understated". The monitor weighs each uncounted op by this size against the step's
counted FLOPs (flowtop.monitor.hints.measures_device.uncounted_ops).

The sizes are rough **upper-ish estimates** from shapes alone, stated per kind:

* FFTs: ``5·N·⌈log₂N⌉`` for N elements (the radix-2 operation count).
* factorizations / solves (cholesky, qr, svd, eig, lu, solve, inverse, lstsq, det): ``batch·m·n·min(m, n)``
  of the largest input matrix (the order of every dense factorization).
* two or more tensor inputs (contractions: einsum-like, custom GEMMs): ``2·√(a·b·c)`` of the two
  largest inputs' and the largest output's elements — exactly ``2·M·N·K`` for a 2-D matmul, √batch
  too high for a batched one.
* anything else: input plus output elements (one FLOP per element, elementwise work).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

_FFT = frozenset({"fft", "fftn", "rfft", "irfft", "ifft", "hfft", "ihfft", "stft", "istft"})
_FACTOR = frozenset({"cholesky", "qr", "svd", "eig", "eigh", "eigvals", "eigvalsh", "lu", "solve",
                     "inverse", "inv", "lstsq", "det", "slogdet", "pinv", "triangular"})


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(t for t in v if isinstance(t, torch.Tensor))
    return out


def flop_like_size(name: str, args: tuple, kwargs: Mapping[str, Any], out: Any) -> int:
    """FLOP-like size of one call of the uncounted op ``name`` ("aten._fft_r2c"). Never raises."""
    try:
        return _size(name, args, kwargs, out)
    except Exception:  # noqa: BLE001 - a size is advice, the op already ran
        return 0


def _size(name: str, args: tuple, kwargs: Mapping[str, Any], out: Any) -> int:
    parts = name.replace("::", ".").split(".")  # "aten.linalg_det" (namespace, name, overload)
    tokens = set((parts[1] if len(parts) > 1 else parts[0]).lower().split("_"))
    ins = sorted((t for t in _tensors((*args, *kwargs.values())) if t.numel() > 0),
                 key=lambda t: t.numel(), reverse=True)
    outs = _tensors((out,))
    n_out = max((t.numel() for t in outs), default=0)
    if not ins:
        return n_out
    if tokens & _FFT or any(t.startswith("fft") for t in tokens):
        n = max(ins[0].numel(), n_out)
        return 5 * n * max(1, math.ceil(math.log2(max(2, n))))
    if tokens & _FACTOR:
        matrix = next((t for t in ins if t.dim() >= 2), None)
        if matrix is not None:
            m, n = int(matrix.shape[-2]), int(matrix.shape[-1])
            return math.prod(int(s) for s in matrix.shape[:-2]) * m * n * min(m, n)
    if len(ins) >= 2:
        return 2 * math.isqrt(ins[0].numel() * ins[1].numel() * max(1, n_out))
    return ins[0].numel() + n_out
