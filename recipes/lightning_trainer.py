"""Lightning ``Trainer`` (automatic optimization) on the tiny GPT, with Lightning's own
``ThroughputMonitor``; knows nothing of flowtop.

    flowtop run -- python recipes/lightning_trainer.py                  # one process
    flowtop run -- python recipes/lightning_trainer.py --devices 2      # strategy="ddp", 2 CPU processes

Prints the ThroughputMonitor's last figures (rank 0) as one JSON line.
"""

import argparse
import json
import tempfile

import lightning as L
import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import CSVLogger

from tiny_gpt import Config, TinyGPT, random_batch


class LitGPT(L.LightningModule):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.model = TinyGPT(cfg)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        idx, targets = batch
        loss = self.model(idx, targets)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=4, help="per process")
    ap.add_argument("--devices", type=int, default=1)
    args = ap.parse_args()

    cfg = Config()
    torch.manual_seed(0)
    idx, targets = random_batch(cfg, args.steps * args.batch * args.devices, torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(idx, targets), batch_size=args.batch)
    # items = tokens (batch × seq); rates averaged over the last 30 batches (after the warm-up)
    throughput = ThroughputMonitor(batch_size_fn=lambda b: b[0].size(0), length_fn=lambda b: b[0].numel(),
                                   window_size=min(30, args.steps))
    with tempfile.TemporaryDirectory() as logs:
        trainer = L.Trainer(
            max_steps=args.steps, accelerator="cpu", devices=args.devices,
            strategy="ddp" if args.devices > 1 else "auto",
            logger=CSVLogger(logs), log_every_n_steps=1, callbacks=[throughput],
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(LitGPT(cfg), loader)
    if trainer.is_global_zero:
        metrics = {k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("train")}
        print("FRAMEWORK_METRICS " + json.dumps(metrics))
