"""StageFrontier in an Accelerate training loop: the timer wraps the loop's own lines. CPU.

    python examples/accelerate_loop.py --steps 40 --window 10 --out sf-accelerate
    accelerate launch --cpu --num_processes 2 examples/accelerate_loop.py --delay-rank 1
    torchrun --standalone --nproc-per-node 2 examples/accelerate_loop.py --delay-rank 1

``Accelerator()`` initializes torch.distributed under a launcher, so a timer built after it
collects every rank's windows on rank 0 through the job's store, as in a plain DDP loop (see
examples/ddp_torchrun.py). ``timer.iter`` charges each batch's fetch to the step that uses it,
prefetching included. ``sinks=`` adds destinations (here a CSV file) after the defaults.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import stagefrontier
from stagefrontier.sinks import CsvSink


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--delay-rank", type=int, default=-1)
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--out", default="sf-accelerate")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    logging.basicConfig(level=logging.INFO if accelerator.is_main_process else logging.WARNING)
    torch.manual_seed(0)
    x = torch.randn(args.steps * 16 * accelerator.num_processes, 32)
    y = x @ torch.randn(32, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    slow = accelerator.process_index == args.delay_rank

    collection = stagefrontier.CollectConfig(
        out_dir=args.out, sinks=(CsvSink(f"{args.out}/windows.csv"),)
    )
    timer = stagefrontier.StageTimer(
        config=stagefrontier.TimerConfig(window=args.window, collection=collection)
    )
    with timer:
        for x_batch, y_batch in timer.iter(loader):  # data.next_wait, charged to the next step
            with timer.step():
                with timer.stage("model.fwd_loss_cpu_wall"):
                    if slow:
                        time.sleep(args.delay_ms / 1e3)  # an injected host stall in the forward
                    loss = F.mse_loss(model(x_batch), y_batch)
                with timer.stage("model.backward_cpu_wall"):
                    accelerator.backward(loss)
                with timer.stage("optim.step_cpu_wall"):
                    optimizer.step()
                    optimizer.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main()
