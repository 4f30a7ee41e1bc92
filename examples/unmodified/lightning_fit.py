"""A Lightning fit under torchrun, with no StageFrontier in it.

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        examples/unmodified/lightning_fit.py --steps 40 --stall forward@1

Lightning reads torchrun's environment and joins its ranks (``strategy="ddp"``, Gloo on CPU).
``--workers N`` gives the DataLoader N worker processes; ``--stall data@R`` makes rank R's
samples slow (``slow_sample``: 120 ms of stall per step), ``--stall forward@R`` rank R's
forward (``slow_forward``). The model's own step takes about 25 ms.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

STALL_S = 0.12
"""The injected stall per step."""
COMPUTE_S = 0.025
"""The model's own time per step (a sleep: the ranks share a small machine)."""
BATCH = 16


def slow_sample(delay_s: float) -> None:
    time.sleep(delay_s)


def slow_forward(delay_s: float) -> None:
    time.sleep(delay_s)


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, sample_delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.delay_s = sample_delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            slow_sample(self.delay_s)
        return self.x[index], self.y[index]


class Regressor(pl.LightningModule):
    def __init__(self, forward_delay_s: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        self.delay_s = forward_delay_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(COMPUTE_S)
        if self.delay_s:
            slow_forward(self.delay_s)
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--stall", default="", help="data@RANK or forward@RANK")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    kind, _, stalled = args.stall.partition("@")
    stall = STALL_S if stalled and int(stalled) == int(os.environ.get("RANK", "0")) else 0.0
    # each worker makes a whole batch: with W workers a batch is W times slower to stall as much
    per_sample = stall * max(1, args.workers) / BATCH if kind == "data" else 0.0
    data = Points(args.steps * BATCH * ranks, per_sample)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    loader = DataLoader(data, batch_size=BATCH, num_workers=args.workers)
    trainer.fit(Regressor(stall if kind == "forward" else 0.0), loader)


if __name__ == "__main__":
    main()
