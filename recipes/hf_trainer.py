"""HF transformers ``Trainer`` on a tiny GPT-2 built from a config (random weights, nothing
downloaded); knows nothing of flowtop.

    flowtop run -- python recipes/hf_trainer.py
    flowtop run -- torchrun --nproc-per-node 2 recipes/hf_trainer.py     # the same, DDP

Prints the Trainer's own metrics (train_samples_per_second, total_flos) as one JSON line.
"""

import argparse
import json
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--batch", type=int, default=4, help="per device")
ap.add_argument("--accum", type=int, default=2, help="gradient accumulation steps")
ap.add_argument("--seq", type=int, default=32)
args = ap.parse_args()


class RandomTokens(torch.utils.data.Dataset):
    """In-memory random token sequences; labels = inputs (the model shifts them)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


config = GPT2Config(vocab_size=512, n_positions=args.seq, n_embd=64, n_layer=2, n_head=4)
model = GPT2LMHeadModel(config)
train_set = RandomTokens(args.steps * args.batch * args.accum, args.seq, config.vocab_size)
with tempfile.TemporaryDirectory() as out:
    training_args = TrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accum, learning_rate=1e-3, use_cpu=True, report_to=[],
        save_strategy="no", logging_steps=args.steps, disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set)
    result = trainer.train()
if trainer.is_world_process_zero():
    print("FRAMEWORK_METRICS " + json.dumps({**result.metrics, "total_flos": trainer.state.total_flos}))
