"""One rank of the time-to-incident benchmark's prefetching loop, run under torchrun by
``time_to_incident.py`` (``python -m torch.distributed.run --nproc-per-node 4
incident_loader_job.py OUT STALL_FROM``).

A small DDP job whose batches come from a DataLoader with 2 worker processes, each prefetching 2
batches, iterated through ``timer.iter``. From batch ``STALL_FROM`` on, rank 2's dataset takes
30 ms per sample (240 ms per batch of 8 in each worker, a batch every ~120 ms from two workers),
while the model's step takes about 25 ms: rank 2 waits for data and every other rank waits for
rank 2. The profiler router and the live regression check run with their defaults. Rank 0 leaves
a marker file after every step (as the demo does) whose modification time tells the harness when
the step ended.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
from stagefrontier.analysis import schema
from stagefrontier.demo.train import STEP_MARKER, leave_process_group

STALL_RANK = 2
SAMPLE_S = 0.03
BATCH = 8
WORKERS = 2
PREFETCH = 2
STEPS = 120
WINDOW = 10
COMPUTE_S = 0.025


def late_sample(index: int, delay_s: float) -> torch.Tensor:
    """One sample, ``delay_s`` late (the stall the incident should name)."""
    if delay_s:
        time.sleep(delay_s)
    return torch.full((4,), float(index))


class SamplesSlowFrom(Dataset[torch.Tensor]):
    """``n`` samples; those from index ``slow_from`` on take ``delay_s`` each."""

    def __init__(self, n: int, slow_from: int, delay_s: float) -> None:
        self.n, self.slow_from, self.delay_s = n, slow_from, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return late_sample(index, self.delay_s if index >= self.slow_from else 0.0)


def main(out_dir: str, stall_from: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    delay_s = SAMPLE_S if rank == STALL_RANK else 0.0
    samples = SamplesSlowFrom(BATCH * (STEPS + WORKERS * PREFETCH), BATCH * stall_from, delay_s)
    loader = DataLoader(samples, batch_size=BATCH, num_workers=WORKERS, prefetch_factor=PREFETCH)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collect = CollectConfig(out_dir=out_dir, log=False)
    timer = StageTimer(
        config=TimerConfig(window=WINDOW, collection=collect, router=ProfilerRouter())
    )
    markers = Path(out_dir, ".markers")
    markers.mkdir(parents=True, exist_ok=True)
    losses = []
    for step, x in enumerate(timer.iter(loader)):
        if step == STEPS:
            break
        with timer.step():
            with timer.stage(schema.FORWARD_STAGE):
                loss = model(x).sum()
                time.sleep(COMPUTE_S)  # the model's own work
            with timer.stage(schema.BACKWARD_STAGE):
                loss.backward()
            with timer.stage(schema.CALLBACKS_STAGE):
                losses.append(loss.item())
            with timer.stage(schema.OPTIMIZER_STAGE):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            (markers / STEP_MARKER.format(step=step)).touch()
    timer.close()
    del model, optimizer
    leave_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
