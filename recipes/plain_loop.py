"""Plain training loop with the probe attached explicitly (works with or without `flowtop run`).

    flowtop                          # terminal 1: the monitor
    python recipes/plain_loop.py     # terminal 2 (or: flowtop run -- python recipes/plain_loop.py)
"""

import argparse

import torch

import probe
from tiny_gpt import Config, TinyGPT, random_batch

probe.attach()  # idempotent; a no-op when `flowtop run` already attached it

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=4)
args = ap.parse_args()

torch.manual_seed(0)
cfg = Config()
model = TinyGPT(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch)
    loss = model(idx, targets)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"done: {args.steps} steps, loss {loss.item():.3f}")
