"""One rank of a 4-rank Gloo DDP job in which rank 2 is starved of CPU, run under torchrun
(``python -m torch.distributed.run --nproc-per-node 4 starved_rank_job.py OUT CORE``).

Rank 2 pins itself to ``CORE``, where the test keeps CPU burners of its own running, and lowers
its priority (``NICE``) so that they, not the other jobs of a shared machine, decide how long it
waits (its thread's niceness, and its session's where the kernel groups the scheduling of a
session's processes: torchrun starts each rank in a session of its own); the other ranks pin
themselves to the other cores. Nothing in the program delays rank 2:
it computes what every rank computes, but waits for a CPU, so it reaches backward's all-reduce
late. Windows of
10 steps; ``timer.watch_ddp`` times the buckets.
"""

import contextlib
import os
import sys
from pathlib import Path

import torch

from rank_support import backward_and_step, join_torchrun_gloo, leave_gloo
from stagefrontier import CollectConfig, StageTimer, TimerConfig

STARVED_RANK = 2
NICE = 10
"""Rank 2's niceness: about a tenth of a burner's share of the core."""
WINDOW, STEPS = 10, 30


def pin(rank: int, core: int) -> None:
    """Rank 2 onto ``core`` at a lower priority, the others off it."""
    cores = {core} if rank == STARVED_RANK else os.sched_getaffinity(0) - {core}
    os.sched_setaffinity(0, cores)  # before any thread starts: every thread inherits it
    if rank == STARVED_RANK:
        os.nice(NICE)
        with contextlib.suppress(OSError):  # no autogroups: the thread's niceness is enough
            Path("/proc/self/autogroup").write_text(str(NICE))


def main(out_dir: str, core: int) -> None:
    rank = int(os.environ["RANK"])
    pin(rank, core)
    join_torchrun_gloo()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
        torch.nn.ReLU(), torch.nn.Linear(512, 1),
    )  # fmt: skip
    model = torch.nn.parallel.DistributedDataParallel(net)
    timer = StageTimer(
        config=TimerConfig(window=WINDOW, collection=CollectConfig(out_dir=out_dir, timeout_s=60))
    )
    timer.watch_ddp(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        with timer.step():
            with timer.stage("data.next_wait"):
                x = torch.randn(64, 256, generator=generator)
            with timer.stage("model.fwd_loss_cpu_wall"):
                loss = model(x).square().mean()
            backward_and_step(timer, loss, optimizer)
    leave_gloo(timer)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
