"""A DDP training script with a ZeRO-1 optimizer (``ZeroRedundancyOptimizer``) over a
DataLoader, with no StageFrontier in it, for ``stagefrontier run``'s tests:

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 2 \
        train_zero.py --steps 21

Rank 0 prints the model's class and the optimizer's, and the sum of the parameters after
training (every rank holds the same parameters once ZeRO-1 has broadcast its shards).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=21, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    generator = torch.Generator().manual_seed(0)
    n = args.steps * args.batch * dist.get_world_size()
    x = torch.randn(n, 16, generator=generator)
    data = TensorDataset(x, (x.sum(dim=1) > 0).long())
    loader = DataLoader(
        data, batch_size=args.batch, sampler=DistributedSampler(data, shuffle=False)
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(), optimizer_class=torch.optim.AdamW, lr=0.01
    )
    for inputs, labels in loader:
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    total = sum(float(p.detach().sum()) for p in model.parameters())
    print(
        f"rank {dist.get_rank()}: trained {args.steps} steps "
        f"({type(optimizer).__name__}), parameter sum {total:.6f}"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
