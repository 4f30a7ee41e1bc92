"""One rank of a 4-rank Gloo DDP job in which rank 2 is starved of CPU, forked from the test
session's server (``run_ranks(run_rank, 4, (OUT, CORE), start_method=START_METHOD)``).

Rank 2 pins itself to ``CORE``, where the test keeps CPU burners of its own running, and lowers
its priority (``NICE``) so that they, not the other jobs of a shared machine, decide how long it
waits: its thread's niceness, and its session's where the kernel groups the scheduling of a
session's processes (rank 2 first leaves the session it was forked in, the test run's, so that
the niceness is its alone). The other ranks pin themselves to the other cores. Nothing in the
program delays rank 2: it computes what every rank computes, but waits for a CPU, so it reaches
backward's all-reduce late. Windows of 10 steps; ``timer.watch_ddp`` times the buckets.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from rank_support import backward_and_step, join_gloo

RANKS, STARVED_RANK = 4, 2
NICE = 10
"""Rank 2's niceness: about a tenth of a burner's share of the core."""
WINDOW, STEPS = 10, 30


def pin(rank: int, core: int) -> None:
    """Rank 2 onto ``core`` at a lower priority, in a session of its own; the others off it."""
    cores = {core} if rank == STARVED_RANK else os.sched_getaffinity(0) - {core}
    os.sched_setaffinity(0, cores)  # before any thread starts: every thread inherits it
    if rank == STARVED_RANK:
        os.setsid()  # a forked child leads no group: this cannot fail
        os.nice(NICE)
        with contextlib.suppress(OSError):  # no autogroups: the thread's niceness is enough
            Path("/proc/self/autogroup").write_text(str(NICE))


def run_rank(rank: int, job: tuple[str, int], port: int) -> None:
    import torch

    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group

    out_dir, core = job
    pin(rank, core)
    join_gloo(rank, RANKS, port, timeout_s=120.0)
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
    timer.close()
    del model, optimizer
    leave_process_group()
