"""A spawned 3-rank Gloo job whose training ends as its one incident's capture settles, for
the test of the end of a run with an incident just closed (``test_end_of_run``).

Rank 0 asks for a capture of ranks 1 and 0 on ``data.next_wait`` (rank 1's data stage sleeps
longer) a few steps in; the windows are longer than the run, so no window covers the captured
steps before the timers close: the ranks stop together once rank 0's router holds both
answers, and rank 0 settles the incident as its timer closes. Rank 0 writes what the
``stagefrontier`` logger said (``log-rank0.txt``); each rank writes the wall time of
its ``timer.close()`` (``close-rank<r>.json``: for a reader, never asserted on).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from capture_support import train_step
from rank_support import join_gloo, log_to_file

CLOSE_FILE = "close-rank{rank}.json"
LOG_FILE = "log-rank0.txt"
STAGE = "data.next_wait"
SUSPECT = 1


@dataclass(frozen=True)
class EndJob:
    """A job whose rank 0 asks for one manual capture of rank ``SUSPECT`` at step
    ``request_at`` and closes its timer as soon as every rank has answered, so the incident
    settles as the timer closes (its windows are longer than the run)."""

    out_dir: str
    ranks: int = 3
    request_at: int = 3
    max_steps: int = 3000  # a bound only: the ranks stop together once the capture is answered


def run_rank(rank: int, job: EndJob, port: int) -> None:
    import torch
    from torch import nn

    from stagefrontier import CollectConfig, Gates, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group

    if rank == 0:
        log_to_file(Path(job.out_dir, LOG_FILE))
    join_gloo(rank, job.ranks, port, timeout_s=120.0)
    router = ProfilerRouter(
        steps=3,
        poll_s=0.02,
        capture_timeout_s=60.0,
        with_stack=False,
        record_ops=True,  # no sampled stacks: the op diff the test reads is of the operators
        gates=Gates(min_confident_fraction=2.0),  # no window is actionable: the manual one only
    )
    collection = CollectConfig(
        mode="store", out_dir=job.out_dir, timeout_s=30.0, log=False, regression=None
    )
    config = TimerConfig(
        window=job.max_steps + 1,  # no window before the close: none covers the capture
        collection=collection,
        router=router,
    )
    timer = StageTimer(config=config)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(job.max_steps):
        answered = False
        coordinator = router._attached.runtime.coordinator if router._attached.runtime else None
        if coordinator is not None:
            if step == job.request_at:
                router.request_capture([SUSPECT, 0], stage=STAGE)
            current = coordinator.open
            answered = current is not None and len(current.answers) == len(current.request.ranks)
        flag = torch.tensor([float(answered)])
        dist.all_reduce(flag)
        if flag[0] > 0:
            break
        train_step(timer, model, gen, 0.04 if rank == SUSPECT else 0.01)
    started = time.perf_counter()
    timer.close()
    close_s = time.perf_counter() - started
    Path(job.out_dir, CLOSE_FILE.format(rank=rank)).write_text(json.dumps(close_s))
    del model
    leave_process_group()
