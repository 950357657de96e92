"""A tiny PyTorch Lightning job on CPU that can hang on purpose.

Run as ``python lightning_train.py --devices 2``: Lightning's own launcher
(``Trainer(strategy="ddp", accelerator="cpu", devices=N)``) keeps the user's process as
local rank 0 and starts the same command again for local ranks 1..N-1 with LOCAL_RANK,
NODE_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; no process has RANK in its
environment. DDP all-reduces the gradients in backward (gloo).

``--fail linger``: from step ``--fail-at-step`` rank ``--fail-rank`` sleeps forever inside
``training_step`` (its data "ran out" without telling the others); the other ranks block in
DDP's all-reduce. Rank 0 prints ``step N/M | loss ...`` lines, and the lingering rank the
``HANGWATCH-STALL`` marker that train.py prints.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--fail", choices=("none", "linger"), default="none")
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-at-step", type=int, default=30)
    p.add_argument("--step-sleep", type=float, default=0.05, help="simulated data-loading time per step (s)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Lightning's advice about DataLoader workers and the like: noise in the job's log.
    warnings.filterwarnings("ignore")
    import lightning as L

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            step = self.global_step + 1
            if args.fail == "linger" and self.global_rank == args.fail_rank and step == args.fail_at_step:
                print(f"HANGWATCH-STALL t={time.time():.3f} mode=linger rank={self.global_rank} step={step}",
                      flush=True)
                while True:
                    time.sleep(3600)
            time.sleep(args.step_sleep)
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            if self.global_rank == 0:
                print(f"step {step}/{args.steps} | loss {loss.item():.4f}", flush=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(4096, 32)
    data = DataLoader(TensorDataset(x, x[:, :1] * 0.5), batch_size=16)
    trainer = L.Trainer(
        strategy="ddp", accelerator="cpu", devices=args.devices, max_steps=args.steps,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Tiny(), data)
    if trainer.global_rank == 0:
        print("training finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
