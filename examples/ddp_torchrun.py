"""Minimal StageFrontier integration in a plain DDP loop, launched with torchrun.

    torchrun --standalone --nproc-per-node 4 examples/ddp_torchrun.py --steps 60 --out sf-out

Rank 0 writes sf-out/windows.jsonl and sf-out/packets/; every rank logs nothing extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import stagefrontier


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--out", default="stagefrontier")
    args = parser.parse_args()
    if "RANK" not in os.environ:  # run directly: say how to launch it, not torch's traceback
        sys.exit(
            "ddp_torchrun.py runs under torchrun, one process per rank: torchrun --standalone "
            "--nproc-per-node 4 examples/ddp_torchrun.py"
        )

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun provides RANK, WORLD_SIZE, MASTER_ADDR/PORT
    logging.basicConfig(level=logging.INFO if dist.get_rank() == 0 else logging.WARNING)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = (torch.randn(32, 64) for _ in range(args.steps))

    collection = stagefrontier.CollectConfig(out_dir=args.out)
    config = stagefrontier.TimerConfig(window=args.window, collection=collection)
    with stagefrontier.StageTimer(config=config) as timer:
        for _ in range(args.steps):
            with timer.step():
                with timer.stage("data.next_wait"):
                    x = next(batches)
                with timer.stage("model.fwd_loss_cpu_wall"):
                    loss = F.cross_entropy(model(x), torch.zeros(32, dtype=torch.long))
                with timer.stage("model.backward_cpu_wall"):
                    loss.backward()
                with timer.stage("optim.step_cpu_wall"):
                    optimizer.step()
                    optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
