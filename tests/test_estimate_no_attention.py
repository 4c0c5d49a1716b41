"""The estimate of token models without attention: 6·N (6·N_active for MoE) per token.

Real models trained a few steps on the CPU under the probe; each estimate is pinned against a hand
count of the parameters written out from the layer sizes (d=16, E=4, top_k=2, ffn 32, vocab 50).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import probe
import step_spy
from probe import wire

D, E, K, FFN, V, LAYERS = 16, 4, 2, 32, 50, 2
BATCH, SEQ = 4, 8


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(D, FFN), nn.Linear(FFN, D)  # 16·32 + 32 = 544, 32·16 + 16 = 528

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MoEMLP(nn.Module):
    """Token-choice top-k over a ModuleList of experts, as a router test writes it: a ``gate``
    Linear with E outputs and a ``top_k`` attribute, no ``num_experts`` anywhere, and the experts
    called ``mlps`` (the probe finds E from the gate and the list by its length)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)  # 32
        self.gate = nn.Linear(D, E, bias=False)  # 64
        self.top_k = K
        self.mlps = nn.ModuleList(Expert() for _ in range(E))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).reshape(-1, D)
        weights, ids = self.gate(h).softmax(-1).topk(self.top_k, dim=-1)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.mlps):
            rows, slot = (ids == e).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(h[rows]) * weights[rows, slot, None])
        return x + out.view_as(x)


class DenseMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)  # 32
        self.up, self.down = nn.Linear(D, FFN), nn.Linear(FFN, D)  # 544 + 528

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TokenModel(nn.Module):
    """Embedding → MLP or MoE layers → norm → head; no attention anywhere. ``embed`` False:
    fed float features instead of token ids (a Linear in, no nn.Embedding: tokens unknown)."""

    def __init__(self, layer: Callable[[], nn.Module], embed: bool = True) -> None:
        super().__init__()
        self.embed: nn.Module = nn.Embedding(V, D) if embed else nn.Linear(D, D)  # 800 either way
        self.layers = nn.ModuleList(layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D)  # 32
        self.head = nn.Linear(D, V, bias=False)  # 800

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    for k, v in (("FLOWTOP_KERNELS", "0"), ("FLOWTOP_TELEMETRY", "0"), ("FLOWTOP_ADDR", "tcp://127.0.0.1:1"),
                 ("FLOWTOP_FLOPS_BUDGET", "1000")):
        monkeypatch.setenv(k, v)
    out: list[tuple[str, dict[str, Any]]] = []
    assert probe.attach(job="no-attn")
    step_spy.spy(probe._current(), out)
    try:
        yield out
    finally:
        probe.detach()


Sent = list[tuple[str, dict[str, Any]]]


def _train(model: nn.Module, batch: Callable[[], torch.Tensor], sent: Sent) -> dict[str, Any]:
    """Three SGD steps under the probe; the counted step's ``flops`` message, as the monitor decodes it."""
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(batch()).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    (fields,) = [f for k, f in sent if k == "flops"]
    key = wire.RankKey("no-attn", "h", 1, 0, 0)
    return dict(wire.decode(wire.encode("flops", key, 1, time.time(), fields)).fields)  # the wire accepts it


def _ids() -> torch.Tensor:
    return torch.randint(0, V, (BATCH, SEQ))


def test_moe_without_attention_gets_6_n_active(sent: Sent) -> None:
    """By hand: one expert 544 + 528 = 1,072; a layer norm 32 + gate 16·4 = 64 + experts 4 × 1,072
    = 4,288, i.e. 4,384; N = 2 × 4,384 + final norm 32 + head 16·50 = 800 = 9,600 (the embedding's
    800 left out). Active: a layer 32 + 64 + top-2 × 1,072 = 2,240; N_active = 2 × 2,240 + 32 + 800
    = 5,312, so 6·N_active = 31,872 FLOPs per token, × 32 tokens = 1,019,904 per step."""
    torch.manual_seed(0)
    model = TokenModel(MoEMLP)
    msg = _train(model, _ids, sent)
    assert sum(p.numel() for p in model.parameters()) == 9_600 + 800
    assert msg["tokens"] == BATCH * SEQ == 32
    assert msg["estimated_flops"] == 6 * 5_312 * 32 == 1_019_904
    assert msg["estimate_source"] == (
        "6N_active (no attention blocks found, none ran): N_active=5312; MoE: 2 layers, top-2 of 4 experts; "
        "N_active = N 9600 - experts 8576 + top_k x one expert 4288")
    # The count: every token takes exactly top-2 experts, so whatever the routing each layer's
    # matmuls are gate 16·4 + 2 × (16·32 + 32·16) = 2,112 weights per token, the head 800: 6 ×
    # (2 × 2,112 + 800) × 32 = 964,608; the estimate's 288 more parameters per token are the norms
    # (3 × 32) and the two chosen experts' biases (2 × 2 × 48), which 6·N counts as if multiplied.
    assert msg["model_flops"] == 6 * (2 * 2_112 + 800) * 32 == 964_608
    # the layers found for the estimate give the expert load too: 32 tokens × top-2 per layer
    assert {k: sum(v) for k, v in msg["expert_load"].items()} == {"layers.0": 64, "layers.1": 64}
    assert 5_312 - (2 * 2_112 + 800) == 3 * 32 + 2 * 2 * 48

    from flowtop.monitor.accounting import rank_flops
    from probe.wire import flops_report
    from flowtop.tui.widgets.flops_panel import flops_text

    view = rank_flops(flops_report(msg), step_time_s=0.1)
    assert view is not None and view.estimate_source == msg["estimate_source"]
    assert "6N_active (no attention blocks found, none ran)" in flops_text(view, None).plain
    # the attention row said "full  causal: full square" of a model with none (a trial)
    lines = flops_text(view, None).plain.splitlines()
    assert "attention   none found  no attention block, none ran" in lines, lines
    # the job header and the text report say so too ("attention full" of an MLP: a trial)
    from flowtop.monitor.format import attention_shown
    from flowtop.tui.widgets.job_header import convention_note

    assert view.attention_convention == "full" and attention_shown(view) == "none found"
    assert ", attn none found, " in convention_note(view, None)


def test_dense_token_mlp_without_attention_gets_6_n(sent: Sent) -> None:
    """By hand: a layer 32 + 544 + 528 = 1,104; N = 2 × 1,104 + 32 + 800 = 3,040; 6·N = 18,240
    per token, × 32 tokens = 583,680 per step."""
    msg = _train(TokenModel(DenseMLP), _ids, sent)
    assert msg["estimated_flops"] == 6 * 3_040 * 32 == 583_680
    assert msg["estimate_source"] == "6N (no attention blocks found, none ran): N=3040"
    # the count: matmul weights per token 2 × (16·32 + 32·16) + head 800 = 2,848, × 6 × 32 tokens;
    # 6·N also counts the norms and biases (192) as if they were multiplied
    assert msg["model_flops"] == 6 * 2_848 * 32 == 546_816


def test_float_fed_model_has_no_tokens_and_no_estimate(sent: Sent) -> None:
    """No nn.Embedding: nothing says what a token is (a row of a float batch may be a patch, a
    sample), so no estimate; the source field says why instead."""
    msg = _train(TokenModel(MoEMLP, embed=False), lambda: torch.randn(BATCH, SEQ, D), sent)
    assert msg["tokens"] == 0 and msg.get("estimated_flops") is None
    assert msg["estimate_source"] == "none: no tokens counted (no nn.Embedding fed token ids)"
    assert msg["model_flops"] > 0  # the count itself is unaffected


class LabelConditioned(nn.Module):
    """A diffusion-style model: fed float latents ``x`` (B × SEQ × D) and one class label per
    sample ``y`` (B,), looked up in an ``nn.Embedding`` of V classes; no token ids anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.labels = nn.Linear(D, D), nn.Embedding(V, D)
        self.layers = nn.ModuleList(DenseMLP() for _ in range(LAYERS))
        self.head = nn.Linear(D, D)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.inp(x) + self.labels(y)[:, None, :]  # the latents' module first, as DiT's x_embedder
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def test_class_labels_are_not_tokens(sent: Sent) -> None:
    """B class labels a step are not B tokens: before, the probe counted 4 tokens a step and
    estimated 6·N·4 for a model fed no token ids at all."""
    torch.manual_seed(0)
    model = LabelConditioned()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(BATCH, SEQ, D), torch.randint(0, V, (BATCH,))).square().mean().backward()
        opt.step()
        opt.zero_grad()
    (fields,) = [f for k, f in sent if k == "flops"]
    assert fields["tokens"] == 0 and fields.get("estimated_flops") is None
    assert fields["estimate_source"] == "none: no tokens counted (no nn.Embedding fed token ids)"
    assert [f["tokens"] for k, f in sent if k == "step"] == [0, 0, 0]


@pytest.mark.parametrize("encoder_grad", [None, False, True])
def test_class_labels_by_keyword_and_a_frozen_encoders_ids_are_not_tokens(sent: Sent, encoder_grad: bool | None) -> None:
    """Called with keywords (``model(x=..., y=...)``: torch's global hooks see no kwargs) the batch
    is read from the first module that takes the latents; a frozen text encoder's ids (run under
    no_grad, or with grad on but neither trained nor inside the model) are not the model's tokens.
    Before: 4 tokens a step by keyword (``encoder_grad`` None: no encoder), 4 × 12 = 48 from the
    frozen encoder either way."""
    torch.manual_seed(0)
    model, encoder = LabelConditioned(), nn.Embedding(V, D).requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        cond = torch.zeros(BATCH, 12, D)
        if encoder_grad is not None:
            with torch.set_grad_enabled(encoder_grad):  # True: chosen in discovery, dropped at the root's settling
                cond = encoder(torch.randint(0, V, (BATCH, 12)))
        out = model(x=torch.randn(BATCH, SEQ, D) + cond.mean(1, keepdim=True), y=torch.randint(0, V, (BATCH,)))
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
    assert [f["tokens"] for k, f in sent if k == "step"] == [0, 0, 0]
    (fields,) = [f for k, f in sent if k == "flops"]
    assert fields["tokens"] == 0 and fields.get("estimated_flops") is None


class PositionTable(nn.Module):
    """A vision encoder's learned positions: an ``nn.Embedding`` of SEQ rows fed ``arange(SEQ)``
    (1-D, or (1, SEQ) as a Hugging Face position_ids buffer), beside float patch features."""

    def __init__(self, rows: bool) -> None:
        super().__init__()
        self.patch, self.pos, self.rows = nn.Linear(D, D), nn.Embedding(SEQ, D), rows
        self.layers = nn.ModuleList(DenseMLP() for _ in range(LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(SEQ)
        h = self.patch(x) + self.pos(ids[None] if self.rows else ids)
        for layer in self.layers:
            h = layer(h)
        return h


@pytest.mark.parametrize("rows", [False, True])
def test_position_ids_are_not_tokens(sent: Sent, rows: bool) -> None:
    """Position ids are one row for the whole batch, not token ids: before, 8 "tokens" a step
    (the sequence length) for a model fed float patches."""
    torch.manual_seed(0)
    model = PositionTable(rows)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        model(torch.randn(BATCH, SEQ, D)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    assert [f["tokens"] for k, f in sent if k == "step"] == [0, 0, 0]


def test_packed_token_ids_still_count(sent: Sent) -> None:
    """A packed batch's token ids come as one 1-D tensor (no float input of their length): each
    id is a token, 32 a step, and the estimate is 6·N × 32 (N = 3,040 as above)."""
    msg = _train(TokenModel(DenseMLP), lambda: torch.randint(0, V, (BATCH * SEQ,)), sent)
    assert msg["tokens"] == BATCH * SEQ == 32
    assert msg["estimated_flops"] == 6 * 3_040 * 32


class Mixer(nn.Module):
    """Attention written by hand under names that do not say so (two heads of 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.out = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(BATCH, SEQ, 2, D // 2).transpose(1, 2)

        w = (heads(self.a(x)) @ heads(self.b(x)).transpose(-2, -1)).softmax(-1)
        return x + self.out((w @ heads(self.c(x))).transpose(1, 2).reshape(BATCH, SEQ, D))


def test_hand_written_attention_gets_no_6_n(sent: Sent) -> None:
    """q·kᵀ and w·v by hand run as batched matmuls (aten.bmm): before, the names said no
    attention and the estimate was 6·N, its attention term left out; now there is none, and why."""
    msg = _train(TokenModel(Mixer), _ids, sent)
    assert msg["tokens"] == 32 and msg.get("estimated_flops") is None
    assert msg["estimate_source"].startswith("none: batched matmuls of activations ran (aten.bmm")
    # the count has them: the Linears' weights per token 2 layers × 4 × 16·16 + head 800 = 2,848,
    # 6 × 2,848 × 32 = 546,816; per layer q·kᵀ and w·v are each B·heads = 8 products of 8×8 by 8×8,
    # 2·8·8·8 × 8 = 8,192 FLOPs forward, twice that backward: 2 layers × 2 × 3 × 8,192 = 98,304
    assert msg["model_flops"] == 6 * 2_848 * 32 + 98_304 == 645_120


class EinsumMLP(nn.Module):
    """DenseMLP's maps written as einsums (JAX ports, gMLP): batched matmuls of a batch of one."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)  # 32
        self.w_up, self.w_down = nn.Parameter(torch.randn(D, FFN) / 4), nn.Parameter(torch.randn(FFN, D) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.einsum("btd,df->btf", self.norm(x), self.w_up))
        return x + torch.einsum("btf,fd->btd", h, self.w_down)


def test_einsum_with_a_weight_keeps_6_n_and_a_position_table_keeps_the_guard(sent: Sent) -> None:
    """An einsum with a weight is no product of two activations: 6·N stays (N = 2 × (32 + 512 +
    512) + 32 + 800 = 2,944). A (1, SEQ, D) learned position table is no stack of weights: the
    hand-written attention beside it still gets no 6·N (the guard took any 3-D parameter before)."""
    msg = _train(TokenModel(EinsumMLP), _ids, sent)
    assert msg["estimated_flops"] == 6 * 2_944 * 32
    sent.clear()
    model = TokenModel(Mixer)
    model.table = nn.Parameter(torch.zeros(1, SEQ, D))  # unused by the forward: a parameter only
    msg = _train(model, _ids, sent)
    assert msg.get("estimated_flops") is None and "aten.bmm" in msg["estimate_source"]


def test_direct_calls_need_the_counted_steps_evidence() -> None:
    """Without a counted step (``ran_attention`` None) nothing shows that no attention runs: no
    estimate, as before. A model with an attention-like module but no shape gets none either."""
    from flop_helpers import estimate_of
    from probe.flops.estimate import estimate_with_reason

    model = TokenModel(DenseMLP)
    assert estimate_of(model, seq_len=SEQ) is None
    est = estimate_of(model, seq_len=SEQ, ran_attention=False)
    assert est is not None and est.flops_per_token == 6 * 3_040 and (est.n_layers, est.d_model) == (0, 0)
    assert estimate_with_reason(model, seq_len=SEQ, ran_attention=True) == (
        None, "attention found but not its L and d (no config n_layer/hidden_size, no attention block list, "
        "no call shape)")
    model.layers[0].self_attn = nn.Linear(D, D)  # a module named for attention, however written
    assert estimate_of(model, seq_len=SEQ, ran_attention=False) is None
    floats = TokenModel(DenseMLP, embed=False)  # tokens are an nn.Embedding's input: none here
    assert estimate_with_reason(floats, seq_len=SEQ, ran_attention=False) == (
        None, "no nn.Embedding: tokens unknown, no per-token estimate")


def test_hf_style_config_keys_on_the_model() -> None:
    """top-k and E only on the model's config (HF ``num_experts_per_tok``/``num_local_experts``),
    experts as torch's grouped 3-D weights under ``experts``: N_active = router 16·4 = 64 + top-2 ×
    one expert (16·32 + 32·16 = 1,024) = 2,112, against N = 64 + 4 × 1,024 = 4,160."""
    from probe.flops import moe

    class Grouped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w1 = nn.Parameter(torch.zeros(E, D, FFN))
            self.w2 = nn.Parameter(torch.zeros(E, FFN, D))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(D, E, bias=False)
            self.experts = Grouped()

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = {"num_local_experts": E, "num_experts_per_tok": K}
            self.block = Block()

    model = Model()
    (layer,) = moe.find_layers(model)
    assert (layer.num_experts, layer.top_k, layer.local_experts, layer.expert_params) == (E, K, E, 4_096)
    assert moe.active_params(model, 4_160)[0] == 64 + 2 * 1_024 == 2_112


def test_tensor_parallel_share_is_said() -> None:
    """Under a tensor-parallel split of 2 on the MLP weights, N is this rank's: 3,040 − 2 layers ×
    (512 + 512) / 2 = 2,016, and the label says it is the rank's share (no attention term to divide)."""
    from probe.flops.accounting import _label
    from probe.flops.dtensor import ParallelLayout
    from probe.flops.estimate import estimate_with_reason

    model = TokenModel(DenseMLP)
    split = {id(layer.up.weight): 2 for layer in model.layers} | {id(layer.down.weight): 2 for layer in model.layers}
    layout = ParallelLayout((("tp", 2),), (), 2, (("S(0)", 4),), split, tp_degree=2)
    est, why = estimate_with_reason(model, seq_len=SEQ, layout=layout, ran_attention=False)
    assert est is not None and why == "" and est.flops_per_token == 6 * 2_016
    assert _label(est, "full", SEQ) == (
        "6N (no attention blocks found, none ran; this rank's tensor-parallel share, N local): N=2016")


class _Mixer(nn.Module):
    """Self-attention named as token-mixer code names it (``qkv``, ``proj``; no attn anywhere),
    through SDPA with dropout: on CPU its math fallback, which the count sees as bmm and softmax
    only — no attention op ran, as far as the count can tell."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, D))


class _MixerModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(_Mixer() for _ in range(2))
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def test_attention_through_a_qkv_projection_is_not_read_as_none(sent: Sent) -> None:
    """A review's catch: such a model got "6N (no attention blocks found, none ran)", too low."""
    msg = _train(_MixerModel(), _ids, sent)
    assert not msg["estimate_source"].startswith("6N"), msg["estimate_source"]
    assert msg["estimated_flops"] is None
