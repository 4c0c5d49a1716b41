"""HF ``accelerate`` loop (``Accelerator``, gradient accumulation) on a tiny LLaMA (GQA, SwiGLU)
built from a config (random weights, nothing downloaded); knows nothing of flowtop.

    flowtop run -- accelerate launch recipes/hf_accelerate.py                                  # one process
    flowtop run -- accelerate launch --multi_gpu --num_processes 2 recipes/hf_accelerate.py   # DDP (gloo on CPU)
"""

import argparse

import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=15, help="optimizer steps")
ap.add_argument("--batch", type=int, default=2, help="per process and micro-batch")
ap.add_argument("--accum", type=int, default=2, help="gradient accumulation steps")
ap.add_argument("--seq", type=int, default=32)
args = ap.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=args.accum)
config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.seq)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, config.vocab_size, (args.steps * args.accum * args.batch * accelerator.num_processes, args.seq),
                       generator=torch.Generator().manual_seed(0))
loader = torch.utils.data.DataLoader(tokens, batch_size=args.batch)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # shards the loader per process

model.train()
steps = 0
for input_ids in loader:
    with accelerator.accumulate(model):  # optimizer.step() only every `accum` micro-batches
        loss = model(input_ids=input_ids, labels=input_ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    steps += accelerator.sync_gradients  # True on the micro-batch that ends an optimizer step
accelerator.print(f"done: {steps} optimizer steps, loss {loss.item():.3f}")
