"""Context parallelism, written out by hand, under torchrun; knows nothing of flowtop.

    flowtop run -- torchrun --nproc-per-node 2 recipes/context_parallel.py

torch's ``context_parallel`` (torch.distributed.tensor.experimental) needs CUDA attention kernels:
on CPU its dispatcher has no sharding rule for the CPU flash kernel. This recipe does what it does
in the plainest way: every rank of the ``cp`` mesh holds one contiguous shard of each sequence
(the token ids are sharded before the model, as ``context_parallel(buffers=[ids, labels])`` does),
computes the linear layers on its shard, and attends from its local queries to *all* keys: K and V
are all-gathered along the sequence (their gradients reduced back in the backward), with the causal
mask offset by the shard's start. Parameters are replicated; their gradients are averaged over the
cp group after each backward. The model is TinyGPT's layout (tiny_gpt.py).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from tiny_gpt import Config, random_batch


class GatherSeq(torch.autograd.Function):
    """All-gather along the sequence dim (2 of B×H×S×D); the gradient of my shard is the sum over
    ranks of their gradients w.r.t. it (all-reduce, then my slice)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:  # type: ignore[no-untyped-def]
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[no-untyped-def]
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        n, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(n, dim=2)[r], None


class CPBlock(nn.Module):
    def __init__(self, cfg: Config, group) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.n_head, self.group = cfg.n_head, group
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.fc_out = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # t: this rank's shard of the sequence
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        k, v = GatherSeq.apply(k, self.group), GatherSeq.apply(v, self.group)  # every key of the sequence
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # local queries × all keys
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc_out(F.gelu(self.fc(self.ln2(x))))


class CPGPT(nn.Module):
    """TinyGPT on a sequence shard: ``forward(local_idx, local_targets, start)``."""

    def __init__(self, cfg: Config, group) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(CPBlock(cfg, group) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor, start: int) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(start, start + t, device=idx.device)
        # causal over the whole sequence: local query i (position start + i) sees keys 0 .. start + i
        mask = torch.arange(self.cfg.block_size, device=idx.device)[None, :] <= pos[:, None]
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=4, help="sequences per step (each split across the cp ranks)")
args = ap.parse_args()

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
cp_group, cp, rank = mesh.get_group("cp"), mesh.size(), mesh.get_local_rank("cp")
torch.manual_seed(0)  # the same weights on every rank
cfg = Config()
model = CPGPT(cfg, cp_group)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.Generator().manual_seed(1)  # one data stream: the cp ranks hold shards of the same sequences
shard = cfg.block_size // cp
for step in range(args.steps):
    idx, targets = random_batch(cfg, args.batch, data)
    start = rank * shard
    loss = model(idx[:, start:start + shard].contiguous(), targets[:, start:start + shard].contiguous(), start)
    loss.backward()
    for p in model.parameters():  # replicated weights: average the shards' gradients
        dist.all_reduce(p.grad, group=cp_group)
        p.grad /= cp
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"rank {rank}: done, loss {loss.item():.3f}")
dist.destroy_process_group()
