"""Demo training script: DDP with synthetic tokens (gloo on CPU, NCCL on CUDA). Knows nothing of
flowtop.

Run under ``flowtop run -- torchrun ... -m flowtop.tools.demo.train`` (what ``flowtop demo``
does); the probe is injected by the bootstrap, not imported here.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from flowtop.tools.demo.gpt import GPT, GPTConfig


def main(argv: list[str] | None = None) -> int:
    """Train for ``--steps`` optimizer steps and exit 0."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--sleep-rank", type=int, default=-1, help="this rank sleeps each step (straggler)")
    ap.add_argument("--sleep-s", type=float, default=0.0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: one GPU per rank (LOCAL_RANK), NCCL between ranks")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: autocast (weights and optimizer stay fp32)")
    args = ap.parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)  # two ranks on two cores
        device = torch.device("cpu")
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(1234 + rank)
    cfg = GPTConfig(vocab_size=2048, n_layer=args.layers, n_head=4, n_embd=args.width, block_size=args.seq)
    model: torch.nn.Module = GPT(cfg).to(device)
    if distributed:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    for _ in range(args.steps):
        idx = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device=device)
        with autocast:
            _, loss = model(idx, torch.roll(idx, -1, dims=1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == args.sleep_rank and args.sleep_s > 0:
            time.sleep(args.sleep_s)
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
