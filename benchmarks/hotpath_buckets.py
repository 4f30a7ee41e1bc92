"""The timing of the collectives a step issues: its cost per collective (for hotpath.py).

For each kind of timed collective, two variants of one real training loop on a one-rank Gloo
group (16 ``Linear(64, 64)`` layers, batch 1, SGD or AdamW) run interleaved, round after round,
both inside the timer's step and stage contexts, the second with the collectives timed:

* DDP's gradient buckets (a bucket per layer): DDP's default all-reduce as a Python
  communication hook (``allreduce_hook``), against the same hook inside ``timer.watch_ddp``'s
  timed one;
* FSDP2's all-gathers and reduce-scatters (``fully_shard`` on every layer): FSDP2 runs none on
  a one-rank group, so the loop calls each layer's (its default collectives, or the timed ones
  ``timer.watch_fsdp`` set) in the forward and backward stages itself;
* ZeRO-1's parameter broadcasts (a ``ZeroRedundancyOptimizer`` over DDP, one per step; only
  its ``step``, with no gradients, so that its broadcast is most of the loop): against
  ``timer.watch_zero``'s two post-step hooks;
* the program's own collectives (16 ``all_reduce`` calls of one number per step in the forward
  stage): bare, against each inside ``with timer.collective(name):``.

A collective's cost is the timed loop less the plain one in the same round, over the
collectives the loop issued; the median and quartiles over rounds are reported. The timers hand
their windows to a collector that drops them (the window's drain runs in the hand-off, measured
apart).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hotpath_hooks import _Drop  # the collector that drops every window

_clock = time.thread_time_ns
LAYERS = 16
METHOD = (
    "Method: for each kind of collective, {rounds} interleaved rounds (order reversed every "
    "other round) of two loops of {steps} training steps each ({layers} `Linear(64, 64)` "
    "layers, batch 1, a one-rank Gloo group; one torch thread, the garbage collector off), "
    "timed with `time.thread_time_ns`, both inside the timer's step and stage contexts, the "
    "second with the collectives timed: DDP's default all-reduce as a Python communication "
    "hook (`allreduce_hook`, `bucket_cap_mb=0.01`: a bucket per layer) against the same hook "
    "inside `timer.watch_ddp`'s timed one; FSDP2 (`fully_shard` on every layer, which runs no "
    "collective on a one-rank group: the loop calls each layer's all-gather in the forward "
    "stage and its reduce-scatter in the backward stage itself) with its default collectives "
    "against the timed ones `timer.watch_fsdp` sets; ZeRO-1 (`ZeroRedundancyOptimizer` over "
    "DDP, SGD; only its step, with no gradients, so that its broadcast is most of the loop) "
    "against `timer.watch_zero`; {layers} `dist.all_reduce` calls of one number per step in the "
    "forward stage, bare against each inside `timer.collective(name)`. The cost per collective "
    "is the timed loop less the plain one of the same round over the collectives issued "
    "(median and quartiles over rounds). On a one-rank group a collective is a copy: what is "
    "measured is the timing's own work on the thread that issues it (a chained callback "
    "included), not the network."
)

Loop = Callable[[], int]


@dataclass(frozen=True)
class Variant:
    timer: Any
    loop: Loop
    calls: list[int]  # collectives issued so far


@dataclass(frozen=True)
class Kind:
    title: str
    build: Callable[[bool, int], Variant]


def _layers() -> Any:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    return torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(LAYERS)))


def _timer() -> Any:
    from stagefrontier import StageTimer, TimerConfig

    return StageTimer(config=TimerConfig(window=1_000_000), collector=_Drop())


def _training_loop(
    timer: Any, model: Any, optimizer: Any, steps: int, forward: Callable[[], Any]
) -> Loop:
    def loop() -> int:
        start = _clock()
        for _ in range(steps):
            with timer.step():
                with timer.stage("model.fwd_loss_cpu_wall"):
                    loss = forward()
                with timer.stage("model.backward_cpu_wall"):
                    loss.backward()
                with timer.stage("optim.step_cpu_wall"):
                    optimizer.step()
                    optimizer.zero_grad()
        return _clock() - start

    loop()  # DDP rebuilds its buckets after the first step, FSDP2 sets up lazily: warm up
    return loop


def _ddp(timed: bool, steps: int) -> Variant:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = torch.nn.parallel.DistributedDataParallel(_layers(), bucket_cap_mb=0.01)
    timer, calls = _timer(), [0]

    def counted(state: Any, bucket: Any) -> Any:
        calls[0] += 1
        return allreduce_hook(state, bucket)

    counted.__annotations__.clear()
    if timed:
        timer.watch_ddp(model)
    model.register_comm_hook(None, counted)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(1, 64)
    return Variant(
        timer, _training_loop(timer, model, optimizer, steps, lambda: model(x).sum()), calls
    )


def _fsdp(timed: bool, steps: int) -> Variant:
    """FSDP2 skips its collectives on a one-rank group, so the loop calls them itself: each
    layer's all-gather in the forward stage and its reduce-scatter in the backward stage, the
    collectives FSDP2 would call (taken from its layers after ``watch_fsdp`` or without it)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, timer, calls = _layers(), _timer(), [0]
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    if timed:
        timer.watch_fsdp(model)
    groups = [group for layer in model for group in layer._get_fsdp_state()._fsdp_param_groups]
    group = dist.group.WORLD
    shard = torch.zeros(64 * 64 + 64)
    gathered = torch.empty_like(shard)
    sum_op = dist.ReduceOp.SUM

    def loop() -> int:
        start = _clock()
        for _ in range(steps):
            with timer.step():
                with timer.stage("model.fwd_loss_cpu_wall"):
                    for g in groups:
                        g._all_gather_comm(gathered, shard, group, False)
                with timer.stage("model.backward_cpu_wall"):
                    for g in groups:
                        g._reduce_scatter_comm(shard, gathered, group, sum_op, False)
            calls[0] += 2 * len(groups)
        return _clock() - start

    loop()
    return Variant(timer, loop, calls)


def _zero(timed: bool, steps: int) -> Variant:
    """Only the optimizer's step, with no gradients (the local optimizer skips every parameter),
    so that what remains is ZeRO-1's broadcast of the parameters and its timing."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model = torch.nn.parallel.DistributedDataParallel(_layers())
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0)
    timer, calls = _timer(), [0]
    if timed:
        timer.watch_zero(optimizer)

    def loop() -> int:
        start = _clock()
        for _ in range(steps):
            with timer.step(), timer.stage("optim.step_cpu_wall"):
                optimizer.step()
        calls[0] += steps
        return _clock() - start

    loop()
    return Variant(timer, loop, calls)


def _own(timed: bool, steps: int) -> Variant:
    import torch
    import torch.distributed as dist

    model, timer, calls = _layers(), _timer(), [0]
    number = torch.zeros(1)

    def forward() -> Any:
        for _ in range(LAYERS):
            if timed:
                with timer.collective("loss_all_reduce"):
                    dist.all_reduce(number)
            else:
                dist.all_reduce(number)
        calls[0] += LAYERS
        return model(number.expand(1, 64)).sum()

    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    return Variant(timer, _training_loop(timer, model, optimizer, steps, forward), calls)


KINDS = (
    Kind("DDP gradient bucket (`watch_ddp`) less the plain hook", _ddp),
    Kind("FSDP2 all-gather or reduce-scatter (`watch_fsdp`) less the default", _fsdp),
    Kind("ZeRO-1 broadcasts of a step (`watch_zero`) less none", _zero),
    Kind("own collective (`timer.collective`) less the bare call", _own),
)


def report(rounds: int, steps: int) -> list[str]:
    """The table of the cost per collective of each kind, from ``rounds`` interleaved rounds."""
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rows = [(kind.title, *_measure(kind, rounds, steps)) for kind in KINDS]
    finally:
        if owned:
            dist.destroy_process_group()
    return _table(rows)


def _measure(kind: Kind, rounds: int, steps: int) -> tuple[list[float], int]:
    """The cost per collective in each round, and the collectives a step issues."""
    plain, timed = kind.build(False, steps), kind.build(True, steps)
    per_call: list[float] = []
    issued = 0
    enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(rounds):
            before = timed.calls[0]
            order = (plain, timed) if i % 2 == 0 else (timed, plain)
            spent = {id(v): v.loop() for v in order}
            issued = timed.calls[0] - before
            per_call.append((spent[id(timed)] - spent[id(plain)]) / issued)
    finally:
        if enabled:
            gc.enable()
    plain.timer.close()
    timed.timer.close()
    return per_call, issued // steps


def _table(rows: Sequence[tuple[str, Sequence[float], int]]) -> list[str]:
    lines = [
        "| timed collective | ns per collective | quartiles | per step | cost per step |",
        "|---|---:|---:|---:|---:|",
    ]
    for title, per_call, per_step in rows:
        q1, q2, q3 = statistics.quantiles(per_call, n=4)
        lines.append(
            f"| {title} | {q2:.0f} | {q1:.0f} - {q3:.0f} | {per_step} | "
            f"~{q2 * per_step / 1e3:.1f} us |"
        )
    return lines
