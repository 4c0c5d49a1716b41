"""Gradient accumulation, packed sequences and padding (issue 14 part 7), pinned by hand.

* accumulation 1/4/8: FLOPs and tokens per step are k × one micro-batch's (the probe's real
  publisher output, in-process);
* packed documents: SDPA with a block-diagonal mask counts Σ sᵢ² in model FLOPs (executed stays
  S² per row: the dense kernel computes the masked square); masks that are not block-diagonal
  count the full square; varlen offsets (a CUDA-only op: its formula on real offsets);
* padding: tokens count padding; ``nonpad_tokens`` comes from the root's ``attention_mask``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import probe
import step_spy
from flop_helpers import count
from probe.flops.formulas import FORMULAS, bind_arguments
from probe.flops.packed import Documents, mask_documents


@pytest.fixture(params=["full"])
def captured(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    monkeypatch.setenv("FLOWTOP_ATTENTION", request.param)  # the attention convention (indirect params)
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "1000")  # count every new shape on these tiny steps
    out: list[tuple[str, dict[str, Any]]] = []
    assert probe.attach(job="t")
    step_spy.spy(probe._current(), out)
    try:
        yield out
    finally:
        probe.detach()


def _of(out: list[tuple[str, dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    return [f for k, f in out if k == kind]


V, D, B, S = 50, 16, 2, 8
# One micro-batch of (B, S) tokens through Linear d→d and Linear d→V: forward 2·B·S·(d² + d·V),
# backward 2 × that (the embedding's output needs a gradient: its table is trained) = 101,376.
MICRO = 3 * 2 * B * S * (D * D + D * V)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_accumulation_flops_and_tokens_per_step(k: int, captured: list[tuple[str, dict[str, Any]]]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(V, D), nn.Linear(D, D), nn.Linear(D, V))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        for _ in range(k):
            model(torch.randint(0, V, (B, S))).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    assert MICRO == 101_376
    assert [(s["tokens"], s["micro_batches"]) for s in _of(captured, "step")] == [(B * S * k, k)] * 3
    (f,) = _of(captured, "flops")
    assert f["model_flops"] == f["executed_flops"] == k * MICRO
    assert f["tokens"] == B * S * k
    assert f["model_flops"] / f["tokens"] == MICRO / (B * S)  # per token: independent of k
    assert "nonpad_tokens" not in f  # no attention_mask: nothing to say about padding


H, T_ROW, HD = 4, 16, 8


def _block_mask(*docs: int, causal: bool = False) -> torch.Tensor:
    mask = torch.zeros(sum(docs), sum(docs), dtype=torch.bool)
    start = 0
    for n in docs:
        block = torch.ones(n, n, dtype=torch.bool)
        mask[start:start + n, start:start + n] = block.tril() if causal else block
        start += n
    return mask


def _attend(mask: torch.Tensor, **kw: Any) -> Any:
    q = torch.randn(B, H, T_ROW, HD, requires_grad=True)
    return count(lambda: F.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum().backward(), **kw)


# Dense row: forward 4·B·H·S²·D = 4·2·4·256·8 = 65,536; fused CPU-flash backward executes
# 2 × forward + the recomputed scores 2·B·H·S²·D = 32,768.
DENSE_FWD = 4 * B * H * T_ROW**2 * HD
DENSE_EXEC = DENSE_FWD + 2 * DENSE_FWD + DENSE_FWD // 2


def test_packed_documents_count_the_sum_of_squares() -> None:
    # Two documents of 5 and 11 tokens packed into each 16-token row: Σ sᵢ² = 25 + 121 = 146.
    got = _attend(_block_mask(5, 11))
    assert got.model_flops == 3 * 4 * B * H * 146 * HD == 112_128  # forward + backward 2×
    assert got.executed_flops == DENSE_EXEC == 229_376  # the kernel ran the masked full square
    # per-row documents, (B, 1, S, S): row 0 [5, 11], row 1 [8, 8] -> 146 + 128
    rows = torch.stack([_block_mask(5, 11), _block_mask(8, 8)]).unsqueeze(1)
    assert _attend(rows).model_flops == 3 * 4 * H * (146 + 128) * HD
    # a float mask as SDPA builds it (-inf where masked) reads the same
    additive = torch.zeros(T_ROW, T_ROW).masked_fill(~_block_mask(5, 11), float("-inf"))
    assert _attend(additive).model_flops == 112_128
    # as torch hands it to cuDNN attention (bf16, -65536 where masked: seen on an H200, torch 2.11),
    # and as Hugging Face builds one (the dtype's lowest value); a bias of -100 masks nothing
    cudnn = torch.zeros(T_ROW, T_ROW).masked_fill(~_block_mask(5, 11), -65536.0).to(torch.bfloat16)
    hf = torch.zeros(T_ROW, T_ROW).masked_fill(~_block_mask(5, 11), torch.finfo(torch.float32).min)
    mild = torch.zeros(T_ROW, T_ROW).masked_fill(~_block_mask(5, 11), -100.0)
    assert [mask_documents(m, T_ROW, T_ROW) for m in (cudnn, hf, mild)] == [
        Documents(((5, 11),), False), Documents(((5, 11),), False), None]
    assert _attend(hf).model_flops == 112_128 and _attend(mild).model_flops == 3 * DENSE_FWD
    # expanded over batch and heads with stride 0 (as SDPA hands a bias to the CUDA kernels): one mask
    expanded = additive.expand(B, H, T_ROW, T_ROW)
    assert expanded.stride()[:2] == (0, 0) and _attend(expanded).model_flops == 112_128


def test_packed_causal_documents_and_the_causal_convention() -> None:
    mask = _block_mask(5, 11, causal=True)
    assert _attend(mask).model_flops == 112_128  # "full" counts each document's square
    half = _attend(mask, attention="causal")
    assert half.model_flops == 112_128 // 2  # causal within every document: halved like is_causal
    assert half.executed_flops == DENSE_EXEC  # no is_causal flag: the kernel skipped nothing


def test_masks_that_are_not_packed_documents_count_the_full_square() -> None:
    full = 3 * DENSE_FWD
    sliding = torch.ones(T_ROW, T_ROW, dtype=torch.bool).tril().triu(-3)  # a 4-token window
    padding = torch.ones(T_ROW, T_ROW, dtype=torch.bool)
    padding[:, 12:] = False  # key padding: one document with masked keys
    per_head = _block_mask(5, 11).expand(B, H, T_ROW, T_ROW).contiguous()  # per-head masks: not scanned
    for mask in (sliding, padding, per_head, _block_mask(16)):
        assert _attend(mask).model_flops == full


def test_varlen_offsets_count_each_document() -> None:
    import torch.nn.attention.varlen  # noqa: F401 - registers torch_attn::_varlen_attn

    # Documents of 3 and 7 tokens, 2 heads of width 8 (total, H, D): Σ lq·lk = 9 + 49 = 58
    q = torch.randn(10, 2, 8)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    op = torch.ops.torch_attn._varlen_attn.default
    fwd = FORMULAS["torch_attn::_varlen_attn"](bind_arguments(op, (q, q, q, cu, None, 7, 7), {}), None, False)
    assert fwd.model == fwd.executed == 4 * 2 * 58 * 8 == 3_712
    causal = FORMULAS["torch_attn::_varlen_attn"](bind_arguments(op, (q, q, q, cu, cu, 7, 7, True), {}), None, True)
    assert causal.model == 3_712 // 2
    bop = torch.ops.torch_attn._varlen_attn_backward.default
    args = (q, q, q, q, q, torch.zeros(2, 10), cu, cu, 7, 7, False, torch.zeros(2))
    bwd = FORMULAS["torch_attn::_varlen_attn_backward"](bind_arguments(bop, args, {}), None, False)
    assert bwd.model == 2 * 3_712 and bwd.executed == 2 * 3_712 + 2 * 2 * 58 * 8


class Padded(nn.Module):
    """HF-style: ``forward(input_ids, attention_mask=None)``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.out = nn.Linear(D, V)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.out(self.emb(input_ids))


def test_padding_is_counted_and_nonpad_tokens_are_reported(captured: list[tuple[str, dict[str, Any]]]) -> None:
    model = Padded()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lengths = [[8, 3], [5, 6]]  # two micro-batches of two rows padded to 8 tokens
    masks = [torch.tensor([[1] * n + [0] * (S - n) for n in row]) for row in lengths]
    for _ in range(3):
        for mask in masks:
            model(torch.randint(0, V, (B, S)), attention_mask=mask).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    (f,) = _of(captured, "flops")
    assert f["tokens"] == 2 * B * S == 32  # padding included: the GEMMs ran on it
    assert f["model_flops"] == 2 * 3 * 2 * B * S * D * V  # one linear on every padded token
    assert f["nonpad_tokens"] == 8 + 3 + 5 + 6 == 22
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.wire import flops_report

    view = rank_flops(flops_report(f), step_time_s=0.01)
    assert view.nonpad_tokens == 22 and view.nonpad_frac == pytest.approx(22 / 32)
    assert job_flops([view, view]).nonpad_frac == pytest.approx(22 / 32)


class TinyGPT(nn.Module):
    """Embedding, L blocks of (qkv, SDPA, proj) without biases, head: the estimate's shape from its
    config. ``mask``: an SDPA ``attn_mask`` (packed documents), else causal (``causal`` False: none)."""

    def __init__(self, vocab: int = 32, d: int = 16, layers: int = 2, heads: int = 2, causal: bool = True) -> None:
        super().__init__()
        self.config = {"n_layer": layers, "n_embd": d}
        self.causal = causal  # False: bidirectional (a BERT), no mask
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d, bias=False) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(layers))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self.emb(ids)
        b, t, d = x.shape
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and self.causal)
            x = x + proj(y.transpose(1, 2).reshape(b, t, d))
        return self.head(x)


# TinyGPT: N (non-embedding) = L·(3d² + d²) + d·V = 2·(768 + 256) + 512 = 2,560; L = 2, d = 16.
GPT_N, GPT_L, GPT_D = 2 * (3 * 16 * 16 + 16 * 16) + 16 * 32, 2, 16


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        for ids, mask in batches:
            model(ids, mask).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()


def test_estimate_takes_each_micro_batchs_length(captured: list[tuple[str, dict[str, Any]]]) -> None:
    # Two micro-batches per step, B = 2 rows of T = 8, then of T = 16: tokens 16 + 32 = 48.
    # Attention term Σ over micro-batches of 12·L·d·T_m × tokens_m = 12·2·16·(16·8 + 32·16)
    # = 384·640 = 245,760; 6N·tokens = 6·2,560·48 = 737,280; estimate 983,040.
    # (The first micro-batch's T for all 48 tokens: 384·8·48 = 147,456 -> 884,736, 0.90 of it.)
    # The count (full convention): 3 × [2·N·tokens + L·4·d·Σ B·T_m²] = 3 × [245,760 + 2·4·16·640]
    # = 3 × 327,680 = 983,040: count/estimate 1.
    torch.manual_seed(0)
    model = TinyGPT()
    assert sum(p.numel() for n, p in model.named_parameters() if not n.startswith("emb")) == GPT_N == 2_560
    _train(model, [(torch.randint(0, 32, (2, 8)), None), (torch.randint(0, 32, (2, 16)), None)])
    (f,) = _of(captured, "flops")
    assert f["tokens"] == 48
    assert f["model_flops"] == 3 * (2 * GPT_N * 48 + GPT_L * 4 * GPT_D * (2 * 64 + 2 * 256)) == 983_040
    assert f["estimated_flops"] == 6 * GPT_N * 48 + 12 * GPT_L * GPT_D * (16 * 8 + 32 * 16) == 983_040
    assert "T=13.3333 per token (token-weighted over micro-batches of T 8, 16)" in f["estimate_source"]


def test_packed_documents_estimate_takes_the_sum_of_squares(captured: list[tuple[str, dict[str, Any]]]) -> None:
    # One micro-batch of B = 2 packed rows of S = 16, documents of 5 and 11 in each (a block-diagonal
    # attn_mask): Σsᵢ² = 25 + 121 = 146 per row. Attention pairs per layer 2·146 = 292 for 32
    # queries: T per token 292 / 32 = 9.125. Estimate 6·N·32 + 12·L·d·9.125·32
    # = 491,520 + 112,128 = 603,648 (T = the row's 16 would add 384·16·32 = 196,608: 688,128, the
    # count 0.877 of it). Count: 3 × [2·N·32 + L·4·d·2·146] = 3 × [163,840 + 37,376] = 603,648.
    torch.manual_seed(0)
    _train(TinyGPT(), [(torch.randint(0, 32, (2, 16)), _block_mask(5, 11))])
    (f,) = _of(captured, "flops")
    assert f["tokens"] == 32
    assert f["model_flops"] == 3 * (2 * GPT_N * 32 + GPT_L * 4 * GPT_D * 2 * 146) == 603_648
    assert f["estimated_flops"] == 6 * GPT_N * 32 + 12 * GPT_L * GPT_D * 2 * 146 == 603_648
    assert "T=9.125 per token (packed documents: Σsᵢ² ÷ queries of the attention calls)" in f["estimate_source"]


@pytest.mark.parametrize("captured", ["full", "causal"], indirect=True)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_masking_is_said_and_a_bidirectional_model_is_never_halved(
        causal: bool, captured: list[tuple[str, dict[str, Any]]]) -> None:
    # One micro-batch of B = 2 rows of T = 8 (16 tokens). Linears 2·N·16 = 81,920 forward; attention
    # L·4·d·B·T² = 2·4·16·128 = 16,384 forward, half of it under the causal convention for the
    # causal model (8,192), the whole for the bidirectional one under either convention. Count
    # 3 × (81,920 + attention); estimate 6·N·16 + (12 or 6)·L·d·T·16 = 245,760 + (49,152 or 24,576):
    # causal convention, causal model 270,336 both; otherwise 294,912 both (a bidirectional model's
    # estimate is not halved either: it read 270,336 against a count of 294,912 before).
    import time

    from flowtop.monitor.accounting import rank_flops
    from probe.wire import flops_report
    from flowtop.tui.widgets.flops_panel import flops_text
    from probe import wire

    torch.manual_seed(0)
    _train(TinyGPT(causal=causal), [(torch.randint(0, 32, (2, 8)), None)])
    (f,) = _of(captured, "flops")
    halved = causal and f["attention"] == "causal"
    attention = 16_384 // 2 if halved else 16_384
    assert f["model_flops"] == 3 * (2 * GPT_N * 16 + attention) == (270_336 if halved else 294_912)
    assert f["estimated_flops"] == 6 * GPT_N * 16 + (6 if halved else 12) * GPT_L * GPT_D * 8 * 16 == f["model_flops"]
    assert f["attention_masking"] == ("causal" if causal else "bidirectional")
    bidi = " (bidirectional attention: not halved)" if not causal and f["attention"] == "causal" else ""
    assert f["estimate_source"].startswith(f"6N+{6 if halved else 12}LdT{bidi}, shape from model.config")
    msg = wire.decode(wire.encode("flops", wire.RankKey("t", "h", 1, 0, 0), 1, time.time(), f)).fields
    view = rank_flops(flops_report(msg), step_time_s=0.1)
    assert view is not None and view.attention_masking == f["attention_masking"]
    line = next(ln for ln in flops_text(view).plain.splitlines() if ln.startswith("attention"))
    note = {(True, "full"): "causal: full square", (True, "causal"): "causal: half square"}.get(
        (causal, f["attention"]), "bidirectional: full square (no causal to halve)")
    assert line == f"attention   {f['attention']}  {note}"


def test_attention_note_and_the_jobs_masking() -> None:
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.wire import flops_report
    from flowtop.tui.widgets.flops_panel import attention_note

    assert attention_note("full", "mixed") == "causal calls: full square"
    assert attention_note("causal", "mixed") == "causal calls: half square"
    assert attention_note("causal", None) == "causal: half square"  # not read: the convention alone
    base = {"step": 1, "model_flops": 1.0, "executed_flops": 1.0, "attention": "full", "dtype": "fp32",
            "peak_source": "x", "uncounted": {}, "tokens": 1}
    views = {m: rank_flops(flops_report({**base, **({"attention_masking": m} if m else {})}), step_time_s=0.1)
             for m in ("causal", "bidirectional", None)}
    assert views[None] is not None and views[None].attention_masking is None

    def job(*kinds: str | None) -> str | None:
        view = job_flops([views[k] for k in kinds])
        return view.attention_masking if view is not None else "?"

    assert (job("causal", "causal"), job("causal", "bidirectional"), job("causal", None)) == ("causal", "mixed", None)
