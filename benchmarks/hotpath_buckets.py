"""The timing of DDP's gradient buckets (``timer.watch_ddp``): its cost per bucket (for hotpath.py).

Two variants of one real DDP training loop (16 ``Linear(64, 64)`` layers, batch 1, SGD, a
one-rank Gloo group, a gradient bucket per layer) run interleaved, round after round, both
inside the timer's step and stage contexts:

* plain hook: DDP with its default all-reduce registered as a Python communication hook
  (``allreduce_hook``, what the timed hook runs inside);
* timed: the same hook inside ``timer.watch_ddp``'s timed one (each bucket logged with its step,
  stage, arrival, size and, from a callback chained to its future, its wait).

A bucket's cost is the timed loop less the plain one in the same round, over the buckets the
loop reduced; the median and quartiles over rounds are reported. The timers hand their windows
to a collector that drops them (the window's drain runs in the hand-off, measured apart).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from typing import Any

from hotpath_hooks import _Drop  # the collector that drops every window

_clock = time.thread_time_ns
METHOD = (
    "Method: {rounds} interleaved rounds (order reversed every other round) of two loops of "
    "{steps} DDP training steps each (16 `Linear(64, 64)` layers, batch 1, SGD, a one-rank "
    "Gloo group, `bucket_cap_mb=0.01`: a bucket per layer; one torch thread, the garbage "
    "collector off), timed with "
    "`time.thread_time_ns`, both inside the timer's step and stage contexts: DDP's default "
    "all-reduce as a Python communication hook (`allreduce_hook`), and the same hook inside "
    "`timer.watch_ddp`'s timed one. The cost per bucket is the timed loop less the plain one of "
    "the same round over the buckets reduced (median and quartiles over rounds). On a one-rank "
    "group the collective itself is a copy: what is measured is the timing's own work on the "
    "thread that calls the hook (the chained callback included), not the network."
)


def _variant(timed: bool, steps: int) -> tuple[Any, Any, list[int]]:
    """A timer, a loop of ``steps`` steps to time, and the count of buckets it reduces."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from stagefrontier import StageTimer, TimerConfig

    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(16)))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.01)
    timer = StageTimer(config=TimerConfig(window=1_000_000), collector=_Drop())
    calls = [0]

    def counted(state: Any, bucket: Any) -> Any:
        calls[0] += 1
        return allreduce_hook(state, bucket)

    counted.__annotations__.clear()
    if timed:
        timer.watch_ddp(model)
    model.register_comm_hook(None, counted)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(1, 64)

    def loop() -> int:
        start = _clock()
        for _ in range(steps):
            with timer.step():
                with timer.stage("model.fwd_loss_cpu_wall"):
                    loss = model(x).sum()
                with timer.stage("model.backward_cpu_wall"):
                    loss.backward()
                with timer.stage("optim.step_cpu_wall"):
                    optimizer.step()
                    optimizer.zero_grad()
        return _clock() - start

    loop()  # DDP rebuilds its buckets after the first step: warm up past it
    return timer, loop, calls


def report(rounds: int, steps: int) -> list[str]:
    """The table of the cost per bucket, from ``rounds`` interleaved rounds."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plain_timer, plain, _ = _variant(False, steps)
        timed_timer, timed, calls = _variant(True, steps)
        per_bucket: list[float] = []
        buckets = 0
        enabled = gc.isenabled()
        gc.disable()
        try:
            for i in range(rounds):
                before = calls[0]
                order = (plain, timed) if i % 2 == 0 else (timed, plain)
                spent = {id(f): f() for f in order}
                buckets = calls[0] - before
                per_bucket.append((spent[id(timed)] - spent[id(plain)]) / buckets)
        finally:
            if enabled:
                gc.enable()
        plain_timer.close()
        timed_timer.close()
    finally:
        if owned:
            dist.destroy_process_group()
    return _table(per_bucket, buckets // steps)


def _table(per_bucket: Sequence[float], buckets_per_step: int) -> list[str]:
    q1, q2, q3 = statistics.quantiles(per_bucket, n=4)
    return [
        "| variant | ns per bucket | quartiles |",
        "|---|---:|---:|",
        f"| timed bucket (`watch_ddp`) less the plain hook | {q2:.0f} | {q1:.0f} - {q3:.0f} |",
        "",
        f"- buckets per step: {buckets_per_step}; cost per step: ~{q2 * buckets_per_step / 1e3:.1f}"
        " us.",
    ]
