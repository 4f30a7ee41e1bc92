"""StageFrontier in a Lightning run: one callback, nothing else changes. CPU, 2 DDP ranks.

    python examples/lightning_ddp.py --steps 60 --window 20 --out sf-lightning
    python examples/lightning_ddp.py --delay-rank 1 --delay-ms 40   # a slow data loader on rank 1
    python examples/lightning_ddp.py --csv sf-lightning/windows.csv --tensorboard sf-lightning/tb

Lightning's "ddp" strategy starts the second rank by running this script again. Rank 0 writes
OUT/windows.jsonl, OUT/packets/ and one log line per window; ``--delay-rank`` makes that rank's
dataset sleep in ``__getitem__`` (``num_workers=0``), and the windows route to
``data.next_wait`` led by that rank.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from stagefrontier.integrations.lightning import StageFrontierCallback


class Regression(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random regression samples; ``delay_s`` per batch on ``delay_rank`` (sleeping in
    ``__getitem__``, spread over the batch), to stand in for a slow input pipeline."""

    def __init__(self, n: int, batch_size: int, delay_rank: int, delay_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = self.x @ torch.randn(32, 1, generator=g)
        self.per_item_s = delay_s / batch_size
        self.delay_rank = delay_rank

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.per_item_s and _rank() == self.delay_rank:
            time.sleep(self.per_item_s)
        return self.x[i], self.y[i]


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument("--delay-rank", type=int, default=-1)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--out", default="sf-lightning")
    parser.add_argument("--csv", help="also write one CSV row per window here")
    parser.add_argument("--tensorboard", help="also write TensorBoard scalars to this folder")
    parser.add_argument("--no-callback", action="store_true", help="run without StageFrontier")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # Lightning sets its own loggers to INFO (tips, device lines): only its warnings here, so the
    # output is StageFrontier's window lines.
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)

    sinks: list[Any] = []
    if args.csv:
        from stagefrontier.sinks import CsvSink

        sinks.append(CsvSink(args.csv))
    if args.tensorboard:
        from stagefrontier.sinks import TensorBoardSink

        sinks.append(TensorBoardSink(args.tensorboard))
    callbacks = (
        []
        if args.no_callback
        else [StageFrontierCallback(window=args.window, out_dir=args.out, sinks=sinks)]
    )

    pl.seed_everything(0, verbose=False)
    data = Regression(
        args.steps * args.batch_size * args.devices * args.accumulation,
        args.batch_size,
        args.delay_rank,
        args.delay_ms / 1e3,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=args.steps,
        accumulate_grad_batches=args.accumulation,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyModel(), DataLoader(data, batch_size=args.batch_size, num_workers=0))
    if trainer.global_rank == 0 and not args.no_callback:
        print(f"windows: {os.path.join(args.out, 'windows.jsonl')}")


if __name__ == "__main__":
    main()
