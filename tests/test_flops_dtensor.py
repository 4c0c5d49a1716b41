"""Local FLOPs per rank under DTensor (issue 14 part 1): real gloo jobs on a CPU DeviceMesh.

Each rank of a 2- and a 4-process job trains the small GPT of tests/dtensor_worker.py one step
(twice: DTensor's sharding caches cold, then warm) under TP, TP + sequence parallel (local_map'ped
attention), FSDP2 and FSDP2 × TP, counted by the probe. Pinned against formulas derived here by
hand, and Σ over ranks against one unsharded process counting the same tokens.

Hand formulas (full attention convention; model FLOPs = forward + 2 × forward, every linear
computes input and weight gradients because the embedding output needs a gradient):
  linears, forward: 2·B·T·(L·(4·d² + 2·d·f) + d·V)        (q, k, v, o; two MLP matmuls; LM head)
  attention, forward: L · 4·B·H·T²·(d/H) = L·4·B·T²·d
  model = 3 · (linears + attention) / t on each of t tensor-parallel ranks
  executed = 3 · linears / t + 3.5 · attention / 2 / t (what ran: CPU flash attention's backward
    recomputes the scores, 2.5 × forward, and its causal kernel skips the masked half)
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import dtensor_worker as w
from probe.flops.counter import StepFlopCounter

pytest.importorskip("torch.distributed.tensor.parallel", reason="DTensor tensor parallelism needs torch.distributed (absent from some torch builds)")
if not torch.distributed.is_available():  # pragma: no cover - CPU wheels have gloo
    pytest.skip("torch.distributed unavailable", allow_module_level=True)

CFG = w.Config()
L, D, F_, V, H, T = CFG.n_layer, CFG.n_embd, CFG.ffn, CFG.vocab, CFG.n_head, w.SEQ


def hand_model(b: int, t: int = 1) -> int:
    linears = 2 * b * T * (L * (4 * D * D + 2 * D * F_) + D * V)
    attention = L * 4 * b * T * T * D
    total = 3 * (linears + attention)
    assert total % t == 0
    return total // t


def hand_executed(b: int, t: int = 1) -> int:
    """What ran: the matmuls' 3×, and the causal SDPA's forward + fused backward (2.5×: it
    recomputes the scores) over half the square (its kernel skips the masked half)."""
    return hand_model(b, t) - 3 * hand_attention_fwd(b, t) + hand_attention_fwd(b, t) * 7 // 4


def hand_attention_fwd(b: int, t: int = 1) -> int:
    return L * 4 * b * T * T * D // t


def hand_estimate(b: int, t: int = 1) -> float:
    """6·N_local + 12·L·d·T/t per token, times B·T tokens. N_local: the projections and the LM
    head split t ways, the norms (2 per block + the final one, weight and bias) whole."""
    n_local = (L * (4 * D * D + 2 * D * F_) + D * V) // t + (L * 2 * 2 * D + 2 * D)
    return float((6 * n_local + 12 * L * D * T / t) * b * T)


def test_hand_formulas_of_this_model() -> None:
    # d=32, f=64, V=64, L=2, B=2, T=16: linears 2·32·(2·8192 + 2048) = 1,179,648; attention 131,072
    assert hand_model(2) == 3 * (1_179_648 + 131_072) == 3_932_160
    assert hand_estimate(2) == (6 * 18_752 + 12 * 2 * 32 * 16) * 32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(world: int, layouts: list[str], tmp: Path) -> list[dict[str, Any]]:
    mp.spawn(w.worker, args=(world, _free_port(), str(tmp), layouts), nprocs=world, join=True)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _job(2, ["tp", "sp", "fsdp", "tp_head"], tmp_path_factory.mktemp("dt2"))


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _job(4, ["tp", "fsdp_tp"], tmp_path_factory.mktemp("dt4"))


def one_rank_count(seeds: list[int]) -> int:
    """Model FLOPs of the unsharded model in this process on the concatenated batches."""
    torch.manual_seed(0)
    model = w.GPT(CFG)
    batches = [w.batch(s) for s in seeds]
    idx, tgt = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    counter = StepFlopCounter(root=model)
    counter.start()
    logits = model(idx)
    F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)).backward()
    count = counter.stop()
    assert count is not None
    return count.model_flops


def _check_rank(rank_result: dict[str, Any], b: int, t: int) -> None:
    for which in ("first", "second"):  # cold caches run ops on FakeTensors: never costed
        r = rank_result[which]
        assert r["model"] == hand_model(b, t), which
        assert r["executed"] == hand_executed(b, t), which
        # by_op counts what ran: the causal kernel's half of the square
        assert r["by_op"]["aten._scaled_dot_product_flash_attention_for_cpu"] == hand_attention_fwd(b, t) // 2
        assert r["uncounted"] == {}
        msg = r["message"]
        assert msg["model_flops"] == hand_model(b, t)
        assert msg["estimated_flops"] == pytest.approx(hand_estimate(b, t), rel=1e-12)


def test_tensor_parallel_two_ranks_count_their_shards(two_ranks: list[dict[str, Any]]) -> None:
    for layout in ("tp", "sp"):
        for rank in two_ranks:
            _check_rank(rank[layout], w.BATCH, 2)
            parallel = rank[layout]["second"]["message"]["parallel"]
            assert parallel.startswith("local FLOPs of this rank; mesh (tp=2)")
            assert "matmuls split 2-way" in parallel and "fsdp" not in parallel
        # both TP ranks see the same tokens: together they did the one-rank step's work, once
        total = sum(rank[layout]["second"]["model"] for rank in two_ranks)
        assert total == one_rank_count([100]) == hand_model(w.BATCH)
    assert "[R]" in two_ranks[0]["sp"]["second"]["message"]["parallel"]  # sequence-parallel norms


def test_an_lm_head_left_whole_under_tp_counts_half_of_its_model_flops_on_each_rank(
        two_ranks: list[dict[str, Any]]) -> None:
    """A plain nn.Linear head beside TP-sharded blocks runs whole on every TP rank, on the same
    tokens: each rank's kernels ran it (executed FLOPs: whole), but the model's work is the head
    once per group (the sum of the ranks' model FLOPs counted it twice: 13 % above the model in a
    new user's trial). Each rank's model FLOPs and estimate now count half of it, as they count
    half of the split layers; ``parallel`` names it."""
    head = 2 * w.BATCH * T * D * V  # forward FLOPs of the LM head
    for rank in two_ranks:
        second = rank["tp_head"]["second"]
        assert second["model"] == hand_model(w.BATCH, 2)  # half of everything, the head included
        assert second["executed"] == hand_executed(w.BATCH, 2) + 3 * head // 2  # the other half of the head ran too
        msg = second["message"]
        assert msg["model_flops"] == hand_model(w.BATCH, 2)
        assert msg["estimated_flops"] == pytest.approx(hand_estimate(w.BATCH, 2), rel=1e-12)
        share = D * V / (L * (4 * D * D + 2 * D * F_) + D * V)  # 2,048 of 18,432 Linear weight elements
        assert f"whole on every rank of the split: output.weight ({100 * share:.0f} % of Linear weights; " \
               "model FLOPs count 1/2 of them, executed all)" in msg["parallel"], msg["parallel"]
        assert "whole on every rank" not in rank["tp"]["second"]["message"]["parallel"]  # the head sharded
    # Σ over the group: the one-process model's FLOPs, as with the head sharded
    assert sum(r["tp_head"]["second"]["model"] for r in two_ranks) == hand_model(w.BATCH)


def test_fsdp2_two_ranks_count_their_own_batch(two_ranks: list[dict[str, Any]]) -> None:
    for rank in two_ranks:
        _check_rank(rank["fsdp"], w.BATCH, 1)  # whole (gathered) weights, the rank's own batch
        parallel = rank["fsdp"]["second"]["message"]["parallel"]
        assert "mesh (d0=2); fsdp over d0; matmuls unsplit" in parallel
    assert [rank["fsdp"]["data_rank"] for rank in two_ranks] == [0, 1]
    total = sum(rank["fsdp"]["second"]["model"] for rank in two_ranks)
    assert total == one_rank_count([100, 101]) == hand_model(2 * w.BATCH)


def test_tensor_parallel_four_ranks(four_ranks: list[dict[str, Any]]) -> None:
    for rank in four_ranks:
        _check_rank(rank["tp"], w.BATCH, 4)
        assert "mesh (tp=4); matmuls split 4-way" in rank["tp"]["second"]["message"]["parallel"]
    assert sum(rank["tp"]["second"]["model"] for rank in four_ranks) == one_rank_count([100])


def test_fsdp2_times_tp_two_by_two(four_ranks: list[dict[str, Any]]) -> None:
    for rank in four_ranks:
        _check_rank(rank["fsdp_tp"], w.BATCH, 2)  # FSDP's all-gather is a DTensor over tp again
        parallel = rank["fsdp_tp"]["second"]["message"]["parallel"]
        assert "mesh (dp=2, tp=2); fsdp over dp; matmuls split 2-way" in parallel
    assert sorted(rank["fsdp_tp"]["data_rank"] for rank in four_ranks) == [0, 0, 1, 1]
    total = sum(rank["fsdp_tp"]["second"]["model"] for rank in four_ranks)
    assert total == one_rank_count([100, 101]) == hand_model(2 * w.BATCH)


def test_the_monitor_shows_the_layout_beside_local_figures(four_ranks: list[dict[str, Any]]) -> None:
    """The rank's real message through the monitor's FlopsView: JSON field and FLOP panel row."""
    from flowtop.monitor.accounting import job_flops, rank_flops
    from probe.wire import flops_report
    from flowtop.monitor.snapshot_json import _flops_json
    from flowtop.tui.widgets.flops_panel import flops_text

    msgs = [rank["fsdp_tp"]["second"]["message"] for rank in four_ranks]
    views = [rank_flops(flops_report(m), 0.1) for m in msgs]
    assert views[0] is not None and views[0].parallel == msgs[0]["parallel"]
    assert _flops_json(views[0], 0.0)["parallel"].startswith("local FLOPs of this rank; mesh (dp=2, tp=2)")
    job = job_flops(views)
    assert job is not None and job.model_flops_per_step == hand_model(2 * w.BATCH)  # Σ local = global
    # the same layout on every rank: said once, of the sum
    assert job.parallel == msgs[0]["parallel"].replace("local FLOPs of this rank", "Σ over the ranks of their local FLOPs")
    text = flops_text(views[0]).plain
    assert "parallel    mesh (dp=2, tp=2); fsdp over dp; matmuls split 2-way" in text


def test_linears_left_whole_beside_an_expert_or_context_split_are_not_said_to_be_counted_twice() -> None:
    """Only ranks of a tensor-parallel group run a whole Linear on the same tokens: a 2-way
    ``ep`` mesh (its ranks route tokens of their own) read "whole on every rank of the split:
    head.weight +1 more (…; Σ over those ranks counts them 2×)". One process of a fake 2-rank
    world (torch's fake process group: the layout needs no collective)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from probe.flops.dtensor import layout_of

    def model(dim: str) -> torch.nn.Module:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(dim,))
        m = torch.nn.Module()
        m.experts = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8, 8), mesh, [Shard(0)]))
        m.attn = torch.nn.Linear(8, 8)
        m.head = torch.nn.Linear(8, 16)
        return m

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        for dim in ("ep", "cp"):
            layout = layout_of(model(dim))
            assert layout is not None and layout.compute_degree == 2 and layout.whole == ()
            assert "whole on every rank" not in layout.describe()
        layout = layout_of(model("tp"))  # the same split named tensor parallel: both Linears whole
        assert layout is not None and layout.whole == ("head.weight", "attn.weight") and layout.tp_degree == 2
        assert "model FLOPs count 1/2 of them, executed all" in layout.describe()
    finally:
        dist.destroy_process_group()
