"""The training step the GPU benchmarks share: the demo GPT, bf16 autocast, AdamW (fused on
CUDA), random tokens made once on the device (no input pipeline to measure)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

#: The small GPT of the benchmarks (≈7 M parameters, launch-bound on an H200): GPTConfig kwargs.
SMALL: dict[str, int] = dict(vocab_size=8192, n_layer=4, n_head=4, n_embd=256, block_size=256)


def gpt_step(cfg_kw: dict[str, int], batch: int, device: str, seed: int = 0,
             bf16: bool = True) -> tuple[Any, Callable[[], None]]:
    """``(model, step)``: one call of ``step`` is forward, backward, optimizer step, zero_grad
    (under bf16 autocast unless ``bf16`` is False: a CPU without bf16 instructions emulates it,
    ~20× slower on this 2-core box: 4 s a step of the small GPT instead of 0.2 s)."""
    import torch

    from flowtop.tools.demo.gpt import GPT, GPTConfig

    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the device: a 940 M model is slow to init on CPU
        model = GPT(GPTConfig(**cfg_kw))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    x = torch.randint(0, cfg_kw["vocab_size"], (batch, cfg_kw["block_size"]), device=device)
    y = torch.randint(0, cfg_kw["vocab_size"], (batch, cfg_kw["block_size"]), device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step
