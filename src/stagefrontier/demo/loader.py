"""The demo's batches made by DataLoader worker processes (``DemoConfig.loader_workers``).

Each worker makes whole batches in turn (batch ``i`` by worker ``i mod k``), from its own seeded
stream. A data fault sleeps inside the worker that makes a faulty step's batch, as a slow
dataset would, for the fault's delay times the worker count: the loader then hands over at most
one batch per delay, and the rank waits for the part of that delay its own step does not hide
(with a 120 ms step, ``data@2:250ms`` keeps rank 2 waiting about 130 ms per step).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..record.recorder import StageTimer
from .faults import FaultInjector
from .model import CharData

Batch = tuple[torch.Tensor, torch.Tensor]


class WorkerBatches(IterableDataset):  # type: ignore[misc]
    def __init__(self, data: CharData, faults: FaultInjector, accumulation: int, seed: int):
        self.data = data
        self.faults = faults
        self.accumulation = accumulation
        self.seed = seed

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        self.data.generator.manual_seed(self.seed * 1009 + worker)
        for index in itertools.count(worker, workers):
            delay_s = self.faults.delay_s("data", index // self.accumulation) * workers
            if delay_s:
                time.sleep(delay_s)
            yield next(self.data)


def worker_batches(
    data: CharData,
    faults: FaultInjector,
    accumulation: int,
    workers: int,
    seed: int,
    timer: StageTimer,
) -> Iterator[Batch]:
    """An endless stream of ``data``'s batches from ``workers`` worker processes, watched by
    ``timer`` from inside as a loop that iterates its loader itself has them watched
    (``StageTimer.watch_dataloader``): each window carries the workers' figures, and the data
    wait's lead is judged over their bursts, as in a user's loop under ``timer.iter``."""
    dataset = WorkerBatches(data, faults, accumulation, seed)
    # forked, as on Linux by default: a spawned worker would receive the corpus through shared
    # memory, which a small /dev/shm refuses
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, multiprocessing_context="fork"
    )
    counters = timer.watch_dataloader(loader)  # before the workers start
    for batch in loader:
        if counters is not None:
            counters.consumed += 1
        yield batch
