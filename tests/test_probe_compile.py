"""The probe and torch.compile: no extra compilation, no graph breaks, no misleading warning.

The probe finds the model with global module hooks until the first optimizer step. torch.compile
traces what runs inside a compiled module — hooks included — and guards on the global hooks, so
they used to cost a second compilation of the whole model when discovery ended (minutes, for a
large model), and hooks inside ``module.compile()``'s region broke its graph at every clock read.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator

import pytest
import torch

import probe
import step_spy

pytest.importorskip("torch._dynamo", reason="torch.compile needs torch._dynamo (torch >= 2.0 on a supported Python)")


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """The probe attached (nothing listens), its messages captured; Dynamo state reset."""
    import torch._dynamo

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # earlier tests of the session may have compiled something
    monkeypatch.setenv("FLOWTOP_KERNELS", "0")
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setattr("probe._log._seen", set())  # each test sees the probe's warnings afresh
    out: list[tuple[str, dict[str, Any]]] = []
    yield out
    probe.detach()
    torch._dynamo.reset()


def _attach(out: list[tuple[str, dict[str, Any]]]) -> None:
    assert probe.attach(addr="tcp://127.0.0.1:9", job="compile")
    p = probe._current()
    step_spy.spy(p, out, forward=True)


def _train(model: torch.nn.Module, call: Any, steps: int = 6) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 100, (4, 8))
    for _ in range(steps):
        call(x).sum().backward()
        opt.step()
        opt.zero_grad()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4))


def test_compiled_module_compiles_once_under_the_probe(sent: list[tuple[str, dict[str, Any]]]) -> None:
    from torch._dynamo.utils import counters

    _attach(sent)
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", append=True)  # after the probe's own filter
        compiled = torch.compile(model)
        _train(model, compiled)
    assert counters["stats"]["unique_graphs"] == 1  # as without the probe: no recompile
    assert sum(counters["graph_break"].values()) == 0
    assert not [w for w in caught if "global hooks" in str(w.message)]
    tracker = probe._current().tracker
    assert type(tracker.root).__name__ == "OptimizedModule" and tracker.compiled
    steps = [f for k, f in sent if k == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    # tokens from the compiled root's integer input (its embedding cannot be hooked)
    assert [s["tokens"] for s in steps[1:]] == [4 * 8] * 5
    flops = [f for k, f in sent if k == "flops"]
    # counted on the compiled model: 3 × (2·32·16·32 + 2·32·32·4) for the two Linear layers
    # (every matmul needs its input and weight grads but the first's input, the embedding
    # output, needs one too) — the same count as the eager model's
    assert flops and flops[0]["model_flops"] == 3 * (2 * 32 * 16 * 32 + 2 * 32 * 32 * 4)


def test_hooks_inside_a_compiled_region_do_not_break_its_graph(sent: list[tuple[str, dict[str, Any]]]) -> None:
    """``module.compile()`` compiles the module's call with its hooks: the probe's must run
    eagerly, not be traced (before: 15 graph breaks in 8 steps)."""
    from torch._dynamo.utils import counters

    _attach(sent)
    model = _Net()  # a module class of the user's: compiled (torch's own containers are skipped)
    model.compile()
    _train(model, model, steps=8)
    assert counters["stats"]["unique_graphs"] == 1 and sum(counters["graph_break"].values()) == 0
    steps = [f for k, f in sent if k == "step"]
    assert len(steps) == 8 and probe._current().tracker.compiled
    assert [s["tokens"] for s in steps[1:]] == [4 * 8] * 7


def test_eager_model_still_counts_tokens_at_its_embedding(sent: list[tuple[str, dict[str, Any]]]) -> None:
    _attach(sent)
    model = _model()
    _train(model, model)
    tracker = probe._current().tracker
    assert not tracker.compiled and tracker.embedding is model[0]
    assert [f["tokens"] for k, f in sent if k == "step"][1:] == [4 * 8] * 5
    assert os.environ.get("FLOWTOP_KERNELS") == "0"



def test_a_compiled_optimizer_step_turns_flop_counting_off_without_hurting_training(
        sent: list[tuple[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """torch.compile(opt.step): closing the counting window inside the compiled call left torch's
    dispatch state inconsistent and the next op raised an internal assert (training crashed)."""
    monkeypatch.setenv("FLOWTOP_FLOPS", "1")
    _attach(sent)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = torch.compile(opt.step)
    x = torch.randint(0, 100, (4, 8))
    for _ in range(6):
        model(x).sum().backward()
        step()
        opt.zero_grad()  # raised "INTERNAL ASSERT FAILED ... PythonFallbackKernel" before
    assert len([f for k, f in sent if k == "step"]) == 6
    sampler = probe._current()._flops
    assert sampler.estimate_only and not sampler.counting  # its window closed outside the call
    assert "optimizer.step runs under torch.compile" in capsys.readouterr().err


def test_without_a_count_the_estimate_stands_in_labelled(sent: list[tuple[str, dict[str, Any]]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting turned off by compiled code: the 6N+12LdT estimate of a transformer is sent as its
    FLOPs, once per input shape, marked ``counted: False``, and the monitor says "estimated"."""
    from flowtop.monitor.accounting import rank_flops
    from probe.wire import flops_report
    from flowtop.tools.demo.gpt import GPT, GPTConfig
    from flowtop.tui.widgets.job_header import convention_note
    from probe.flops.estimate import non_embedding_params, transformer_flops_per_token

    monkeypatch.setenv("FLOWTOP_FLOPS", "1")
    _attach(sent)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16, block_size=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(opt.step)
    x = torch.randint(0, 64, (2, 8))
    for _ in range(5):
        model(x, x)[1].backward()
        step()
        opt.zero_grad()
    estimates = [f for k, f in sent if k == "flops" and f.get("counted") is False]
    expected = transformer_flops_per_token(non_embedding_params(model), 2, 16, 8) * 2 * 8
    assert len(estimates) == 1  # one input shape
    e = estimates[0]
    assert e["model_flops"] == e["executed_flops"] == e["estimated_flops"] == expected
    assert e["dtype"] == "fp32" and e["tokens"] == 16
    view = rank_flops(flops_report(e), 0.1)
    assert view.counted is False and view.mfu is not None
    assert convention_note(view, None).startswith("estimated 6N+12LdT, not counted")


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.relu(self.fc(h))


class _Net(torch.nn.Module):
    def __init__(self, compiled_blocks: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        blocks = [_Block() for _ in range(2)]
        self.blocks = torch.nn.ModuleList(torch.compile(b) if compiled_blocks else b for b in blocks)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        h = self.emb(input_ids)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def test_a_frozen_compiled_teacher_does_not_become_the_root(sent: list[tuple[str, dict[str, Any]]]) -> None:
    _attach(sent)
    teacher = torch.compile(_Net())
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = _Net()
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    x = torch.randint(0, 100, (4, 8))
    for _ in range(4):
        with torch.no_grad():
            target = teacher(x)
        (student(x) - target).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    assert probe._current().tracker.root is student
    assert [f["micro_batches"] for k, f in sent if k == "step"][1:] == [1, 1, 1]


def test_compiled_blocks_in_an_eager_model_keep_its_embedding_and_keyword_ids_count(
        sent: list[tuple[str, dict[str, Any]]]) -> None:
    """Only some blocks compiled: the eager root's embedding still counts tokens. A compiled root
    called with ``input_ids=`` counts those, not the class labels beside them."""
    from torch._dynamo.utils import counters

    _attach(sent)
    model = _Net(compiled_blocks=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 100, (4, 8))
    for _ in range(4):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    assert not probe._current().tracker.compiled
    assert [f["tokens"] for k, f in sent if k == "step"][1:] == [32, 32, 32]
    assert sum(counters["graph_break"].values()) == 0
    probe.detach()
    sent.clear()

    _attach(sent)
    model = _Net()
    compiled = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    labels = torch.randint(0, 4, (4,))
    for _ in range(4):
        compiled(input_ids=x, labels=labels).sum().backward()
        opt.step()
        opt.zero_grad()
    assert probe._current().tracker.compiled
    assert [f["tokens"] for k, f in sent if k == "step"][1:] == [32, 32, 32]


def test_the_estimate_takes_autocasts_dtype_for_its_peak(sent: list[tuple[str, dict[str, Any]]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimate's peak is the dense peak of the compute dtype: bf16 under autocast, even
    though the weights are fp32 (an fp32 peak would inflate MFU ~15× on an H100)."""
    from flowtop.tools.demo.gpt import GPT, GPTConfig

    monkeypatch.setenv("FLOWTOP_FLOPS", "1")
    _attach(sent)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16, block_size=8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(opt.step)
    x = torch.randint(0, 64, (2, 8))
    for _ in range(5):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, x)[1]
        loss.backward()
        step()
        opt.zero_grad()
    (e,) = [f for k, f in sent if k == "flops" and f.get("counted") is False]
    assert e["dtype"] == "bf16"


class _CheckpointedGPT(torch.nn.Module):
    """Two pre-norm-free transformer blocks, each under activation checkpointing."""

    D, T, B, V, H = 32, 16, 2, 64, 2

    def __init__(self, checkpointed: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        d = self.D
        self.checkpointed = checkpointed
        self.emb = torch.nn.Embedding(self.V, d)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "qkv": torch.nn.Linear(d, 3 * d), "proj": torch.nn.Linear(d, d),
            "fc": torch.nn.Linear(d, 4 * d), "out": torch.nn.Linear(4 * d, d)}) for _ in range(2))
        self.head = torch.nn.Linear(d, self.V)

    def _block(self, blk: Any, x: torch.Tensor) -> torch.Tensor:
        b, t, d, h = self.B, self.T, self.D, self.H
        q, k, v = blk["qkv"](x).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, d))
        return x + blk["out"](torch.nn.functional.gelu(blk["fc"](x)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint

        x = self.emb(idx)
        for blk in self.blocks:
            x = checkpoint(self._block, blk, x, use_reentrant=False) if self.checkpointed else self._block(blk, x)
        return self.head(x)


def _gpt_model_flops() -> int:
    # Hand count, full-attention convention: forward = 2·tokens·(linear weights) + per layer
    # 2·(2·B·H·T²·dh) for QKᵀ and AV; training = 3 × forward (gradients of input and weight).
    m = _CheckpointedGPT
    tokens, d = m.B * m.T, m.D
    weights = 2 * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + d * m.V
    attention = 2 * 2 * (2 * m.B * m.H * m.T * m.T * (d // m.H))
    return 3 * (2 * tokens * weights + attention)


def test_compiled_checkpointed_model_counts_no_recompute_as_model_flops(sent, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # torch.compile + checkpointing recomputes the blocks inside the compiled backward, where grad
    # mode is off: without a bound those matmuls counted as model FLOPs (+21 % here) and the SDPA
    # forwards wrapped in run_and_save_rng_state/run_with_rng_state were not counted at all.
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "1000")
    _attach(sent)
    model = _CheckpointedGPT()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(4):
        compiled(torch.randint(0, model.V, (model.B, model.T))).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    counts = [f for k, f in sent if k == "flops"]
    assert counts, "the compiled model must be counted"
    c = counts[0]
    assert c["model_flops"] == _gpt_model_flops()
    assert c["executed_flops"] > c["model_flops"] * 1.15  # the recomputed blocks did run
    assert c["uncounted"] == {}  # the RNG-preserving wrappers are costed (no "MFU understated")
    assert c["model_note"].startswith("backward bounded at 2x the forward")


def test_eager_checkpointing_needs_no_bound(sent, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "1000")
    _attach(sent)
    model = _CheckpointedGPT()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(4):
        model(torch.randint(0, model.V, (model.B, model.T))).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    c = next(f for k, f in sent if k == "flops")
    assert c["model_flops"] == _gpt_model_flops() and c["model_note"] == ""
