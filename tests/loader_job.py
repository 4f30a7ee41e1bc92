"""One rank of a small DDP job whose batches come from a DataLoader with 2 worker processes, run
under torchrun (``python -m torch.distributed.run --nproc-per-node 4 loader_job.py OUT MODE``).

``MODE`` places a 120 ms stall per step on rank 2: ``workers`` in the dataset (``slow_sample``:
30 ms per sample, 8 samples per batch, 240 ms per batch in each of the 2 workers), ``transfer``
in the main process as each batch is received from a worker (a batch that takes 120 ms to
unpack, like a slow transfer or ``pin_memory``), ``none`` nowhere. ``late`` is ``workers`` from
step 20 on (two healthy windows first) with the live regression check on and the window lines
logged, as a job runs by default: the windows after the stall begins are judged against the
healthy ones. The model's own step takes about 25 ms (a sleep in the forward), so the workers
must supply a batch every ~25 ms.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from torch.utils.data import DataLoader, default_collate

from loader_support import Samples
from rank_support import backward_and_step, join_torchrun_gloo, leave_gloo
from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
from stagefrontier.logs import show_on_stderr

STALL_RANK = 2
SAMPLE_S = 0.03
RECEIVE_S = 0.12
BATCH = 8
STEPS = 50
"""Five windows: room for a capture the router decides on in any of the first three."""
WINDOW = 10
COMPUTE_S = 0.025
LATE_FROM = 20
"""``late``: the first slow step."""
LATE_STEPS = 60
"""``late``: four windows after the stall begins."""


def receive(batch: torch.Tensor, delay_s: float) -> torch.Tensor:
    """Unpacks a batch in the main process (``delay_s`` late: the transfer stall)."""
    if delay_s:
        time.sleep(delay_s)
    return batch


class SlowToReceive:
    """A batch whose unpacking in the main process takes ``delay_s``."""

    def __init__(self, batch: torch.Tensor, delay_s: float) -> None:
        self.batch, self.delay_s = batch, delay_s

    def __reduce__(self) -> Any:
        return receive, (self.batch, self.delay_s)


class Collate:
    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, samples: list[torch.Tensor]) -> SlowToReceive:
        return SlowToReceive(default_collate(samples), self.delay_s)


def main(out_dir: str, mode: str) -> None:
    rank = join_torchrun_gloo()
    stalled = rank == STALL_RANK
    late = mode == "late"
    steps = LATE_STEPS if late else STEPS
    slow = stalled and mode in ("workers", "late")
    samples = Samples(BATCH * (steps + 4), SAMPLE_S if slow else 0.0, BATCH * LATE_FROM * late)
    loader = DataLoader(
        samples,
        batch_size=BATCH,
        num_workers=2,
        collate_fn=Collate(RECEIVE_S if stalled and mode == "transfer" else 0.0),
    )
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # ``late``: no cooldown, so an incident the start-up windows open (workers starting) does
    # not keep the router from the stall that follows.
    router = ProfilerRouter(capture_timeout_s=20.0, cooldown_windows=0 if late else 5)
    # The live regression check is off (but in ``late``): these jobs test the router's own
    # decision on a window, and on a shared machine a swing in load is a real slowdown that
    # check may rightly capture.
    if late:  # each window's headline and, at DEBUG, its details line, on stderr
        show_on_stderr(logging.DEBUG)
        collect = CollectConfig(out_dir=out_dir, timeout_s=20.0)
    else:
        collect = CollectConfig(out_dir=out_dir, timeout_s=20.0, regression=None, log=False)
    timer = StageTimer(config=TimerConfig(window=WINDOW, collection=collect, router=router))
    for step, x in enumerate(timer.iter(loader)):
        if step == steps:
            break
        with timer.step():
            with timer.stage("model.fwd_loss_cpu_wall"):
                time.sleep(COMPUTE_S)
                loss = model(x).sum()
            backward_and_step(timer, loss, optimizer)
    del model
    leave_gloo(timer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
