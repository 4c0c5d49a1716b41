"""Ranks of the expert-parallel MoE test (tests/test_moe_flops.py): one MoE layer whose E experts
are split over an EP group of ``world`` ranks (E/world local experts each, grouped GEMMs), tokens
exchanged with a differentiable all-to-all (gloo), one training step counted by the probe's
StepFlopCounter with its expert-load recorder, turned into the probe's ``flops`` message.

Routing is uneven by construction (the router is biased towards the first experts, which rank 0
holds), so each rank's expert FLOPs differ. Started with ``torch.multiprocessing.spawn``; every
rank writes ``rank<r>.json`` into ``out``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
from torch import nn

from moe_helpers import GroupedExperts

D, FFN, EXPERTS, TOP_K, TOKENS = 16, 24, 4, 2, 32


class EPMoE(nn.Module):
    """Router replicated on every rank; experts ``rank·E_local … (rank+1)·E_local − 1`` local."""

    def __init__(self, world: int, rank: int) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.world, self.rank = EXPERTS, TOP_K, world, rank
        torch.manual_seed(0)  # the same router everywhere
        self.router = nn.Linear(D, EXPERTS, bias=False)
        self.skew = torch.linspace(2.0, 0.0, EXPERTS)
        self.local = EXPERTS // world
        torch.manual_seed(100 + rank)  # each rank's own experts
        self.experts = GroupedExperts(D, FFN, self.local)
        self.sent_counts: list[int] = []  # tokens this rank routed to each global expert
        self.received: list[int] = []  # tokens each local expert got, from all ranks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        weights, ids = (self.router(x) + self.skew).softmax(-1).topk(self.top_k, dim=-1)
        flat = ids.flatten()
        counts = torch.bincount(flat, minlength=EXPERTS)
        self.sent_counts = counts.tolist()
        order = flat.argsort(stable=True)
        tokens = x.repeat_interleave(self.top_k, dim=0)[order]  # grouped by global expert
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)  # [src0's counts for my experts, src1's, ...]
        by_src = recv_counts.view(self.world, self.local).tolist()
        send_split = counts.view(self.world, self.local).sum(1).tolist()
        recv_split = [sum(row) for row in by_src]
        got = dnn.all_to_all_single(tokens.new_empty(sum(recv_split), d), tokens, recv_split, send_split)
        # Received blocks are by source rank, each sorted by local expert: regroup by expert.
        perm, start = [], 0
        blocks = []
        for row in by_src:
            pos, mine = start, []
            for n in row:
                mine.append(list(range(pos, pos + n)))
                pos += n
            blocks.append(mine)
            start = pos
        for e in range(self.local):
            for src in range(self.world):
                perm.extend(blocks[src][e])
        perm_t = torch.tensor(perm, dtype=torch.long)
        self.received = [sum(by_src[s][e] for s in range(self.world)) for e in range(self.local)]
        offs = torch.tensor(self.received, dtype=torch.int64).cumsum(0).to(torch.int32)
        out = self.experts(got[perm_t], offs)
        back = torch.empty_like(out).index_copy(0, perm_t, out)
        ret = dnn.all_to_all_single(tokens.new_empty(tokens.shape[0], d), back, send_split, recv_split)
        unsorted = torch.empty_like(ret).index_copy(0, order, ret)
        return (unsorted.view(t, self.top_k, d) * weights.unsqueeze(-1)).sum(1)


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from probe.flops import accounting
        from probe.flops.counter import StepFlopCounter
        from probe.flops.moe import ExpertLoadRecorder, load_field

        torch.set_num_threads(1)
        model = EPMoE(world, rank)
        torch.manual_seed(7 + rank)
        x = torch.randn(TOKENS, D, requires_grad=True)
        counter, loads = StepFlopCounter(root=model), ExpertLoadRecorder()
        counter.start()
        counter.on_groups = loads.on_groups
        loads.start(model)
        model(x).square().mean().backward()
        count = counter.stop()
        load = load_field(loads.stop())
        assert count is not None
        msg = accounting.flops_message(
            count, step=2, tokens=TOKENS, root=model, signature=(), device=torch.device("cpu"),
            device_name="cpu", flops_per_token=None, attention="full")
        msg["expert_load"] = load
        result: dict[str, Any] = {
            "model": count.model_flops, "by_op": count.by_op, "sent": model.sent_counts,
            "received": model.received, "load": load, "message": msg,
        }
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
