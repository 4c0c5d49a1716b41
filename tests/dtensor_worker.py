"""Ranks of the DTensor FLOP tests (tests/test_flops_dtensor.py): a small GPT trained one step
under tensor parallelism, sequence parallelism, FSDP2 and FSDP2 + TP on a CPU DeviceMesh (gloo),
each step counted by the probe's StepFlopCounter and turned into the probe's ``flops`` message.

Started with ``torch.multiprocessing.spawn``; every rank writes ``rank<r>.json`` into ``out``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 4
    ffn: int = 64
    vocab: int = 64


BATCH, SEQ = 2, 16


class Attention(nn.Module):
    """q, k, v, o projections; heads taken as ``-1`` so a TP rank views only its local heads."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d = cfg.n_embd
        self.head_dim = d // cfg.n_head
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.core: Any = _sdpa  # replaced by a local_map'ped version in the "sp" layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = self.core(q, k, v)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.attn = Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, cfg.ffn, bias=False), nn.GELU(),
                                 nn.Linear(cfg.ffn, cfg.n_embd, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.config = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.n_embd)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.LayerNorm(cfg.n_embd)
        self.output = nn.Linear(cfg.n_embd, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def batch(seed: int, n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices and targets of one batch (the same seed gives the same batch anywhere)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, Config().vocab, (n, SEQ + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def counted_step(model: nn.Module, idx: torch.Tensor, tgt: torch.Tensor) -> dict[str, Any]:
    """One forward + backward inside the probe's counting window, and its flops message."""
    from probe.flops import accounting
    from probe import wire
    from probe.flops.counter import StepFlopCounter
    from probe.flops.policy import signature_of

    counter = StepFlopCounter(root=model)
    counter.start()
    logits = model(idx)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tgt.reshape(-1)).backward()
    count = counter.stop()
    assert count is not None
    fields = accounting.flops_message(
        count, step=1, tokens=idx.numel(), root=model, signature=signature_of((idx,), {}),
        device=torch.device("cpu"), device_name="cpu", flops_per_token=None, attention="full")
    key = wire.RankKey("dt", "host", os.getpid(), dist.get_rank(), 0)
    decoded = wire.decode(wire.encode("flops", key, 1, time.time(), fields))  # the wire accepts it
    model.zero_grad(set_to_none=True)
    return {"model": count.model_flops, "executed": count.executed_flops, "by_op": count.by_op,
            "uncounted": count.uncounted, "message": dict(decoded.fields)}


def _tp_plan(model: GPT, mesh: Any, sequence_parallel: bool, shard_head: bool = True) -> None:
    """torchtitan's layout: colwise q/k/v/w1 and LM head, rowwise o/w2; with sequence
    parallelism the norms and the residual stream are sharded on the sequence dim and the
    attention core runs under local_map on the local heads."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.experimental import local_map
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module)

    if sequence_parallel:
        parallelize_module(model, mesh, {
            "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        })
    elif shard_head:
        parallelize_module(model, mesh, {"output": ColwiseParallel(output_layouts=Replicate())})
    for block in model.layers:
        if sequence_parallel:
            seq = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
            plan = {
                "norm1": SequenceParallel(), "norm2": SequenceParallel(), "attn": seq, "mlp": seq,
                "attn.wq": ColwiseParallel(use_local_output=False),
                "attn.wk": ColwiseParallel(use_local_output=False),
                "attn.wv": ColwiseParallel(use_local_output=False),
                "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
                "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
            }
            heads = [Shard(1)]  # (B, H, T, D) sharded on heads
            block.attn.core = local_map(_sdpa, out_placements=heads, in_placements=(heads, heads, heads),
                                        device_mesh=mesh)
        else:
            plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
                    "attn.wo": RowwiseParallel(), "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
        parallelize_module(block, mesh, plan)


def run_layout(layout: str, rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same weights on every rank
    model = GPT(Config())
    if layout in ("tp", "sp", "tp_head"):  # tp_head: the LM head left whole on every rank
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        _tp_plan(model, mesh, sequence_parallel=layout == "sp", shard_head=layout != "tp_head")
        data_rank = 0  # every TP rank sees the same tokens
    elif layout == "fsdp":
        mesh = init_device_mesh("cpu", (world,))  # unnamed: FSDP's dim is found from its state
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        data_rank = rank
    elif layout == "fsdp_tp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        _tp_plan(model, mesh["tp"], sequence_parallel=False)
        for block in model.layers:
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        data_rank = mesh.get_local_rank("dp")
    else:
        raise ValueError(layout)
    idx, tgt = batch(100 + data_rank)
    first = counted_step(model, idx, tgt)  # DTensor's sharding caches are cold here
    second = counted_step(model, idx, tgt)  # ... and warm here
    return {"first": first, "second": second, "data_rank": data_rank}


def worker(rank: int, world: int, port: int, out: str, layouts: list[str]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = {name: run_layout(name, rank, world) for name in layouts}
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
