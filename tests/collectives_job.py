"""One rank of a 4-rank Gloo DDP job whose gradient buckets StageTimer times
(``timer.watch_ddp``), run under torchrun (``python -m torch.distributed.run --nproc-per-node 4
collectives_job.py OUT``). Windows of 10 steps, each with its own case:

* windows 0-2: healthy (the slow collective's baseline; no late rank);
* window 3: a 100 ms compute delay in an autograd hook on the first layer's weight gradient of
  rank 1 (inside backward, so the last bucket DDP reduces waits for it);
* window 4: the demo's comm fault on rank 1 (``comm@1:100ms``: a sleep in the communication
  hook before bucket 0's all-reduce);
* window 5: every rank's bucket 0 all-reduce slowed by 80 ms (a sleep chained to its future);
* window 6: an FSDP2 (``fully_shard``) model instead, rank 2 sleeping 100 ms in forward before
  the model runs (late into forward's first all-gather; ``timer.watch_fsdp``);
* window 7: the FSDP2 model, rank 3 sleeping 100 ms after its forward, before the program's own
  loss all-reduce (``timer.collective``).

Every step the program all-reduces its loss inside ``timer.collective("loss_all_reduce")``,
and the DDP model's optimizer is ZeRO-1 (``ZeroRedundancyOptimizer``, ``timer.watch_zero``).
The communication hook is the program's own (``user_hook``), registered after ``watch_ddp``: it
counts its calls, which each rank writes to ``hook-<rank>.json`` with its parameters' sum (DDP
still averages the gradients: the sums agree). A second, unused model whose hook was registered
before ``watch_ddp`` is left untimed (``early_watched``), and so is it as an FSDP2 model
(``not_sharded_watched``: it holds no ``fully_shard`` module); the windows say why.
"""

# no ``from __future__ import annotations``: DDP checks the hook's annotations as types

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.demo.faults import FaultInjector, parse_fault

WINDOW = 10
"""Steps per window: enough that rank 0's own analysis of the window before, which competes
for the CPUs at the start of each window on a loaded host, delays it in fewer than half."""
STEPS = 80
LATE_RANK = 1
COMPUTE_WINDOW = 3
COMM_WINDOW = 4
SLOW_WINDOW = 5
FSDP_WINDOW, OWN_WINDOW = 6, 7
FSDP_LATE_RANK, OWN_LATE_RANK = 2, 3
DELAY_S = 0.1
SLOW_S = 0.08


class HookState:
    """The program's own hook state: its calls, and the injected faults."""

    def __init__(self, injector: FaultInjector) -> None:
        self.injector = injector
        self.calls = 0


def user_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.calls += 1
    future = state.injector.comm_hook(None, bucket)  # the demo's comm fault, then all-reduce
    if state.injector.step // WINDOW == SLOW_WINDOW and bucket.index() == 0:

        def slowly(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            time.sleep(SLOW_S)
            return fut.value()

        return future.then(slowly)
    return future


def layers() -> torch.nn.Sequential:
    return torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
        torch.nn.ReLU(), torch.nn.Linear(256, 1),
    )  # fmt: skip


def sharded() -> torch.nn.Module:
    """The FSDP2 model: each linear layer sharded on its own, then the whole."""
    net = layers()
    for layer in net[::2]:
        fully_shard(layer)
    return fully_shard(net)


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    net = layers()
    steps = f"from={COMM_WINDOW * WINDOW},to={SLOW_WINDOW * WINDOW}"
    comm = parse_fault(f"comm@{LATE_RANK}:{DELAY_S * 1e3:g}ms,{steps}")
    injector = FaultInjector((comm,), rank)

    def late_gradient(grad: torch.Tensor) -> torch.Tensor:
        if rank == LATE_RANK and injector.step // WINDOW == COMPUTE_WINDOW:
            time.sleep(DELAY_S)
        return grad

    net[0].weight.register_hook(late_gradient)
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    collect = CollectConfig(out_dir=out_dir, timeout_s=30.0)
    # --8<-- [start:watch-ddp]
    timer = StageTimer(config=TimerConfig(window=WINDOW, collection=collect))
    watched = timer.watch_ddp(model)
    early = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    early.register_comm_hook(None, allreduce_hook)
    early_watched = timer.watch_ddp(early)
    state = HookState(injector)
    model.register_comm_hook(state, user_hook)
    # --8<-- [end:watch-ddp]
    # --8<-- [start:watch-sharded]
    optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=0.01)
    zero_watched = timer.watch_zero(optimizer)
    fsdp = sharded()
    fsdp_watched = timer.watch_fsdp(fsdp)
    # --8<-- [end:watch-sharded]
    not_sharded = timer.watch_fsdp(early)  # no fully_shard module in it: said, not timed
    fsdp_optimizer = torch.optim.SGD(fsdp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    for step in range(STEPS):
        injector.step = step
        window = step // WINDOW
        on_fsdp = window >= FSDP_WINDOW
        run, opt = (fsdp, fsdp_optimizer) if on_fsdp else (model, optimizer)
        with timer.step():
            with timer.stage("data.next_wait"):
                x = torch.randn(16, 128, generator=generator)
            # --8<-- [start:own-collective]
            with timer.stage("model.fwd_loss_cpu_wall"):
                if window == FSDP_WINDOW and rank == FSDP_LATE_RANK:
                    time.sleep(DELAY_S)
                loss = run(x).square().mean()
                if window == OWN_WINDOW and rank == OWN_LATE_RANK:
                    time.sleep(DELAY_S)
                mean_loss = loss.detach().clone()
                with timer.collective("loss_all_reduce", nbytes=mean_loss.element_size()):
                    dist.all_reduce(mean_loss)
            # --8<-- [end:own-collective]
            with timer.stage("model.backward_cpu_wall"):
                loss.backward()
            with timer.stage("optim.step_cpu_wall"):
                opt.step()
                opt.zero_grad()
    timer.close()
    total = float(sum(p.detach().sum() for p in model.parameters()))
    facts: dict[str, Any] = {
        "watched": watched,
        "early_watched": early_watched,
        "zero_watched": zero_watched,
        "fsdp_watched": fsdp_watched,
        "not_sharded_watched": not_sharded,
        "hook_calls": state.calls,
        "param_sum": total,
    }
    Path(out_dir, f"hook-{rank}.json").write_text(json.dumps(facts))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
