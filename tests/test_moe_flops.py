"""MoE and expert parallelism (issue 14 part 4): grouped-GEMM FLOPs from the real group sizes,
tokens per expert, the active-parameter estimate, and the monitor's load imbalance.

Real torch on the CPU (``torch._grouped_mm`` runs there in 2.13; ``_scaled_grouped_mm`` does
not, so its formula is checked on real offsets without running it: bench/gpu_moe_fp8.py runs it
on the GPU machine). Every count is pinned against a hand formula written out in the test.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

import moe_ep_worker as epw
from flop_helpers import count
from moe_helpers import MoE, hand_step_flops
from probe.flops import accounting, estimate, moe
from probe.flops.formulas import FORMULAS, bind_arguments
from probe.flops.grouped import total_flops
from snapshot_schema import assert_valid_snapshot
import step_spy

D, F_, E, K, T = 16, 24, 4, 2, 32


def test_grouped_mm_counts_the_offsets_not_the_buffer() -> None:
    # 10 rows of buffer, groups of 2, 5 and 2 tokens: the last row lies past the last offset (a
    # padded dispatch buffer). The CPU kernel leaves it unwritten; it must not be counted.
    a = torch.randn(10, 8, requires_grad=True)
    w = torch.randn(3, 8, 16, requires_grad=True)
    offs = torch.tensor([2, 7, 9], dtype=torch.int32)

    def step() -> None:
        out = torch._grouped_mm(a, w, offs=offs)
        (out * torch.randn_like(out)).sum().backward()  # a dense gradient (an expanded one is refused)

    result = count(step)
    # forward Σ_g 2·m_g·K·N = 2·9·8·16 = 2,304; input gradient (2-D × 3-D) the same, weight
    # gradient (2-D × 2-D over the token dim, 2·K·N·9) the same: 3 × 2,304.
    assert total_flops((2, 5, 2), 8, 16) == 2_304
    assert result.model_flops == result.by_op["aten._grouped_mm"] == 3 * 2_304
    assert result.model_by_dtype == {"fp32": 3 * 2_304}


def test_grouped_mm_other_layouts() -> None:
    # (the CPU kernel wants strides in multiples of 16 bytes: sizes in multiples of 4 floats)
    offs = torch.tensor([4, 4, 8], dtype=torch.int32)  # groups 4, 0, 4 along the grouped dim
    # 3-D × 2-D: self (G=3, M=4, K=8), mat2 (K, N_total=12) grouped along N, 4 columns past the
    # last offset: 2·M·K·Σn_g = 2·4·8·8
    got = count(lambda: torch._grouped_mm(torch.randn(3, 4, 8), torch.randn(8, 12), offs=offs))
    assert got.model_flops == 2 * 4 * 8 * 8 == 512
    # 3-D × 3-D (no offsets): batched, 2·G·M·K·N
    got = count(lambda: torch._grouped_mm(torch.randn(3, 4, 8), torch.randn(3, 8, 4)))
    assert got.model_flops == 2 * 3 * 4 * 8 * 4 == 768


def test_scaled_grouped_mm_formula_on_real_offsets() -> None:
    # The fp8 form does not run on the CPU: its formula is applied to real operands directly.
    x = torch.randn(12, 32).to(torch.float8_e4m3fn)
    w = torch.randn(3, 16, 32).to(torch.float8_e4m3fn).transpose(-2, -1)  # (G, K, N) column-major
    offs = torch.tensor([1, 9, 12], dtype=torch.int32)
    op = torch.ops.aten._scaled_grouped_mm.default
    bound = bind_arguments(op, (x, w, torch.ones(12), torch.ones(3, 16)), {"offs": offs})
    cost = FORMULAS["aten::_scaled_grouped_mm"](bound, None, False)
    assert cost.model == total_flops((1, 8, 3), 32, 16) == 2 * 12 * 32 * 16
    assert cost.groups == (1, 8, 3)
    assert cost.tensor.dtype == torch.float8_e4m3fn  # labelled fp8_e4m3 by probe.flops.precision


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped_mm", "modulelist"])
def test_moe_layer_with_uneven_routing(grouped: bool) -> None:
    torch.manual_seed(0)
    layer = MoE(D, F_, E, K, grouped=grouped)
    x = torch.randn(T, D, requires_grad=True)
    loads = moe.ExpertLoadRecorder()
    from probe.flops.counter import StepFlopCounter

    counter = StepFlopCounter(root=layer)
    counter.start()
    counter.on_groups = loads.on_groups
    loads.start(layer)
    layer(x).square().mean().backward()
    result = counter.stop()
    load = loads.stop()
    assert result is not None
    counts = layer.last_counts.tolist()
    assert counts == [32, 27, 5, 0] and sum(counts) == T * K  # uneven; one expert idle
    # router 6·T·d·E = 12,288; experts Σ_e 12·m_e·d·f = 12·16·24·64 = 294,912
    assert hand_step_flops(T, D, F_, E, counts) == 12_288 + 294_912
    assert result.model_flops == 307_200
    assert load == {"<root>": counts}  # tokens per expert, as routed


def test_active_parameter_estimate() -> None:
    layer = MoE(D, F_, E, K, grouped=True)
    n_total = estimate.non_embedding_params(layer)
    expert = 2 * E * D * F_  # w1 and w2 of 4 experts
    assert n_total == D * E + expert
    n_active, note = moe.active_params(layer, n_total)
    # N_active = router d·E + top_k × one expert (2·d·f) = 64 + 2·768
    assert n_active == D * E + K * 2 * D * F_ == 1_600
    assert "top-2 of 4 experts" in note
    dense = torch.nn.Linear(4, 4)
    assert moe.active_params(dense, 20) == (20, "")


def test_active_parameters_of_hf_style_and_config_names() -> None:
    class Router(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.top_k, self.n_routed_experts = 1, 8
            self.weight = torch.nn.Parameter(torch.zeros(8, 4))

    class Block(torch.nn.Module):  # DeepSeek-style: counts on the gate, a shared expert beside
        def __init__(self) -> None:
            super().__init__()
            self.gate = Router()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(4, 4, bias=False) for _ in range(8))
            self.shared_experts = torch.nn.Linear(4, 4, bias=False)

    block = Block()
    (layer,) = moe.find_layers(block)
    assert (layer.num_experts, layer.top_k, layer.local_experts, layer.expert_params) == (8, 1, 8, 128)
    # N = gate 32 + experts 128 + shared 16 = 176; active: 32 + 16 + 1 × 16
    assert moe.active_params(block, 176)[0] == 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ep_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ep")
    mp.spawn(epw.worker, args=(2, _free_port(), str(out)), nprocs=2, join=True)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]


def test_expert_parallel_ranks_count_their_local_experts(ep_ranks: list[dict[str, Any]]) -> None:
    sent = [r["sent"] for r in ep_ranks]  # tokens each rank routed to each of the 4 experts
    for rank, r in enumerate(ep_ranks):
        local = range(rank * 2, rank * 2 + 2)
        got = [sent[0][e] + sent[1][e] for e in local]  # from both ranks, after the all-to-all
        assert r["received"] == got
        # router on the rank's own 32 tokens: 6·T·d·E; its experts: Σ_local 12·M_e·d·f
        hand = 6 * T * D * E + sum(12 * m * D * F_ for m in got)
        assert r["model"] == hand
        assert r["by_op"]["aten._grouped_mm"] == sum(12 * m * D * F_ for m in got)
        assert r["load"] == {"<root>": got}
    busy, idle = ep_ranks[0]["received"], ep_ranks[1]["received"]
    assert sum(busy) > sum(idle)  # the router favours rank 0's experts: uneven by construction
    # Σ over ranks = every token-expert assignment once: 2 ranks × 32 tokens × top-2
    assert sum(busy) + sum(idle) == 2 * T * K


def test_the_monitor_shows_expert_load_per_rank_and_job(ep_ranks: list[dict[str, Any]]) -> None:
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.wire import flops_report

    views = [rank_flops(flops_report(r["message"]), step_time_s=0.1) for r in ep_ranks]
    for r, v in zip(ep_ranks, views):
        got = r["received"]
        x = v.expert_load
        assert x.layers == 1 and x.experts == 2 and x.routed_tokens == sum(got)
        assert x.max_over_mean == pytest.approx(max(got) / (sum(got) / 2))
    job = job_flops(views).expert_load
    every = ep_ranks[0]["received"] + ep_ranks[1]["received"]
    assert job.ranks == 2 and job.experts == 4
    assert job.max_over_mean == pytest.approx(max(every) / (sum(every) / 4))
    per_rank = [sum(r["received"]) for r in ep_ranks]
    assert job.rank_max_over_mean == pytest.approx(max(per_rank) / (sum(per_rank) / 2))
    # JSON: the summary (not the per-layer table), schema-valid
    from flowtop.monitor.snapshot_json import to_json

    snap = _snapshot(views, job_flops(views))
    data = to_json(snap)
    assert_valid_snapshot(data)
    j = data["jobs"][0]
    assert j["expert_load"]["rank_max_over_mean"] == pytest.approx(job.rank_max_over_mean)
    assert "per_layer" not in j["expert_load"]
    assert data["jobs"][0]["ranks"][1]["expert_load"]["routed_tokens"] == per_rank[1]
    # the detail screen's FLOP panel: the rank's and the job's max/mean
    from flowtop.tui.widgets.flops_panel import flops_text

    text = flops_text(views[0], job_flops(views)).plain
    assert f"max/mean {views[0].expert_load.max_over_mean:.2f}" in text
    assert f"rank max/mean {job.rank_max_over_mean:.2f}" in text


def _snapshot(views: list[Any], job: Any) -> Any:
    from flowtop.monitor.snapshot import JobSnapshot, MonitorSnapshot, RankSnapshot

    ranks = tuple(RankSnapshot(rank=i, host="h", pid=100 + i, local_rank=i, incarnation=0, device="cpu",
                               status="live", step=2, step_time_s=0.1, device_time_s=None, tokens_per_step=T,
                               tokens_per_s=None, input_wait_frac=None, heard_at=0.0, lost_messages=0,
                               dropped_messages=0, probe_overhead_frac=None, flops=v)
                  for i, v in enumerate(views))
    j = JobSnapshot(job="ep", world_size=2, ranks=ranks, step=2, step_time_s=0.1, tokens_per_s=None,
                    flops=job, status="running")
    return MonitorSnapshot(taken_at=1.0, listen="tcp://127.0.0.1:1", jobs=(j,), received=0, rejected=0)


class TinyMoELM(torch.nn.Module):
    """Embedding, one MoE layer, LM head; its config names L and d for the estimate."""

    def __init__(self) -> None:
        super().__init__()
        self.config = {"n_layer": 1, "n_embd": D}
        self.emb = torch.nn.Embedding(50, D)
        self.moe = MoE(D, F_, E, K)
        self.head = torch.nn.Linear(D, 50, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.moe(self.emb(idx).view(-1, D)))


def test_flops_message_of_an_moe_model_carries_the_active_estimate() -> None:
    from probe.flops.counter import StepFlopCounter
    from probe.flops.policy import signature_of

    torch.manual_seed(0)
    model = TinyMoELM()
    idx = torch.randint(0, 50, (4, 8))
    counter = StepFlopCounter(root=model)
    counter.start()
    model(idx).logsumexp(-1).mean().backward()
    c = counter.stop()
    msg = accounting.flops_message(c, step=1, tokens=idx.numel(), root=model, signature=signature_of((idx,), {}),
                                   device=torch.device("cpu"), device_name="cpu", flops_per_token=None,
                                   attention="full")
    # N_active = router 64 + top-2 × one expert (2·16·24 = 768) + head 16·50 = 2,400;
    # per token 6·2,400 + 12·L·d·T = 14,400 + 12·1·16·8 = 15,936; 32 tokens
    assert msg["estimated_flops"] == 15_936 * 32
    assert msg["estimate_source"].startswith("6N_active+12LdT") and "N_active=2400" in msg["estimate_source"]
    assert "top-2 of 4 experts" in msg["estimate_source"]
    # the count: router and experts by the real routing, head 3·2·32·16·50 (no attention here)
    counts = model.moe.last_counts.tolist()
    assert msg["model_flops"] == hand_step_flops(32, D, F_, E, counts) + 3 * 2 * 32 * D * 50


def test_the_probe_sends_expert_load_of_every_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Through probe.attach and its publisher: 2 micro-batches per step, routing summed over both.
    import probe

    for k, v in (("FLOWTOP_KERNELS", "0"), ("FLOWTOP_TELEMETRY", "0"), ("FLOWTOP_ADDR", "tcp://127.0.0.1:1"),
                 ("FLOWTOP_FLOPS_BUDGET", "1000")):
        monkeypatch.setenv(k, v)
    out: list[tuple[str, dict[str, Any]]] = []
    assert probe.attach(job="moe")
    step_spy.spy(probe._current(), out)
    try:
        torch.manual_seed(0)
        model = TinyMoELM()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the same routing every step
        batches = [torch.randint(0, 50, (4, 8)) for _ in range(2)]
        per_batch = []
        for _ in range(3):
            for idx in batches:
                model(idx).logsumexp(-1).mean().backward()
                per_batch.append(model.moe.last_counts.tolist())
            opt.step()
            opt.zero_grad()
    finally:
        probe.detach()
    (f,) = [m for k, m in out if k == "flops"]
    summed = [a + b for a, b in zip(per_batch[-2], per_batch[-1])]
    assert f["expert_load"] == {"moe": summed} and sum(summed) == 2 * 32 * K
    assert f["model_flops"] == sum(hand_step_flops(32, D, F_, E, c) + 3 * 2 * 32 * D * 50 for c in per_batch[-2:])
    assert f["flops_by_dtype"] == {"fp32": [f["model_flops"], f["executed_flops"]]}
