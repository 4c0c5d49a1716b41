"""FLOPs of one operator call from its name and input shapes (pure Python).

The profiler's ``record_shapes`` gives, per host operator call, the dims of every positional input
(``[]`` for non-tensors) and the values of scalar and int-list inputs ("Concrete Inputs").  These
formulas turn them into FLOPs with the conventions of docs/formulas.md and ``probe.flops.formulas``:

* a fused multiply-add is 2 FLOPs: (M×K)·(K×N) costs 2·M·N·K; batched operands multiply by the
  batch; bias adds are elementwise and not counted;
* convolution: 2 · output elements · (Cin/groups) · kernel elements (transposed: input elements
  instead of output); ``convolution_backward`` costs one forward per requested gradient
  (input, weight);
* attention with query heads H, Sq queries, Sk keys, widths D (q/k) and Dv (v): forward
  2·B·H·Sq·Sk·(D + Dv) (= 4·B·H·Sq·Sk·D); the fused backward ops *execute* 2 × forward plus the
  recomputed scores 2·B·H·Sq·Sk·D (= 2.5 × forward when D == Dv).  These are executed FLOPs,
  because they are divided by kernel time to give an achieved rate.  For the same reason a fused
  call made with ``is_causal`` counts half of that (its kernel skips the masked scores), whatever
  convention the rank's model FLOPs use; ``aten::scaled_dot_product_attention`` as a composite
  and hand-written attention count the full square.

Two kinds of operators have formulas.  :data:`FORMULA_OPS` do the arithmetic themselves (their
kernels run inside them).  :data:`COMPOSITE_OPS` (``aten::matmul``, ``aten::linear``,
``aten::scaled_dot_product_attention``) usually dispatch to a formula op (``aten::mm`` ...), so a
caller counts a composite only when no operator below it has a formula — otherwise the same work
would be counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

Dims = Sequence[Sequence[int]]
Concrete = Sequence[object] | None
_Formula = Callable[[Dims, Concrete], "float | None"]


def parse_concrete(value: object) -> object:
    """A "Concrete Inputs" entry as a Python value.

    The profiler API gives Python values (``[2, 2]``, ``1``, ``True``, ``None``); a Chrome trace
    gives strings (``'[2, 2]'``, ``'1'``, ``'True'``, ``'0.'``, ``''``).  Unparseable text is None.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text in ("", "None"):
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("[") and text.endswith("]"):
        items = [parse_concrete(part) for part in text[1:-1].split(",") if part.strip()]
        return items if all(isinstance(i, (int, bool)) for i in items) else None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return None


def _concrete_at(concrete: Concrete, i: int) -> object:
    if concrete is None or i >= len(concrete):
        return None
    return parse_concrete(concrete[i])


def _matmul_pair(a: Sequence[int], b: Sequence[int]) -> float | None:
    """2·batch·M·N·K for a[..., M, K] · b[..., K, N] (batch dims broadcast; 1-D operands allowed)."""
    if not a or not b:
        return None
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    batch_a, batch_b = list(a[:-2]), list(b[:-2])
    width = max(len(batch_a), len(batch_b))
    batch_a = [1] * (width - len(batch_a)) + batch_a
    batch_b = [1] * (width - len(batch_b)) + batch_b
    batch = math.prod(max(x, y) for x, y in zip(batch_a, batch_b))
    return 2.0 * batch * m * n * k


def _pair(i: int, j: int) -> _Formula:
    def formula(dims: Dims, concrete: Concrete) -> float | None:
        if len(dims) <= max(i, j):
            return None
        return _matmul_pair(dims[i], dims[j])
    return formula


def _mv(i: int) -> _Formula:
    def formula(dims: Dims, concrete: Concrete) -> float | None:
        mat = dims[i] if len(dims) > i else []
        return 2.0 * mat[0] * mat[1] if len(mat) == 2 else None
    return formula


def _dot(dims: Dims, concrete: Concrete) -> float | None:
    return 2.0 * dims[0][0] if dims and len(dims[0]) == 1 else None


def _linear(dims: Dims, concrete: Concrete) -> float | None:
    if len(dims) < 2 or not dims[0] or len(dims[1]) != 2:
        return None
    return 2.0 * math.prod(dims[0][:-1]) * dims[1][0] * dims[1][1]


def _masks(value: object, n: int) -> int:
    """How many of the first ``n`` gradients an ``output_mask`` requests (all when unknown)."""
    if isinstance(value, list) and len(value) >= n:
        return sum(1 for v in value[:n] if v)
    return n


def _linear_backward(dims: Dims, concrete: Concrete) -> float | None:
    # linear_backward(self, grad_output, weight, output_mask)
    fwd = _linear([dims[0], dims[2]], None) if len(dims) >= 3 else None
    return None if fwd is None else fwd * _masks(_concrete_at(concrete, 3), 2)


def _ints(value: object, n: int) -> list[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * n
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return list(value) * n if len(value) == 1 else list(value)
    return None


def _conv(dims: Dims, concrete: Concrete) -> float | None:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if len(dims) < 2 or len(dims[0]) < 3 or len(dims[1]) != len(dims[0]):
        return None
    x, w = dims[0], dims[1]
    per_output = math.prod(w[1:])
    if _concrete_at(concrete, 6) is True:
        return 2.0 * math.prod(x) * per_output
    n_sp = len(x) - 2
    stride = _ints(_concrete_at(concrete, 3), n_sp)
    padding = _ints(_concrete_at(concrete, 4), n_sp)
    dilation = _ints(_concrete_at(concrete, 5), n_sp)
    if stride is None or padding is None or dilation is None:
        return None
    spatial = [
        (x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
        for i in range(n_sp)
    ]
    return 2.0 * x[0] * w[0] * math.prod(spatial) * per_output


def _conv_backward(dims: Dims, concrete: Concrete) -> float | None:
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    if len(dims) < 3 or not dims[0] or not dims[2]:
        return None
    transposed = _concrete_at(concrete, 7) is True
    elems = math.prod(dims[1] if transposed else dims[0])
    fwd = 2.0 * elems * math.prod(dims[2][1:])
    return fwd * _masks(_concrete_at(concrete, 10), 2)


def attention_flops(q: Sequence[int], k: Sequence[int], v: Sequence[int], *, layout: str,
                    backward: bool) -> float | None:
    """Executed FLOPs of one fused attention call (``layout`` "bhsd" or "bshd")."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        return None  # varlen (packed) inputs: sequence lengths are not in the shapes
    if layout == "bhsd":
        b, heads, sq, d = q
        sk, dv = k[2], v[3]
    else:
        b, sq, heads, d = q
        sk, dv = k[1], v[3]
    pairs = b * heads * sq * sk
    fwd = 2.0 * pairs * (d + dv)
    return 2.0 * fwd + 2.0 * pairs * d if backward else fwd


def _attention(first: int, layout: str, backward: bool, causal_at: int | None = None) -> _Formula:
    def formula(dims: Dims, concrete: Concrete) -> float | None:
        if len(dims) < first + 3:
            return None
        f = attention_flops(dims[first], dims[first + 1], dims[first + 2], layout=layout, backward=backward)
        if f is not None and causal_at is not None and _concrete_at(concrete, causal_at) is True:
            f *= 0.5  # a causal kernel skips the masked half of the scores (executed FLOPs)
        return f
    return formula


def _sdpa_composite(dims: Dims, concrete: Concrete) -> float | None:
    if len(dims) < 3 or len(dims[0]) < 2:
        return None
    q, k, v = dims[0], dims[1], dims[2]
    return 2.0 * math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


_FORMULAS: dict[str, _Formula] = {
    "aten::mm": _pair(0, 1),
    "aten::bmm": _pair(0, 1),
    "aten::_scaled_mm": _pair(0, 1),
    "aten::_int_mm": _pair(0, 1),
    "aten::addmm": _pair(1, 2),
    "aten::_addmm_activation": _pair(1, 2),
    "aten::baddbmm": _pair(1, 2),
    "aten::addbmm": _pair(1, 2),
    "aten::mv": _mv(0),
    "aten::addmv": _mv(1),
    "aten::dot": _dot,
    "aten::vdot": _dot,
    "aten::linear_backward": _linear_backward,
    "aten::convolution": _conv,
    "aten::_convolution": _conv,
    "aten::convolution_overrideable": _conv,
    "aten::convolution_backward": _conv_backward,
    "aten::convolution_backward_overrideable": _conv_backward,
    "aten::_flash_attention_forward": _attention(0, "bshd", False, causal_at=8),
    "aten::_flash_attention_backward": _attention(1, "bshd", True, causal_at=11),
    "aten::_efficient_attention_forward": _attention(0, "bshd", False),
    "aten::_efficient_attention_backward": _attention(1, "bshd", True),
}
# Position of ``is_causal`` among each op's arguments (forward, backward), from the aten
# signatures; the cuDNN pair is checked on the H200 fixture, the CPU pair on a real profile.
_CAUSAL_AT: dict[str, tuple[int | None, int | None]] = {
    "flash_attention": (4, 11),
    "efficient_attention": (6, 11),
    "cudnn_attention": (6, 14),
    "flash_attention_for_cpu": (4, 7),
    "fused_attention_overrideable": (None, None),
}
for _sdpa, (_fwd_at, _bwd_at) in _CAUSAL_AT.items():
    _FORMULAS[f"aten::_scaled_dot_product_{_sdpa}"] = _attention(0, "bhsd", False, _fwd_at)
    _FORMULAS[f"aten::_scaled_dot_product_{_sdpa}_backward"] = _attention(1, "bhsd", True, _bwd_at)

_COMPOSITES: dict[str, _Formula] = {
    "aten::matmul": _pair(0, 1),
    "aten::linear": _linear,
    "aten::scaled_dot_product_attention": _sdpa_composite,
}

FORMULA_OPS: frozenset[str] = frozenset(_FORMULAS)
"""Operators whose own kernels do the arithmetic their formula counts."""

COMPOSITE_OPS: frozenset[str] = frozenset(_COMPOSITES)
"""Operators counted only when no operator below them has a formula."""


def op_flops(name: str, dims: Dims, concrete: Concrete = None) -> float | None:
    """FLOPs of one call of operator ``name`` (``aten::mm`` ...), or None when unknown.

    ``dims`` are the input dims as recorded (``Input Dims``), ``concrete`` the concrete inputs
    (Python values or Chrome-trace strings).  Composite operators get their formula too; deciding
    whether a composite call counts (no formula operator below it) is the caller's job.
    """
    formula = _FORMULAS.get(name) or _COMPOSITES.get(name)
    if formula is None:
        return None
    try:
        flops = formula(dims, concrete)
    except (TypeError, ValueError, LookupError, ArithmeticError):  # malformed shapes, stride 0, 2**600
        return None
    return flops if flops is not None and 0 <= flops < math.inf else None
