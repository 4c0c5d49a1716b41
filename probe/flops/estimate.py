"""Analytic transformer FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B).

Training (forward + backward) model FLOPs per token: ``6·N + 12·L·d·T`` with N the
non-embedding parameters (the LM head counts, tied or not: its matmul runs), L layers, d the
model width and T the sequence length; the second term is attention (scores and weighted
sum, full square).  Under the "causal" convention attention is halved: ``6·N + 6·L·d·T``.

Shown beside the counted figure (probe.flops.counter) as a plausibility check, so it stays simple:
frozen parameters are counted like trainable ones (they skip the weight-gradient 2·N_frozen,
so the estimate overstates fine-tuning runs such as LoRA), positional parameters that are
not ``nn.Embedding`` modules count as non-embedding. Under DTensor parallelism the estimate is
local like the count (probe.flops.dtensor): FSDP2's dims are gathered before compute (a
parameter counts whole), a parameter split k ways by tensor parallelism counts 1/k, and the
attention term is divided by the split of the matmuls (heads are split with them). FSDP1's
flat parameters count only the local shard (an under-estimate).

A model with no attention (embedding, MLP or MoE layers, head: a router test, an MLP-Mixer-like
ablation) gets ``6·N`` per token, the attention term 0 (source ``no-attention``), but only on
evidence: its config names no L and d, it has no attention-like module (``nn.MultiheadAttention``,
a module or class named attn/attention), and a counted step ran no attention op. Hand-written
attention in modules named otherwise is not seen, and then ``6·N`` is too low (the count shows the
gap). Tokens are what an ``nn.Embedding`` is fed, so a model without one gets no estimate: what a
"token" is in a model fed floats (a patch, a row, a sample) is not known.

Under context parallelism of degree cp a rank embeds T/cp positions of each sequence: its
linear layers run on those tokens (6·N per token, as ever), and its attention runs its T/cp
local queries against all T keys, i.e. 12·L·d·T per *local* token, T the whole sequence. So the
attention term takes T = cp × the rank's shard, and the estimate per rank is (6·N + 12·L·d·T) ×
its local tokens; Σ over the cp ranks is the unsharded sequence's 6N+12LdT × B·T.

T is each micro-batch's own: with gradient accumulation over micro-batches of different lengths
the attention term is Σ over micro-batches of 12·L·d·T_m × tokens_m, i.e. T per token is the
token-weighted mean of the T_m (probe.flops.padding.MicroBatchKeys, read in the counted step).
Packed documents: where the counted step's attention calls revealed them (a block-diagonal mask,
varlen offsets: the count's model FLOPs take Σ sᵢ² per row), the attention term takes the same
pairs, T per token = Σ sᵢ² ÷ the calls' queries (the "model" convention is the math's, and the
math of packed documents attends within each); a row of documents that no op revealed (no mask,
``is_causal`` only) is one sequence of the row's length, to the count as to the estimate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from probe._log import warn_once
from probe.flops import moe
from probe.flops.count import AttentionCalls, FlopCount
from probe.flops.dtensor import ParallelLayout
from probe.flops.opcost import AttentionShape
from probe.flops.padding import MicroBatchKeys

_CONFIG_ATTRS = ("config", "cfg", "args", "model_args", "params", "hparams")
_LAYER_KEYS = ("n_layer", "num_hidden_layers", "n_layers", "num_layers")
_WIDTH_KEYS = ("n_embd", "hidden_size", "d_model", "dim")
#: ``Estimate.source`` of a model without attention: 6·N per token.
NO_ATTENTION = "no-attention"


@dataclass(frozen=True)
class Estimate:
    """Analytic training FLOPs per token and the figures it came from.

    ``source`` says how the shape was found: "override", "config:<attr>", "blocks:<path>",
    "attention:<calls>/<micro-batches>" (the counted step's attention calls) or
    :data:`NO_ATTENTION` (none found nor run: L = d = 0, the figure is 6·N).
    ``split``: the tensor-parallel split the attention term was divided by (1: none);
    ``n_params`` is then the elements this rank computes with. ``seq_len`` is the keys each query
    attends to (the whole sequence); under context parallelism of degree ``cp`` > 1 the rank's
    own shard is ``seq_len / cp`` (its queries and tokens).
    """

    flops_per_token: float
    n_params: int
    n_layers: int
    d_model: int
    seq_len: int
    source: str
    split: int = 1
    #: MoE models: how N became N_active (probe.flops.moe), "" for dense ones.
    moe: str = ""
    cp: int = 1
    #: T per token the attention term took where it is not ``seq_len`` (micro-batches of several
    #: lengths: their token-weighted mean; packed documents: Σ sᵢ² ÷ queries), and why; 0 and "".
    keys: float = 0.0
    keys_note: str = ""


def transformer_flops_per_token(
    n_params: int, n_layers: int, d_model: int, seq_len: float, attention: str = "full", split: int = 1
) -> float:
    """``6·N + 12·L·d·T`` (full attention) or ``6·N + 6·L·d·T`` (causal convention); with a
    tensor-parallel ``split`` the attention term is ``12·L·d·T / split`` (N already local)."""
    attn = 6 if attention == "causal" else 12
    return float(6 * n_params + attn * n_layers * d_model * seq_len / max(1, split))


def non_embedding_params(model: nn.Module, splits: Mapping[int, int] | None = None) -> int:
    """Parameters outside ``nn.Embedding`` tables, plus any head weight tied to one.

    Counting is by tensor identity, so a weight shared by several modules counts once.
    ``splits`` (id(parameter) -> k, probe.flops.dtensor) counts a parameter computed on in k
    tensor-parallel shards as 1/k of its global elements."""
    splits = splits or {}

    def size(p: torch.Tensor) -> int:
        return p.numel() // splits.get(id(p), 1)

    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    total = sum(size(p) for p in model.parameters() if id(p) not in embedding_ids)
    tied_heads = {
        id(m.weight): size(m.weight)
        for m in model.modules()
        if isinstance(m, nn.Linear) and id(m.weight) in embedding_ids
    }
    return total + sum(tied_heads.values())


def _unwrap(model: nn.Module) -> nn.Module:
    """Inner module of DDP/FSDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    for _ in range(4):
        inner = getattr(model, "_orig_mod", None)
        if inner is None:
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def _config_value(config: Any, keys: Iterable[str]) -> int | None:
    for key in keys:
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _from_config(model: nn.Module) -> tuple[int, int, str] | None:
    for attr in _CONFIG_ATTRS:
        config = getattr(model, attr, None)
        if config is None or isinstance(config, (int, float, str, torch.Tensor)):
            continue
        layers, width = _config_value(config, _LAYER_KEYS), _config_value(config, _WIDTH_KEYS)
        if layers and width:
            return layers, width, f"config:{attr}"
    return None


def _encoder_decoder(model: nn.Module) -> bool:
    """An encoder-decoder: a config that says so (Hugging Face ``is_encoder_decoder``), an
    ``nn.Transformer``/``nn.TransformerDecoder`` inside, or children named encoder and decoder. Its
    two sides take different tokens (the encoder's source, the decoder's target) through different
    weights: one per-token figure over "the" tokens is ~1.3-2x off (a new user's trial: T5 and a
    hand-written nn.Transformer, count/estimate 0.77 and 0.50)."""
    for attr in _CONFIG_ATTRS:
        config = getattr(model, attr, None)
        key = "is_encoder_decoder"
        if (config.get(key) if isinstance(config, dict) else getattr(config, key, None)) is True:
            return True
    if "encoder" in model._modules and "decoder" in model._modules:
        return True
    return any(isinstance(m, (nn.Transformer, nn.TransformerDecoder)) for m in model.modules())


def _attention_width(block: nn.Module) -> int | None:
    """Model width seen by a block's attention: MHA ``embed_dim`` or its first Linear's input."""
    for name, sub in block.named_modules():
        if isinstance(sub, nn.MultiheadAttention):
            return int(sub.embed_dim)
        leaf = name.rsplit(".", 1)[-1].lower()
        if "attn" in leaf or "attention" in leaf:
            for inner in sub.modules():
                if isinstance(inner, nn.Linear):
                    return int(inner.in_features)
    return None


def _from_blocks(model: nn.Module) -> tuple[int, int, str] | None:
    """The longest ModuleList/Sequential whose every child holds an attention submodule."""
    best: tuple[int, int, str] | None = None
    for path, sub in model.named_modules():
        if not isinstance(sub, (nn.ModuleList, nn.Sequential)) or len(sub) == 0:
            continue
        widths = [w for w in (_attention_width(child) for child in sub) if w is not None]
        if len(widths) == len(sub) and (best is None or len(sub) > best[0]):
            best = (len(sub), int(widths[0]), f"blocks:{path or '<root>'}")
    return best


def _from_attention(
    seen: Mapping[AttentionShape, int] | None, micro_batches: int
) -> tuple[int, int, int, str] | None:
    """(L, d, T, source) from the forward attention calls the counted step ran, for models whose
    config and module names say nothing (blocks with ``qkv``/``proj`` and no ``attn`` module).

    L = attention calls per micro-batch; d = query heads × head width and T = keys per query of
    the most frequent call shape (under tensor parallelism the heads are this rank's: d is
    local, and so is the attention term). Hand-written attention (plain matmuls) is not seen."""
    if not seen:
        return None
    calls = sum(seen.values())
    per_batch = max(1, micro_batches)
    layers = round(calls / per_batch)
    top = max(seen.items(), key=lambda kv: (kv[1], kv[0].heads * kv[0].head_dim))[0]
    if layers < 1 or top.seq_k < 1:
        return None
    return layers, top.heads * top.head_dim, top.seq_k, f"attention:{calls}/{per_batch}"


#: Names of attention's parts: a block with a fused or split q/k/v projection attends, however named.
_QKV = frozenset({"qkv", "wqkv", "q_proj", "k_proj", "wq", "wk", "query", "key", "to_qkv"})


def _says_attention(name: str) -> bool:
    name = name.lower()
    return "attn" in name or "attention" in name or name in _QKV


def attention_ran(count: FlopCount) -> bool | None:
    """Whether the counted step ran an attention op (SDPA, flash, varlen, flex: counted or
    listed as uncounted); None when it counted nothing (compiled code's stand-in count)."""
    if count.micro_batches < 1:
        return None
    return bool(count.attention_shapes) or any(map(_says_attention, (*count.by_op, *count.uncounted)))


def batched_matmuls_ran(count: FlopCount) -> bool:
    """Whether the counted step ran batched matmuls of two activations (``q @ k.transpose(-2, -1)``
    written by hand; FlopCount.activation_products), where a Linear on a batch of tokens runs as
    mm/addmm and an einsum with a weight as a batch of one."""
    return count.activation_products > 0


def _stacked_weights(model: nn.Module) -> bool:
    """Whether a parameter is a stack of matrices (3 dims, 2+ of them: grouped experts' [E, d, f],
    a Conv1d's): a batched matmul may then be a weight's. A (1, T, d) position table is not."""
    return any(p.dim() == 3 and p.shape[0] > 1 for p in model.parameters())


def _scan(model: nn.Module) -> tuple[bool, bool]:
    """(attention-like module, ``nn.Embedding``) in one walk: an ``nn.MultiheadAttention``, or a
    module whose name or class says attn/attention. Child names are read from ``_modules`` and
    each class is judged once (measured: 12.5 ms for a 9,412-module MoE, best of 10)."""
    embedding, classes = False, set()
    for sub in model.modules():
        cls = type(sub)
        if cls not in classes:
            classes.add(cls)
            if issubclass(cls, nn.MultiheadAttention) or _says_attention(cls.__name__):
                return True, embedding
        if any(map(_says_attention, sub._modules)):
            return True, embedding
        embedding = embedding or isinstance(sub, nn.Embedding)
    return False, embedding


def _without_attention(
    model: nn.Module, n_params: int, moe_note: str, ran: bool | None, batched: bool, keys: int, cp: int, split: int
) -> tuple[Estimate | None, str]:
    """6·N per token for a model shown to have no attention, else why there is no estimate."""
    if ran is None:
        return None, "shape unknown: no config L and d, no attention blocks, no counted step"
    attention, embedding = (True, False) if ran else _scan(model)
    if attention:
        return None, ("attention found but not its L and d (no config n_layer/hidden_size, "
                      "no attention block list, no call shape)")
    if batched and not _stacked_weights(model):
        # Two activations multiplied: attention under names that do not say so. 6·N would leave
        # out its term (the estimate too low, the count then "above the estimate").
        return None, ("batched matmuls of activations ran (aten.bmm: attention written by hand?) in no "
                      "module named for attention: its L and d unknown, no per-token estimate")
    if not embedding:
        return None, "no nn.Embedding: tokens unknown, no per-token estimate"
    # split: only said (N is local already under tensor parallelism), no attention term to divide
    return Estimate(6.0 * n_params, n_params, 0, 0, max(0, keys), NO_ATTENTION, split, moe_note, cp), ""


def _keys_per_token(micro: MicroBatchKeys | None, calls: AttentionCalls | None, cp: int) -> tuple[float, str]:
    """(T per token, why) where it is not the first micro-batch's row length, else (0, "")."""
    if calls is not None and calls.documents > 0 and calls.queries > 0:
        return calls.pairs / calls.queries, "packed documents: Σsᵢ² ÷ queries of the attention calls"
    if micro is not None and len(micro.lengths) > 1 and micro.tokens > 0:
        shown = ", ".join(map(str, micro.lengths[:8])) + (", …" if len(micro.lengths) > 8 else "")
        whole = " × cp" if cp > 1 else ""
        return micro.mean * cp, f"token-weighted over micro-batches of T {shown}{whole}"
    return 0.0, ""


def estimate_with_reason(
    model: nn.Module,
    seq_len: int,
    attention: str = "full",
    flops_per_token: float | None = None,
    layout: ParallelLayout | None = None,
    seen: Mapping[AttentionShape, int] | None = None,
    micro_batches: int = 1,
    cp: int = 1,
    ran_attention: bool | None = None,
    ran_batched: bool = False,
    micro_keys: MicroBatchKeys | None = None,
    calls: AttentionCalls | None = None,
) -> tuple[Estimate | None, str]:
    """Estimate training FLOPs per token of a transformer, and why there is none (``(None, why)``;
    ``""`` when there is one).

    ``flops_per_token`` overrides the analytic figure (the user knows better); the shape is
    then still reported when it can be found. ``layout`` (probe.flops.dtensor.layout_of) makes
    the figure local to this rank under tensor parallelism. The shape comes from the model's
    config, else its blocks, else ``seen`` (forward attention calls by shape in the counted
    step of ``micro_batches`` forwards; then T is the calls' key length), else, with
    ``ran_attention`` False and no attention module, there is none: 6·N (module docstring).
    ``ran_attention``: :func:`attention_ran` of the counted step (None: unknown); ``ran_batched``:
    :func:`batched_matmuls_ran` of it (hand-written attention: no 6·N then).
    ``cp``: this rank's context-parallel degree; ``seq_len`` (its token ids' length) is then its
    shard, and the attention term takes the whole sequence, ``seq_len × cp`` keys (the key length
    read from the attention calls is whole already). ``micro_keys``: the counted step's micro-batch
    lengths (several: T per token is their token-weighted mean); ``calls``: its attention calls
    (packed documents revealed: T per token is their Σ sᵢ² ÷ queries). Never raises.
    """
    try:
        model = _unwrap(model)
        shape = _from_config(model) or _from_blocks(model)
        split = layout.tp_degree if layout is not None else 1  # attention heads split over TP only
        cp = max(1, int(cp))
        keys = int(seq_len) * cp  # local queries attend to every key of the sequence
        if shape is None and (found := _from_attention(seen, micro_batches)) is not None:
            layers, width, keys, source = found
            shape, split = (layers, width, source), 1  # the heads seen are local already
        n_params = non_embedding_params(model, layout.shares if layout is not None else None)
        n_params, moe_note = moe.active_params(model, n_params)  # MoE: routed experts at top_k of E
        if flops_per_token is not None:
            layers, width = (shape[0], shape[1]) if shape else (0, 0)
            return Estimate(float(flops_per_token), n_params, layers, width, keys, "override", cp=cp), ""
        if _encoder_decoder(model):
            return None, ("encoder-decoder: its encoder and decoder take different tokens through different "
                          "layers, no one per-token estimate (FLOWTOP_FLOPS_PER_TOKEN sets one)")
        if shape is None:
            return _without_attention(model, n_params, moe_note, ran_attention, ran_batched, keys, cp, split)
        from_ids = keys > 0 and not shape[2].startswith("attention:")
        if keys <= 0 and (found := _from_attention(seen, micro_batches)) is not None:
            keys = found[2]  # packed 1-D token ids: T is the attention calls' key length (whole already)
        per_token, note = _keys_per_token(micro_keys if from_ids else None, calls, cp)
        if keys <= 0 and not note:
            return None, "sequence length unknown (no integer token-id input of 2+ dims, no attention call seen)"
        layers, width, source = shape
        fpt = transformer_flops_per_token(n_params, layers, width, per_token if note else keys, attention, split)
        return Estimate(fpt, n_params, layers, width, max(0, keys), source, split, moe_note, cp,
                        per_token if note else 0.0, note), ""
    except Exception as exc:  # noqa: BLE001 - a plausibility figure must never hurt training
        warn_once("estimate", f"transformer FLOP estimate unavailable: {type(exc).__name__}: {exc}")
        return None, f"estimate failed ({type(exc).__name__})"

