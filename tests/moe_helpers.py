"""A small MoE layer for the MoE FLOP tests: a router, top-k, and experts run either as grouped
GEMMs (``torch._grouped_mm``, torchtitan's layout) or as a loop over ``nn.ModuleList`` experts
(HF Mixtral's). Real torch on the CPU, uneven routing by construction.

Hand formula of one training step on T tokens (x needs a gradient, every weight is trained):

* router d→E: forward 2·T·d·E, backward 2 × that (input and weight gradients): 6·T·d·E;
* experts (w1: d→f, w2: f→d, no gate): expert e with m_e routed tokens costs 2·m_e·d·f per
  GEMM forward, 2 GEMMs, backward 2 × forward: Σ_e 12·m_e·d·f (= 12·d·f·T·k when nothing drops).

Elementwise work (softmax, top-k, SiLU, gathers, the weighted sum) is not counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GroupedExperts(nn.Module):
    """Experts as 3-D weights (E_local, d, f) and (E_local, f, d), run by grouped GEMMs."""

    def __init__(self, d: int, f: int, experts: int) -> None:
        super().__init__()
        self.num_experts = experts
        self.w1 = nn.Parameter(torch.randn(experts, d, f) / d**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, f, d) / f**0.5)

    def forward(self, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        h = F.silu(torch._grouped_mm(x, self.w1, offs=offs))
        return torch._grouped_mm(h, self.w2, offs=offs)


class Expert(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)))


class MoE(nn.Module):
    """Token-choice top-k MoE. ``grouped``: experts as grouped GEMMs, else a ModuleList loop.
    ``skew`` biases the router towards the first experts, so routing is uneven."""

    def __init__(self, d: int = 16, f: int = 24, experts: int = 4, top_k: int = 2, grouped: bool = True,
                 skew: float = 2.0) -> None:
        super().__init__()
        self.num_experts, self.top_k = experts, top_k
        self.router = nn.Linear(d, experts, bias=False)
        self.skew = torch.linspace(skew, 0.0, experts)
        self.experts: nn.Module = GroupedExperts(d, f, experts) if grouped else nn.ModuleList(
            Expert(d, f) for _ in range(experts))
        self.last_counts: torch.Tensor | None = None  # tokens per expert of the last forward

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        probs = (self.router(x) + self.skew).softmax(-1)
        return probs.topk(self.top_k, dim=-1)  # weights (T, k), expert ids (T, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        weights, ids = self.route(x)
        flat = ids.flatten()
        self.last_counts = torch.bincount(flat, minlength=self.num_experts)
        order = flat.argsort(stable=True)
        tokens = x.repeat_interleave(self.top_k, dim=0)[order]  # grouped by expert
        if isinstance(self.experts, GroupedExperts):
            offs = self.last_counts.cumsum(0).to(torch.int32)
            out = self.experts(tokens, offs)
        else:
            parts, start = [], 0
            for e, n in enumerate(self.last_counts.tolist()):
                if n:  # HF skips experts no token chose
                    parts.append(self.experts[e](tokens[start:start + n]))
                start += n
            out = torch.cat(parts)
        unsorted = torch.empty_like(out).index_copy(0, order, out)
        return (unsorted.view(t, self.top_k, d) * weights.unsqueeze(-1)).sum(1)


def hand_step_flops(tokens: int, d: int, f: int, experts: int, counts: list[int]) -> int:
    """The module docstring's formula: router 6·T·d·E + Σ_e 12·m_e·d·f."""
    return 6 * tokens * d * experts + sum(12 * m * d * f for m in counts)
