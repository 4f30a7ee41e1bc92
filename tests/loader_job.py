"""One rank of a small DDP job whose batches come from a DataLoader with 2 worker processes, run
under torchrun (``python -m torch.distributed.run --nproc-per-node 4 loader_job.py OUT MODE``).

``MODE`` places a 120 ms stall per step on rank 2: ``workers`` in the dataset (``slow_sample``:
30 ms per sample, 8 samples per batch, 240 ms per batch in each of the 2 workers), ``transfer``
in the main process as each batch is received from a worker (a batch that takes 120 ms to
unpack, like a slow transfer or ``pin_memory``), ``none`` nowhere. ``late`` is ``workers`` from
step 20 on (two healthy windows first) with the live regression check on and the window lines
logged, as a job runs by default: the windows after the stall begins are judged against the
healthy ones. The model's own step takes about 25 ms (a sleep in the forward), so the workers
must supply a batch every ~25 ms. On a busy machine the step grows with the load while a fixed
stall does not (about 40 ms at load 30; at load 40 to 100 backward held the top of a stalled
window over the 120 ms stall), so ``late`` sizes its stall from rank 2's own healthy steps: its
workers then supply a batch every ``LATE_STALL_STEPS`` median healthy steps (120 ms at least),
and the data wait holds most of every stalled step whatever the load.
"""

from __future__ import annotations

import logging
import statistics
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
LATE_STALL_STEPS = 4
"""``late``: the stalled workers' time per batch, in the stalled rank's median healthy steps (per
worker: times the workers, which make batches side by side)."""
LATE_MEASURED = range(2, 13)
"""``late``: the healthy steps the stall is sized from, the first two (start-up) left out. The
size is written at step 13; a worker is asked for a batch at most ``2 x 2`` batches ahead of the
step that consumes it (the loader's prefetch), so no worker reaches step 20's samples before."""
WORKERS = 2


def size_the_stall(out: Path, step_s: list[float]) -> None:
    """Writes the per-sample delay that makes each worker's batch ``LATE_STALL_STEPS`` median
    healthy steps per worker (``step_s``), at least ``SAMPLE_S``, for the workers to read."""
    per_batch = LATE_STALL_STEPS * statistics.median(step_s) * WORKERS
    staged = out.with_suffix(".tmp")
    staged.write_text(repr(max(SAMPLE_S, per_batch / BATCH)))
    staged.replace(out)  # whole or absent, never half written


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
    delay_file = Path(out_dir) / ".late_sample_delay_s"
    samples = Samples(
        BATCH * (steps + 4),
        SAMPLE_S if slow else 0.0,
        BATCH * LATE_FROM * late,
        delay_file if slow and late else None,
    )
    loader = DataLoader(
        samples,
        batch_size=BATCH,
        num_workers=WORKERS,
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
    began: list[float] = []
    for step, x in enumerate(timer.iter(loader)):
        began.append(time.perf_counter())
        if slow and late and step == LATE_MEASURED.stop:
            size_the_stall(delay_file, [began[s + 1] - began[s] for s in LATE_MEASURED])
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
