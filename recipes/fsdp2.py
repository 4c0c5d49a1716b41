"""FSDP2 (``torch.distributed.fsdp.fully_shard``) under torchrun; knows nothing of flowtop.

    flowtop run -- torchrun --nproc-per-node 2 recipes/fsdp2.py
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from tiny_gpt import Config, TinyGPT, random_batch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=4, help="per rank")
args = ap.parse_args()

dist.init_process_group("gloo")  # CPU here; on GPUs "nccl" and torch.cuda.set_device(LOCAL_RANK)
rank = dist.get_rank()
torch.manual_seed(0)
cfg = Config()
model = TinyGPT(cfg)
for block in model.blocks:  # shard each block, then the rest (embeddings, head) at the root
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # over the sharded (DTensor) parameters
data = torch.Generator().manual_seed(1 + rank)
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch, data)
    loss = model(idx, targets)  # all-gathers each block's parameters just in time
    loss.backward()  # reduce-scatters the gradients
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"rank {rank}: done, loss {loss.item():.3f}")
dist.destroy_process_group()
