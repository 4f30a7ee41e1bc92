"""A Lightning fit under torchrun, with no StageFrontier in it.

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        examples/unmodified/lightning_fit.py --steps 40

Lightning reads torchrun's environment and joins its ranks (``strategy="ddp"``, Gloo on CPU).
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * 16 * 4, 16, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(__import__("os").environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), DataLoader(data, batch_size=16))


if __name__ == "__main__":
    main()
