"""A plain DDP training script over a DataLoader, with no StageFrontier in it.

    torchrun --standalone --nproc-per-node 4 examples/unmodified/train_ddp.py
    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        examples/unmodified/train_ddp.py --workers 2 --stall data@2

``--accumulate K`` runs K micro-batches per optimizer step; ``--stall data@R`` makes rank R's
samples slow (``slow_sample``, in the DataLoader's workers when there are any), ``--stall
forward@R`` rank R's forward (``slow_forward``): 120 ms of stall per step, or MS with
``--stall data@R:MSms``. The model's own step takes about 25 ms.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler

STALL_S = 0.12
"""The injected stall per step."""
COMPUTE_S = 0.025
"""The model's own time per micro-batch (a sleep: the ranks share a small machine)."""


def slow_sample(delay_s: float) -> None:
    time.sleep(delay_s)


def slow_forward(delay_s: float) -> None:
    time.sleep(delay_s)


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, sample_delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long()
        self.delay_s = sample_delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            slow_sample(self.delay_s)
        return self.x[index], self.y[index]


class Net(nn.Module):
    def __init__(self, forward_delay_s: float) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
        self.delay_s = forward_delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(COMPUTE_S)
        if self.delay_s:
            slow_forward(self.delay_s)
        return self.body(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--stall", default="", help="data@RANK or forward@RANK, with :MSms for other than 120 ms"
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    where, _, size = args.stall.partition(":")
    kind, _, stalled = where.partition("@")
    stall_s = float(size.removesuffix("ms")) / 1e3 if size else STALL_S
    stall = stall_s if stalled and int(stalled) == rank else 0.0
    # each worker makes a whole batch: with W workers a batch is W times slower to stall as much
    per_sample = stall * max(1, args.workers) / args.batch if kind == "data" else 0.0
    batches = args.steps * args.accumulate
    data = Points(batches * args.batch * dist.get_world_size(), per_sample)
    loader = DataLoader(
        data,
        batch_size=args.batch,
        sampler=DistributedSampler(data, shuffle=False),
        num_workers=args.workers,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(stall if kind == "forward" else 0.0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for index, (x, y) in enumerate(loader):
        loss = F.cross_entropy(model(x), y) / args.accumulate
        loss.backward()
        if (index + 1) % args.accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    if rank == 0:
        print(f"trained {batches // args.accumulate} steps, last loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
