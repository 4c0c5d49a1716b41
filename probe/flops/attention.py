"""Shape formulas of attention calls: SDPA's fused kernels (flash, memory-efficient, cuDNN, CPU
flash), flash/efficient varlen, torch.nn.attention.varlen and flex attention (conventions in
:mod:`probe.flops.formulas`' docstring and docs/formulas.md).

A module of its own because attention is the one family whose model and executed FLOPs differ
(causal halving, the backward's recomputed scores) and whose arguments say more than a shape:
varlen offsets, masks that reveal packed documents (:mod:`probe.flops.packed`), causal flags.
:mod:`probe.flops.formulas` adds :data:`ATTENTION_FORMULAS` to its table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from probe.flops.opcost import ATTENTION, AttentionPairs, AttentionShape, Formula, OpCost, dims
from probe.flops.packed import mask_documents, mask_is_causal


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
        qd, kd, vd = dims(q), dims(k), dims(v)
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


ATTENTION_FORMULAS: dict[str, Formula] = {}
_SDPA_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
for _name in _SDPA_OPS:
    ATTENTION_FORMULAS["aten::" + _name] = _attention("bhsd", False, _is_causal)
    ATTENTION_FORMULAS["aten::" + _name + "_backward"] = _attention("bhsd", True, _is_causal)
ATTENTION_FORMULAS["aten::_flash_attention_forward"] = _attention("bshd", False, _is_causal)
ATTENTION_FORMULAS["aten::_flash_attention_backward"] = _attention("bshd", True, _is_causal)
ATTENTION_FORMULAS["aten::_efficient_attention_forward"] = _attention("bshd", False, _mask_type_causal)
ATTENTION_FORMULAS["aten::_efficient_attention_backward"] = _attention("bshd", True, _mask_type_causal)
# torch.nn.attention.varlen (custom ops; on CUDA they run flash/cuDNN varlen kernels)
ATTENTION_FORMULAS["torch_attn::_varlen_attn"] = _attention("bshd", False, _is_causal)
ATTENTION_FORMULAS["torch_attn::_varlen_attn_out"] = _attention("bshd", False, _is_causal)
ATTENTION_FORMULAS["torch_attn::_varlen_attn_backward"] = _attention("bshd", True, _is_causal)


HOP_ATTENTION_OPS = ("flex_attention", "flex_attention_backward")


def hop_attention_cost(name: str, args: Sequence[Any], causal_convention: bool) -> OpCost | None:
    """Cost of flex attention higher-order ops (query, key, value first; (B, H, S, D)).

    Block masks are not inspected: the full square is counted (an upper bound)."""
    if name not in HOP_ATTENTION_OPS:
        return None
    q, k, v = args[0], args[1], args[2]
    formula = _attention("bhsd", name.endswith("backward"), _never)
    return formula({"query": q, "key": k, "value": v}, None, causal_convention)
