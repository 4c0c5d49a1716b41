"""``torch.multiprocessing.spawn`` + ``init_process_group(rank=...)``: no launcher, no RANK variable.
Knows nothing of flowtop.

    flowtop run -- python recipes/mp_spawn.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from tiny_gpt import Config, TinyGPT, random_batch


def train(rank: int, world_size: int, steps: int, batch: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)  # rank passed in, not in the env
    torch.manual_seed(0)
    cfg = Config()
    model = DDP(TinyGPT(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1 + rank)
    for step in range(steps):
        idx, targets = random_batch(cfg, batch, data)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(f"rank {rank}: done, loss {loss.item():.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4, help="per rank")
    ap.add_argument("--nprocs", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    mp.spawn(train, args=(args.nprocs, args.steps, args.batch), nprocs=args.nprocs)
