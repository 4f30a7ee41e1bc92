"""A sharded data-parallel training script over a DataLoader, with no StageFrontier in it, for
``stagefrontier run``'s tests: FSDP2 (``fully_shard`` on each layer and on the root) by default,
or with ``--zero1`` DDP with a ZeRO-1 optimizer (``ZeroRedundancyOptimizer``):

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        train_sharded.py --steps 31 --hold PATH

The root's forward sleeps ``COMPUTE_S`` before its layers run (under FSDP2 their parameters are
gathered then), so a forward stage that starts at an inner layer instead of the root misses the
sleep. ``--hold PATH``: after the last step, every rank waits (at most ``HOLD_S``) until PATH
exists before it ends the process group, so a test reads the live sinks of the finished windows
first. With ``--zero1`` every rank prints the sum of its parameters after training (the same on
every rank once ZeRO-1 has broadcast its shards).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

COMPUTE_S = 0.02
"""The root's own time per step before its layers run (a sleep: the ranks share a small
machine)."""
HOLD_S = 300.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(COMPUTE_S)
        return self.body(x)


def hold(path: Path) -> None:
    deadline = time.monotonic() + HOLD_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=31, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hold", type=Path, default=None)
    parser.add_argument("--zero1", action="store_true", help="DDP with a ZeRO-1 optimizer")
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
    model: nn.Module = Net()
    if args.zero1:
        model = DistributedDataParallel(model)
        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05
        )
    else:
        for layer in model.body:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for inputs, labels in loader:
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
    if args.hold is not None:
        hold(args.hold)
    if dist.get_rank() == 0:
        print(f"trained {args.steps} steps ({type(model).__name__})")
    if args.zero1:
        total = sum(float(p.detach().sum()) for p in model.parameters())
        print(f"rank {dist.get_rank()}: {type(optimizer).__name__}, parameter sum {total:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
