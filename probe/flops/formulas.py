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
(``mm``/``mm.dtype``/``mm.out``…) is handled alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from probe.flops.grouped import grouped_mm_flops
from probe.flops.packed import mask_documents, mask_is_causal
from probe.flops.precision import fp8_operand

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


def _dims(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                return item
    return None


def _same(flops: int, kind: str, tensor: torch.Tensor | None) -> OpCost:
    return OpCost(flops, flops, kind, tensor)


# --- matmul family -------------------------------------------------------------------------

def _mm_flops(a: torch.Tensor, b: torch.Tensor) -> int:
    """2·M·K·N for (M×K)·(K×N); batched 3-D operands multiply by the batch."""
    ad, bd = _dims(a), _dims(b)
    batch = math.prod(ad[:-2]) if len(ad) > 2 else 1
    return 2 * batch * ad[-2] * ad[-1] * bd[-1]


def _mm_pair(first: str, second: str) -> Formula:
    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        return _same(_mm_flops(b[first], b[second]), MATMUL, b[first])
    return formula


def _mv(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    mat = b.get("mat", b.get("self"))
    rows, cols = _dims(mat)
    return _same(2 * rows * cols, MATMUL, mat)


def _dot(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    return _same(2 * _dims(b["self"])[0], MATMUL, b["self"])


def _grouped_mm(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    """MoE grouped GEMM from its group sizes (probe.flops.grouped); fp8 operands name the dtype."""
    a, w, offs = b["self"], b["mat2"], b.get("offs")
    flops, groups = grouped_mm_flops(a, w, offs)
    return OpCost(flops, flops, MATMUL, fp8_operand(a, w), groups=groups, offsets=offs if groups else None)


def _scaled_mm(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    """FP8 GEMM: 2·M·N·K, labelled by the e5m2 operand when the formats differ (probe.flops.precision)."""
    return _same(_mm_flops(b["self"], b["mat2"]), MATMUL, fp8_operand(b["self"], b["mat2"]))


def _linear_backward(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    x, w, mask = b["self"], b["weight"], b["output_mask"]
    fwd = 2 * math.prod(_dims(x)[:-1]) * _dims(w)[0] * _dims(w)[1]
    return _same(fwd * (int(bool(mask[0])) + int(bool(mask[1]))), MATMUL, x)


# --- convolutions --------------------------------------------------------------------------

def _conv(name: str) -> Formula:
    always_transposed = "transpose" in name

    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        x = b.get("input", b.get("self"))
        w = b["weight"]
        transposed = always_transposed or bool(b.get("transposed", False))
        per_elem = math.prod(_dims(w)[1:])  # (Cin/groups)·k… ; transposed: (Cout/groups)·k…
        elems = x.numel() if transposed else math.prod(_dims(_first_tensor(out)))
        return _same(2 * elems * per_elem, CONV, x)
    return formula


def _conv_backward(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
    grad_out = b["grad_output"]
    x = b.get("input", b.get("self"))
    w = b["weight"]
    mask = b["output_mask"]
    transposed = bool(b.get("transposed", False))
    fwd = 2 * (x.numel() if transposed else grad_out.numel()) * math.prod(_dims(w)[1:])
    return _same(fwd * (int(bool(mask[0])) + int(bool(mask[1]))), CONV, x)


# --- attention -----------------------------------------------------------------------------

def _seq_lengths(cum: Any, max_len: Any) -> list[int]:
    """Per-sequence lengths of a varlen batch; fake/meta offsets fall back to the max length
    (an upper bound).  Reading real offsets synchronises the device once (sampled steps only)."""
    if cum.device.type == "meta" or _is_fake(cum):
        return [int(max_len)] * (int(cum.shape[0]) - 1)
    return [int(v) for v in cum.diff().tolist()]


def _is_fake(t: Any) -> bool:
    return type(t).__name__ in ("FakeTensor", "FunctionalTensor")


def attention_cost(heads: int, pairs: int, d_qk: int, d_v: int, *, backward: bool, causal: bool,
                   kernel_causal: bool | None = None) -> tuple[int, int]:
    """(model, executed) FLOPs of one attention call; ``pairs`` = Σ Sq·Sk over sequences.
    ``causal``: the model count is halved (the causal convention on a causal call);
    ``kernel_causal`` (default ``causal``): the kernel skipped the masked half, so what it
    executed is halved whatever the convention (executed is what ran)."""
    fwd = 2 * heads * pairs * (d_qk + d_v)
    if backward:
        model, executed = 2 * fwd, 2 * fwd + 2 * heads * pairs * d_qk  # fused bwd recomputes QKᵀ
    else:
        model = executed = fwd
    # every term carries a factor 2, so halving stays exact
    if causal:
        model //= 2
    if causal if kernel_causal is None else kernel_causal:
        executed //= 2
    return model, executed


def _attention(layout: str, backward: bool, causal_of: Callable[[Mapping[str, Any]], bool]) -> Formula:
    def formula(b: Mapping[str, Any], out: Any, causal_convention: bool) -> OpCost:
        q, k, v = b["query"], b["key"], b["value"]
        qd, kd, vd = _dims(q), _dims(k), _dims(v)
        if layout == "bhsd":
            heads, d_qk, d_v = qd[1], qd[3], vd[3]
            pairs = qd[0] * qd[2] * kd[2]
            shape = AttentionShape(qd[0], heads, qd[2], kd[2], d_qk)
            mask = _first_given(b, "attn_mask", "attn_bias")  # CPU flash / efficient and cuDNN
            docs = mask_documents(mask, qd[2], kd[2]) if mask is not None else None
            queries = qd[0] * qd[2]
            if docs is not None:  # packed documents: the math needs Σ sᵢ², the kernel ran S²
                doc_pairs = docs.pairs(qd[0])
                causal = causal_convention and (causal_of(b) or docs.causal)
                model = attention_cost(heads, doc_pairs, d_qk, d_v, backward=backward, causal=causal)[0]
                run = attention_cost(heads, pairs, d_qk, d_v, backward=backward, causal=causal_of(b))[1]
                seen = AttentionPairs(doc_pairs, queries, True, causal_of(b) or docs.causal)
                return OpCost(model, run, ATTENTION, q, shape, seen)
            if mask is not None and not causal_of(b) and mask_is_causal(mask, qd[2], kd[2]):
                # a causal mask given explicitly (a padded batch): half the square to the causal
                # convention; read under "full" too, to say whether the model's attention is causal
                model, run = attention_cost(heads, pairs, d_qk, d_v, backward=backward, causal=causal_convention,
                                            kernel_causal=False)
                return OpCost(model, run, ATTENTION, q, shape, AttentionPairs(pairs, queries, False, True))
            documents, masked = False, None if causal_of is _never else causal_of(b)
        else:  # (B, S, H, D), or varlen: flash (total, H, D) / efficient (1, total, H, D)
            cum_q = _first_given(b, "cum_seq_q", "cu_seqlens_q", "cu_seq_q")
            cum_k = _first_given(b, "cum_seq_k", "cu_seqlens_k", "cu_seq_k")
            if cum_k is None:  # torch.nn.attention.varlen: keys share the queries' offsets
                cum_k = cum_q
            heads, d_qk, d_v = qd[-2], qd[-1], vd[-1]
            if cum_q is not None and cum_k is not None and cum_q.numel() > 1:  # dense calls pass none/empty
                lq = _seq_lengths(cum_q, b.get("max_q", b.get("max_seqlen_q")))
                lk = _seq_lengths(cum_k, b.get("max_k", b.get("max_seqlen_k")))
                pairs = sum(a * c for a, c in zip(lq, lk))
                queries, documents = sum(lq), len(lq) > 1
                shape = None  # packed sequences of several lengths: no one T
            else:
                pairs = qd[0] * qd[1] * kd[1]
                queries, documents = qd[0] * qd[1], False
                shape = AttentionShape(qd[0], heads, qd[1], kd[1], d_qk)
            masked = causal_of(b)
        kernel_causal = causal_of(b)
        model, executed = attention_cost(heads, pairs, d_qk, d_v, backward=backward,
                                         causal=causal_convention and kernel_causal, kernel_causal=kernel_causal)
        return OpCost(model, executed, ATTENTION, q, shape, AttentionPairs(pairs, queries, documents, masked))
    return formula


def _first_given(b: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if b.get(name) is not None:
            return b[name]
    return None


def _is_causal(b: Mapping[str, Any]) -> bool:
    return bool(b.get("is_causal", False))


def _mask_type_causal(b: Mapping[str, Any]) -> bool:
    return int(b.get("custom_mask_type", 0) or 0) != 0  # 1: top-left, 2: bottom-right causal


def _never(b: Mapping[str, Any]) -> bool:
    return False


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
        return _same(flops, MATMUL, b["input"])
    return formula


def _cudnn_rnn(backward: bool) -> Formula:
    """Every layer and direction in one call (cuDNN's flat weight list); its backward computes the
    input and hidden-state gradients, and the weights' where ``output_mask[3]`` asks."""
    def formula(b: Mapping[str, Any], out: Any, causal: bool) -> OpCost:
        flops = _rnn_flops(b["input"], b["weight"])
        if backward:
            mask = b.get("output_mask") or (True, True, True, True)
            flops *= 1 + bool(mask[3])
        return _same(flops, MATMUL, b["input"])
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

_SDPA_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
for _name in _SDPA_OPS:
    FORMULAS["aten::" + _name] = _attention("bhsd", False, _is_causal)
    FORMULAS["aten::" + _name + "_backward"] = _attention("bhsd", True, _is_causal)
FORMULAS["aten::_flash_attention_forward"] = _attention("bshd", False, _is_causal)
FORMULAS["aten::_flash_attention_backward"] = _attention("bshd", True, _is_causal)
FORMULAS["aten::_efficient_attention_forward"] = _attention("bshd", False, _mask_type_causal)
FORMULAS["aten::_efficient_attention_backward"] = _attention("bshd", True, _mask_type_causal)
# torch.nn.attention.varlen (custom ops; on CUDA they run flash/cuDNN varlen kernels)
FORMULAS["torch_attn::_varlen_attn"] = _attention("bshd", False, _is_causal)
FORMULAS["torch_attn::_varlen_attn_out"] = _attention("bshd", False, _is_causal)
FORMULAS["torch_attn::_varlen_attn_backward"] = _attention("bshd", True, _is_causal)


HOP_ATTENTION_OPS = ("flex_attention", "flex_attention_backward")


def hop_attention_cost(name: str, args: Sequence[Any], causal_convention: bool) -> OpCost | None:
    """Cost of flex attention higher-order ops (query, key, value first; (B, H, S, D)).

    Block masks are not inspected: the full square is counted (an upper bound)."""
    if name not in HOP_ATTENTION_OPS:
        return None
    q, k, v = args[0], args[1], args[2]
    formula = _attention("bhsd", name.endswith("backward"), _never)
    return formula({"query": q, "key": k, "value": v}, None, causal_convention)


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
