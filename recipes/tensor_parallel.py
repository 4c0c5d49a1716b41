"""Tensor parallelism (DTensor, ``torch.distributed.tensor.parallel``) under torchrun; knows nothing
of flowtop.

    flowtop run -- torchrun --nproc-per-node 2 recipes/tensor_parallel.py

The tiny GPT of tiny_gpt.py with separate q/k/v projections, laid out as Megatron and torchtitan
do: q, k, v, the first MLP matmul and the LM head column-parallel, the attention output and the
second MLP matmul row-parallel. Every rank trains the same batch on its share of the heads and
MLP columns (a CPU DeviceMesh over gloo here; "cuda" and nccl on GPUs).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from tiny_gpt import Config, random_batch


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d = cfg.n_embd
        self.head_dim = d // cfg.n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.fc_out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        # -1 heads: a rank holds only its share of the projection columns, i.e. of the heads
        q, k, v = (w(h).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class TPGPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=4)
args = ap.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
torch.manual_seed(0)  # the same weights on every rank before they are sharded
cfg = Config()
model = TPGPT(cfg)
parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
for block in model.blocks:
    parallelize_module(block, mesh, {
        "wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(), "wo": RowwiseParallel(),
        "fc": ColwiseParallel(), "fc_out": RowwiseParallel(),
    })
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)  # one data stream: TP ranks train the same tokens
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch, data)
    loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"rank {dist.get_rank()}: done, loss {loss.item():.3f}")
dist.destroy_process_group()
