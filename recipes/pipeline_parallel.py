"""Pipeline parallelism (``torch.distributed.pipelining``) under torchrun; knows nothing of flowtop.

    flowtop run -- torchrun --nproc-per-node 2 recipes/pipeline_parallel.py

The tiny GPT of tiny_gpt.py cut in two stages, one per rank: stage 0 holds the token and position
embeddings and block 0, stage 1 block 1, the final LayerNorm and the LM head; the schedule
(GPipe, or 1F1B with ``--schedule 1f1b``) splits each batch into micro-batches, sends activations
forward and gradients back, computes the loss on the last stage. Each rank then steps its own
optimizer over its own stage's parameters (gloo on CPU here; nccl and a device per rank on GPUs).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from tiny_gpt import Block, Config, random_batch


class FirstStage(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.block = Block(cfg)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.block(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))


class LastStage(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.block = Block(cfg)
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(self.block(x)))


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=8, help="sequences per step (all micro-batches)")
ap.add_argument("--microbatches", type=int, default=4)
ap.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
assert dist.get_world_size() == 2, "two stages, one per rank"
torch.manual_seed(rank)
cfg = Config()
module = FirstStage(cfg) if rank == 0 else LastStage(cfg)
stage = PipelineStage(module, stage_index=rank, num_stages=2, device=torch.device("cpu"))
schedule_cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
schedule = schedule_cls(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)  # both ranks draw the same batches: stage 0 the inputs, stage 1 the targets
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch, data)
    if rank == 0:
        schedule.step(idx)
    else:
        losses: list[torch.Tensor] = []
        schedule.step(target=targets, losses=losses)
    opt.step()
    opt.zero_grad(set_to_none=True)
if rank == 1:
    print(f"rank 1: done, loss {torch.stack(losses).mean().item():.3f}")
dist.destroy_process_group()
