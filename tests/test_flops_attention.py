"""Attention FLOPs: SDPA on every path, GQA, hand-written attention, checkpointing, GPT steps.

Notation: B batch, T sequence, d width, H query heads, N = B·T tokens.  Attention forward
A = 4·B·H·T·T·(d/H) = 4·B·T²·d (scores + weighted sum).  Model backward = 2·A; fused kernels
(here CPU flash) execute 2.5·A in backward because they recompute the scores.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from flop_helpers import count  # noqa: E402  (tests/ is on sys.path via conftest)

aten = torch.ops.aten




class Block(nn.Module):
    """Pre-LN GPT block: x + proj(attn(ln1 x)); x + out(gelu(fc(ln2 x)))."""

    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, t: int, causal: bool, ckpt: bool | None = None):
        super().__init__()
        self.ckpt = ckpt
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(Block(d, heads, causal) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x) if self.ckpt is None else checkpoint(block, x, use_reentrant=self.ckpt)
        return self.head(self.ln_f(x))


B, T, D, H, L, V = 2, 8, 16, 4, 2, 32
N = B * T
LINEARS = 24 * N * D * D  # per block: 2·N·(3d² + d² + 4d² + 4d²)
HEAD = 2 * N * D * V
ATTN = 4 * B * T * T * D  # per block, full square


def gpt_step(model: GPT) -> None:
    idx = torch.randint(0, V, (B, T))
    F.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()


@pytest.mark.parametrize("causal", [False, True])
def test_gpt_full_convention(causal: bool) -> None:
    torch.manual_seed(0)
    model = GPT(V, D, H, L, T, causal)
    result = count(lambda: gpt_step(model), root=model)
    # every matmul needs input and weight grads (the embeddings are trainable): 3× forward;
    # causal calls are counted as the full square under the "full" convention (model FLOPs)
    assert result.model_flops == 3 * (L * LINEARS + HEAD) + 3 * L * ATTN == 688128
    # executed: what ran — the fused backward recomputes the scores (+ATTN/2), and a causal
    # kernel skips the masked half whatever the convention (it counted the whole square under
    # "full": executed FLOPs, and HFU, depended on the model convention; a new user's trial)
    ran = 1 + 5 / 2  # forward + fused backward, in forwards
    attn_ran = L * ATTN * ran / (2 if causal else 1)
    assert result.executed_flops == 3 * (L * LINEARS + HEAD) + attn_ran
    assert result.by_op["aten._scaled_dot_product_flash_attention_for_cpu"] == L * ATTN // (2 if causal else 1)
    assert result.by_op["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == \
        L * ATTN * 5 // 2 // (2 if causal else 1)
    assert result.uncounted == {} and result.micro_batches == 1


def test_gpt_causal_convention_halves_causal_sdpa_only() -> None:
    torch.manual_seed(0)
    causal = count(lambda: gpt_step(GPT(V, D, H, L, T, causal=True)), attention="causal")
    assert causal.attention_convention == "causal"
    assert causal.model_flops == 3 * (L * LINEARS + HEAD) + 3 * L * ATTN // 2
    assert causal.executed_flops == causal.model_flops + L * ATTN // 4
    # a non-causal model is unaffected by the convention
    full = count(lambda: gpt_step(GPT(V, D, H, L, T, causal=False)), attention="causal")
    assert full.model_flops == 3 * (L * LINEARS + HEAD) + 3 * L * ATTN


def test_torch_flop_counter_reports_zero_for_cpu_sdpa() -> None:
    """Why we do not rely on FlopCounterMode: torch 2.13 counts CPU attention as 0."""
    q = torch.randn(B, H, T, D // H, requires_grad=True)
    with FlopCounterMode(display=False) as reference:
        F.scaled_dot_product_attention(q, q, q).sum().backward()
    assert reference.get_total_flops() == 0
    ours = count(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward())
    assert ours.model_flops == 3 * 4 * B * H * T * T * (D // H)


def qkv(heads: int, kv_heads: int, head_dim: int = 8, seq: int = 8, grad: bool = True) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    q = torch.randn(B, heads, seq, head_dim, requires_grad=grad)
    k = torch.randn(B, kv_heads, seq, head_dim, requires_grad=grad)
    v = torch.randn(B, kv_heads, seq, head_dim, requires_grad=grad)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
def test_gqa_uses_query_heads_on_every_path(causal: bool) -> None:
    q, k, v = qkv(heads=8, kv_heads=2)
    fwd = 4 * B * 8 * 8 * 8 * 8  # 4·B·Hq·Sq·Sk·Dh: query heads, not K/V heads

    def native(dropout: float) -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True, dropout_p=dropout).sum().backward()

    def repeated() -> None:
        k8, v8 = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
        F.scaled_dot_product_attention(q, k8, v8, is_causal=causal).sum().backward()

    flash = count(lambda: native(0.0))
    math = count(lambda: native(0.5))  # dropout sends CPU SDPA down the math path (bmm ops)
    expanded = count(repeated)
    assert flash.model_flops == math.model_flops == expanded.model_flops == 3 * fwd
    # the fused kernels recompute the scores in backward, and a causal one skips the masked half
    assert flash.executed_flops == expanded.executed_flops == (3 * fwd + fwd // 2) // (2 if causal else 1)
    assert math.executed_flops == 3 * fwd  # the math path's backward does not recompute; bmm: the whole square
    assert set(math.by_op) == {"aten.bmm"}


def test_causal_convention_on_math_path_and_hand_written_counts_full_square() -> None:
    q, k, v = qkv(heads=4, kv_heads=4)
    fwd = 4 * B * 4 * 8 * 8 * 8
    math = count(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.5).sum().backward(),
                 attention="causal")
    assert math.model_flops == 3 * fwd  # documented: bmm ops cannot be known to be masked

    def hand_written() -> None:
        scores = (q @ k.transpose(-2, -1)) / 8 ** 0.5
        mask = torch.ones(8, 8, dtype=torch.bool).tril()
        (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v).sum().backward()

    for convention in ("full", "causal"):
        result = count(hand_written, attention=convention)
        # two bmm forward; backward: grad q, grad k (first bmm), grad scores, grad v (second)
        assert result.model_flops == result.executed_flops == 3 * fwd
        assert set(result.by_op) == {"aten.bmm"}


def test_an_explicit_causal_mask_is_causal_to_the_convention() -> None:
    """A causal mask passed as attn_mask (a Hugging Face model's, padded batch or not) ran the whole
    square (executed 3.5·A: forward A, fused backward 2.5·A) but is causal: the causal convention
    counts half the model figure, 3·A/2, as for is_causal (before: 3·A, while the label said "half
    square"). The full convention keeps 3·A; a mask allowing a later key (a sliding window's
    look-ahead, left padding unmasked) stays the full square."""
    q, k, v = qkv(heads=4, kv_heads=4)
    fwd = 4 * B * 4 * 8 * 8 * 8  # A: B=2, 4 heads, T=8, head width 8
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    padded = causal.expand(B, 1, 8, 8).clone()
    padded[1, :, :, 6:] = False  # the second row's last two keys are padding
    padded[1, :, 6:, 0] = True  # (their query rows keep a key: no fully masked row)
    ahead = causal.clone()
    ahead[0, 1] = True  # one pair after its query

    def run(mask: torch.Tensor) -> None:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()

    for mask in (causal, padded, causal.float().log()):  # bool, 4-D with padding, additive -inf
        got = count(lambda: run(mask), attention="causal")
        assert (got.model_flops, got.executed_flops) == (3 * fwd // 2, 7 * fwd // 2)
        assert count(lambda: run(mask), attention="full").model_flops == 3 * fwd
    assert count(lambda: run(ahead), attention="causal").model_flops == 3 * fwd


def test_hand_written_attention_without_key_grad() -> None:
    q, k, v = qkv(heads=4, kv_heads=4)
    k_frozen = k.detach()
    fwd_half = 2 * B * 4 * 8 * 8 * 8  # one of the two attention matmuls
    result = count(lambda: ((q @ k_frozen.transpose(-2, -1)).softmax(-1) @ v).sum().backward())
    # forward 2 bmm; backward: scores@v -> grad scores + grad v; q@kᵀ -> grad q only
    assert result.model_flops == 2 * fwd_half + 3 * fwd_half


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_model_excludes_recompute(reentrant: bool) -> None:
    torch.manual_seed(0)
    plain = count(lambda: gpt_step(GPT(V, D, H, L, T, causal=True)))
    torch.manual_seed(0)
    ckpt = count(lambda: gpt_step(GPT(V, D, H, L, T, causal=True, ckpt=reentrant)))
    assert ckpt.model_flops == plain.model_flops
    block_forward = LINEARS + ATTN // 2  # its causal kernel runs half the square
    if reentrant:  # reruns each block's whole forward
        recompute = block_forward
    else:
        # non-reentrant stops once every tensor saved for backward exists again
        # (torch.utils.checkpoint's early stop): the block's last matmul (out, 2·N·4d·d)
        # only feeds the residual add, which saves nothing, so it is not rerun
        recompute = block_forward - 2 * N * 4 * D * D
    assert ckpt.executed_flops == plain.executed_flops + L * recompute


def test_cuda_attention_ops_on_meta_tensors() -> None:
    """The CUDA kernels' ops have meta implementations: formulas are checked without a GPU."""
    b, h, s, dh = 2, 4, 8, 16
    q = torch.empty(b, h, s, dh, device="meta", dtype=torch.bfloat16)
    qb = torch.empty(b, s, h, dh, device="meta", dtype=torch.bfloat16)  # (B, S, H, D) layout
    full = 4 * b * h * s * s * dh
    calls = {
        "flash": lambda c: aten._scaled_dot_product_flash_attention(q, q, q, 0.0, c),
        "efficient": lambda c: aten._scaled_dot_product_efficient_attention(q, q, q, None, True, 0.0, c),
        "cudnn": lambda c: aten._scaled_dot_product_cudnn_attention(q, q, q, None, True, 0.0, c),
        "flash_fwd": lambda c: aten._flash_attention_forward(qb, qb, qb, None, None, s, s, 0.0, c, False),
        "efficient_fwd": lambda c: aten._efficient_attention_forward(qb, qb, qb, None, None, None, s, s, 0.0, int(c)),
    }
    for name, call in calls.items():
        for causal in (False, True):
            full_conv = count(lambda: call(causal))
            causal_conv = count(lambda: call(causal), attention="causal")
            assert full_conv.model_flops == full, name
            assert causal_conv.model_flops == (full // 2 if causal else full), name
            assert full_conv.dtype == "bf16"

    out = aten._scaled_dot_product_flash_attention(q, q, q, 0.0, True)
    backward = count(lambda: aten._scaled_dot_product_flash_attention_backward(
        q, q, q, q, out[0], out[1], out[2], out[3], s, s, 0.0, True, out[6], out[7]), attention="causal")
    assert (backward.model_flops, backward.executed_flops) == (full, full * 5 // 4)  # 2·A/2, 2.5·A/2


def test_varlen_flash_forward_sums_per_sequence() -> None:
    h, dh = 2, 8
    lengths = [3, 5]
    cum = torch.tensor([0, 3, 8], dtype=torch.int32)
    q = torch.empty(sum(lengths), h, dh, device="meta")
    meta_cum = cum.to("meta")
    result = count(lambda: aten._flash_attention_forward(q, q, q, meta_cum, meta_cum, 5, 5, 0.0, False, False))
    # meta offsets cannot be read: every sequence is taken at the max length (upper bound)
    assert result.model_flops == 2 * (4 * h * 5 * 5 * dh)


def test_varlen_formulas_read_real_offsets() -> None:
    from probe.flops.formulas import FORMULAS

    h, dh = 2, 8
    cum = torch.tensor([0, 3, 8], dtype=torch.int32)  # sequences of 3 and 5 tokens
    per_pair = 2 * h * (dh + dh)  # 2·H·(D + Dv) per (query, key) pair
    flash = {"query": torch.empty(8, h, dh, device="meta"), "cum_seq_q": cum, "cum_seq_k": cum, "max_q": 5, "max_k": 5}
    flash["key"] = flash["value"] = flash["query"]
    cost = FORMULAS["aten::_flash_attention_forward"](flash, None, False)
    assert cost.model == per_pair * (3 * 3 + 5 * 5)
    eff = {"query": torch.empty(1, 8, h, dh, device="meta"), "cu_seqlens_q": cum, "cu_seqlens_k": cum,
           "max_seqlen_q": 5, "max_seqlen_k": 5, "custom_mask_type": 1}
    eff["key"] = eff["value"] = eff["query"]
    backward = FORMULAS["aten::_efficient_attention_backward"](eff, None, True)
    fwd = per_pair * (3 * 3 + 5 * 5)
    # causal convention: halves of 2·A (model) and 2·A + 2·H·pairs·D (executed)
    assert (backward.model, backward.executed) == (fwd, fwd + h * 34 * dh)


def test_flex_attention_and_fullgraph_compile_keep_working_while_counting() -> None:
    """Eager flex_attention compiles with fullgraph=True internally: a plain dispatch mode
    would make it raise into training.  Our mode lets compilation through and costs the
    flex higher-order op with the attention formula (block masks not inspected)."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 2, 16, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        flex = count(lambda: flex_attention(q, q, q))
    assert flex.model_flops == 4 * 1 * 2 * 16 * 16 * 8
    assert flex.by_op == {"higher_order.flex_attention": flex.model_flops}

    compiled = torch.compile(lambda x: F.scaled_dot_product_attention(x, x, x), fullgraph=True, backend="eager")
    assert count(lambda: compiled(q)).model_flops == 4 * 1 * 2 * 16 * 16 * 8
