"""Shape formulas for the step FLOP counter (used by :mod:`probe.flops.counter`).

Conventions (docs/formulas.md), stated once here and referenced by the UI/JSON:

* One fused multiply-add is 2 FLOPs: a matmul (M×K)·(K×N) costs ``2·M·N·K``.
* Convolution: ``2 · (output elements) · (Cin/groups) · kh · kw`` forward; a transposed
  convolution is counted by its *input* elements instead.  Each requested gradient of
  ``convolution_backward`` (input, weight) costs as much as the forward.  Bias adds are
  elementwise and therefore not counted.
* Attention with Hq query heads, Sq queries, Sk keys, head widths D (q/k) and Dv (v):
  forward ``2·B·Hq·Sq·Sk·(D + Dv)`` (= 4·B·H·Sq·Sk·D, scores plus weighted sum, full square).
  With grouped-query attention the FLOPs use the *query* heads (K/V heads are broadcast).
  Backward as the math requires (model FLOPs): ``2 × forward``.  The fused kernels (flash,
  memory-efficient, cuDNN, CPU flash, flex) also recompute the scores in backward, so they
  *execute* ``2 × forward + 2·B·Hq·Sq·Sk·D`` (= 2.5 × forward when D == Dv).
* The "causal" convention halves the model FLOPs of attention kernels called with causal masking
  (``is_causal=True`` / a causal ``custom_mask_type``); their executed FLOPs are halved whatever
  the convention (the kernel skips the masked half).  Explicit masks (``attn_mask``),
  sliding windows and flex block masks are counted as the full square, and so are
  hand-written attention and SDPA's math fallback, which arrive as plain bmm ops.
  Packed documents are counted per document (Σ sᵢ²) where the op reveals them: varlen
  offsets, or a block-diagonal ``attn_mask`` (model FLOPs only; see probe.flops.packed).
* Grouped GEMMs (MoE experts) cost Σ_g 2·m_g·K·N from their offsets (probe.flops.grouped).
* Elementwise ops, reductions, norms, softmax, embeddings/gathers are by convention *not*
  counted (they are bandwidth work, not FLOPs for MFU).  Ops that do heavy arithmetic but
  have no formula here are reported by name as "uncounted" (see :func:`is_heavy_op_name`),
  never silently treated as zero.

Formulas receive the op's arguments bound to their schema names, so every overload
(``mm``/``mm.dtype``/``mm.out``…) is handled alike. Here: the matmul, convolution and recurrent
families and the table of them all (:data:`FORMULAS`); attention's in :mod:`probe.flops.attention`,
what a formula returns in :mod:`probe.flops.opcost`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from probe.flops.attention import ATTENTION_FORMULAS
from probe.flops.grouped import grouped_mm_flops
from probe.flops.opcost import CONV, MATMUL, Formula, OpCost, dims, same_cost
from probe.flops.precision import fp8_operand

_SCHEMA_CACHE: dict[Any, tuple[tuple[str, bool, bool, Any], ...]] = {}


def bind_arguments(func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map an OpOverload call's positional/keyword arguments to schema names (with defaults)."""
    spec = _SCHEMA_CACHE.get(func)
    if spec is None:
        spec = tuple(
            (a.name, a.kwarg_only, a.has_default_value(), a.default_value if a.has_default_value() else None)
            for a in func._schema.arguments
        )
        _SCHEMA_CACHE[func] = spec
    bound: dict[str, Any] = {}
    pos = 0
    for name, kwarg_only, has_default, default in spec:
        if not kwarg_only and pos < len(args):
            bound[name] = args[pos]
            pos += 1
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif has_default:
            bound[name] = default
    return bound


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


# --- matmul family -------------------------------------------------------------------------

def _mm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """2·M·K·N for (M×K)·(K×N); batched 3-D operands multiply by the batch."""
    ad, bd = dims(a), dims(b)
    batch = math.prod(ad[:-2]) if len(ad) > 2 else 1
    return 2 * batch * ad[-2] * ad[-1] * bd[-1]


def _mm_pair(first: str, second: str) -> Formula:
    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        return same_cost(_mm_flops(b[first], b[second]), MATMUL, b[first])
    return formula


def _mv(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    mat = b.get("mat", b.get("self"))
    rows, cols = dims(mat)
    return same_cost(2 * rows * cols, MATMUL, mat)


def _dot(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    return same_cost(2 * dims(b["self"])[0], MATMUL, b["self"])


def _grouped_mm(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    """MoE grouped GEMM from its group sizes (probe.flops.grouped); fp8 operands name the dtype."""
    a, w, offs = b["self"], b["mat2"], b.get("offs")
    flops, groups = grouped_mm_flops(a, w, offs)
    return OpCost(flops, flops, MATMUL, fp8_operand(a, w), groups=groups, offsets=offs if groups else None)


def _scaled_mm(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    """FP8 GEMM: 2·M·N·K, labelled by the e5m2 operand when the formats differ (probe.flops.precision)."""
    return same_cost(_mm_flops(b["self"], b["mat2"]), MATMUL, fp8_operand(b["self"], b["mat2"]))


def _linear_backward(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    x, w, mask = b["self"], b["weight"], b["output_mask"]
    fwd = 2 * math.prod(dims(x)[:-1]) * dims(w)[0] * dims(w)[1]
    return same_cost(fwd * (int(bool(mask[0])) + int(bool(mask[1]))), MATMUL, x)


# --- convolutions --------------------------------------------------------------------------

def _conv(name: str) -> Formula:
    always_transposed = "transpose" in name

    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        x = b.get("input", b.get("self"))
        w = b["weight"]
        transposed = always_transposed or bool(b.get("transposed", False))
        per_elem = math.prod(dims(w)[1:])  # (Cin/groups)·k… ; transposed: (Cout/groups)·k…
        elems = x.numel() if transposed else math.prod(dims(_first_tensor(out)))
        return same_cost(2 * elems * per_elem, CONV, x)
    return formula


def _conv_backward(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    grad_out = b["grad_output"]
    x = b.get("input", b.get("self"))
    w = b["weight"]
    mask = b["output_mask"]
    transposed = bool(b.get("transposed", False))
    fwd = 2 * (x.numel() if transposed else grad_out.numel()) * math.prod(dims(w)[1:])
    return same_cost(fwd * (int(bool(mask[0])) + int(bool(mask[1]))), CONV, x)


# --- recurrent layers (nn.LSTM / nn.GRU / nn.RNN: one fused op per layer on CPU, all layers on cuDNN) ----

def _rnn_flops(inp: torch.Tensor, weights: Any) -> int:
    """2 FLOPs per weight of the gate matmuls (input-hidden, hidden-hidden, projection: the 2-D
    weights; biases and gate nonlinearities are elementwise) for every row the layers step through:
    each time step of each sequence (T·B, or the packed total), in every layer and direction."""
    rows = inp.numel() // max(1, int(inp.shape[-1]))
    return 2 * rows * sum(w.numel() for w in weights if isinstance(w, torch.Tensor) and w.dim() == 2)


def _mkldnn_rnn(backward: bool) -> Formula:
    """One layer and direction (the CPU's): weights weight0..3 forward, weight1..4 backward, whose
    every gradient (input, hidden state, weights) is computed: twice the forward."""
    names = ("weight1", "weight2", "weight3", "weight4") if backward else ("weight0", "weight1", "weight2", "weight3")

    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        flops = _rnn_flops(b["input"], [b[n] for n in names]) * (2 if backward else 1)
        return same_cost(flops, MATMUL, b["input"])
    return formula


def _cudnn_rnn(backward: bool) -> Formula:
    """Every layer and direction in one call (cuDNN's flat weight list); its backward computes the
    input and hidden-state gradients, and the weights' where ``output_mask[3]`` asks."""
    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        flops = _rnn_flops(b["input"], b["weight"])
        if backward:
            mask = b.get("output_mask") or (True, True, True, True)
            flops *= 1 + bool(mask[3])
        return same_cost(flops, MATMUL, b["input"])
    return formula


FORMULAS: dict[str, Formula] = {
    "aten::mkldnn_rnn_layer": _mkldnn_rnn(False),
    "aten::mkldnn_rnn_layer_backward": _mkldnn_rnn(True),
    "aten::_cudnn_rnn": _cudnn_rnn(False),
    "aten::_cudnn_rnn_backward": _cudnn_rnn(True),
    "aten::mm": _mm_pair("self", "mat2"),
    "aten::bmm": _mm_pair("self", "mat2"),
    "aten::addmm": _mm_pair("mat1", "mat2"),
    "aten::_addmm_activation": _mm_pair("mat1", "mat2"),
    "aten::baddbmm": _mm_pair("batch1", "batch2"),
    "aten::addbmm": _mm_pair("batch1", "batch2"),
    "aten::_int_mm": _mm_pair("self", "mat2"),
    "aten::_scaled_mm": _scaled_mm,
    "aten::_scaled_mm_v2": _scaled_mm,
    "aten::_grouped_mm": _grouped_mm,
    "aten::_scaled_grouped_mm": _grouped_mm,
    "aten::mv": _mv,
    "aten::addmv": _mv,
    "aten::dot": _dot,
    "aten::vdot": _dot,
    "aten::linear_backward": _linear_backward,
    "aten::convolution_backward": _conv_backward,
    "aten::convolution_backward_overrideable": _conv_backward,
}
for _name in (
    "convolution", "_convolution", "convolution_overrideable", "cudnn_convolution",
    "cudnn_convolution_transpose", "cudnn_convolution_relu", "cudnn_convolution_add_relu",
    "_slow_conv2d_forward", "slow_conv3d_forward", "mkldnn_convolution", "_conv_depthwise2d",
    "conv_depthwise3d", "slow_conv_dilated2d", "slow_conv_dilated3d", "slow_conv_transpose2d",
    "slow_conv_transpose3d", "miopen_convolution", "miopen_convolution_transpose",
    "miopen_depthwise_convolution", "_nnpack_spatial_convolution",
):
    FORMULAS["aten::" + _name] = _conv(_name)

FORMULAS.update(ATTENTION_FORMULAS)


_HEAVY_TOKENS = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "linear", "gemm", "einsum", "dot",
    "vdot", "mv", "addmv", "addr", "tensordot", "attention", "attn", "mha", "transformer",
    "rnn", "lstm", "gru", "fft", "fftn", "rfft", "irfft", "linalg", "cholesky", "svd", "qr",
    "eig", "eigh", "solve", "inverse", "lu", "conv", "convolution",
})
_CONV_TOKEN = re.compile(r"conv(?:\d+d|olution|_tbc)?")


def is_heavy_op_name(name: str) -> bool:
    """True for ops whose names say they do matmul/convolution/attention-like arithmetic.

    Used only for ops without a formula, to report them as "uncounted" instead of zero."""
    base = name.split("::")[-1].split(".")[0]
    tokens = base.lower().split("_")
    if "norm" in tokens:  # a norm (gradient clipping's linalg_vector_norm) is a reduction, no matmul
        return False
    for token in tokens:
        if token in _HEAVY_TOKENS or _CONV_TOKEN.fullmatch(token):
            return True
    return False
