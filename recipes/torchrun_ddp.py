"""DistributedDataParallel under torchrun; knows nothing of flowtop.

    flowtop run -- torchrun --nproc-per-node 2 recipes/torchrun_ddp.py
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from tiny_gpt import Config, TinyGPT, random_batch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=4, help="per rank")
args = ap.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs (then torch.cuda.set_device(LOCAL_RANK) first)
rank = dist.get_rank()
torch.manual_seed(0)  # same initial weights on every rank (DDP also broadcasts rank 0's)
cfg = Config()
model = DDP(TinyGPT(cfg))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch, data)
    loss = model(idx, targets)
    loss.backward()  # gradients all-reduced here
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"rank {rank}: done, loss {loss.item():.3f}")
dist.destroy_process_group()
