"""The demo workload: one rank of a Gloo DDP job training TinyDecoder, timed by StageTimer.

Readable top to bottom like a real training loop; the only additions are the timer contexts of
the paper's minimal integration and the injected faults.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..collect import StoreCollector
from ..recorder import StageTimer
from ..schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    DEFAULT_STAGES,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
)
from .faults import Fault


@dataclass(frozen=True)
class DemoConfig:
    """Everything one demo (or harness) run needs; passed unchanged to every rank."""

    ranks: int = 4
    steps: int = 120
    window: int = 20
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    out_dir: str = "stagefrontier-demo"
    batch_size: int = 8
    seq_len: int = 64
    d_model: int = 64
    n_layers: int = 2
    lr: float = 3e-3
    collect_timeout_s: float = 10.0
    timed: bool = True
    """False runs the same job with the timer disabled on every rank (the logger-off arm)."""
    untimed_ranks: tuple[int, ...] = ()
    """Ranks whose timer is disabled, so they never send a window."""
    late_send_s: dict[int, float] = field(default_factory=dict)
    """Per rank, a delay added before each window is sent (a late rank)."""
    extra_stage_ranks: tuple[int, ...] = ()
    """Ranks whose schema has one more stage (a mismatched rank)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the ranks (e.g. torchelastic restart variables)."""
    quiet: bool = False


STEP_MARKER = "step-{step}.marker"
"""Rank 0 touches this file in out_dir/.markers after each step, so a launcher can act mid-run."""


class _Injector:
    """Sleeps where a fault says, on the rank and steps it names."""

    def __init__(self, faults: tuple[Fault, ...], rank: int) -> None:
        self.faults = faults
        self.rank = rank
        self.step = 0

    def delay(self, kind: str) -> None:
        for fault in self.faults:
            if fault.kind == kind and fault.active(self.rank, self.step):
                time.sleep(fault.delay_s)

    def barrier_now(self) -> bool:
        """callback_sync faults put a barrier on every rank at the faulty rank's steps."""
        return any(f.kind == "callback_sync" and f.active(f.rank, self.step) for f in self.faults)

    def comm_hook(self, process_group: Any, bucket: Any) -> Any:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        if bucket.index() == 0:
            self.delay("comm")
        return allreduce_hook(process_group, bucket)


def run_rank(rank: int, config: DemoConfig, port: int) -> None:
    """Entry point of one spawned rank."""
    os.environ.update(config.env)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .model import CharData, TinyDecoder, load_corpus

    torch.set_num_threads(1)
    if rank == 0 and not config.quiet:
        logging.basicConfig(stream=sys.stdout, format="  %(message)s")
        logging.getLogger("stagefrontier").setLevel(logging.INFO)
    store = dist.TCPStore(
        "127.0.0.1", port, config.ranks, is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=config.ranks)

    torch.manual_seed(config.seed)
    data = CharData(load_corpus(), config.seq_len, config.batch_size, seed=config.seed * 997 + rank)
    model = DDP(TinyDecoder(data.vocab_size, config.seq_len, config.d_model, config.n_layers))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    faults = _Injector(config.faults, rank)
    if any(f.kind == "comm" for f in config.faults):
        model.register_comm_hook(None, faults.comm_hook)
    timer = _make_timer(rank, config)

    markers = Path(config.out_dir) / ".markers"
    losses = []
    for step in range(config.steps):
        faults.step = step
        with timer.step():
            with timer.stage(DATA_STAGE):
                inputs, targets = next(data)
                faults.delay("data")
            with timer.stage(FORWARD_STAGE):
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, data.vocab_size), targets.reshape(-1))
                faults.delay("forward")
            with timer.stage(BACKWARD_STAGE):
                faults.delay("backward")
                loss.backward()
            with timer.stage(CALLBACKS_STAGE):
                losses.append(loss.item())
                faults.delay("callback_sync")
                faults.delay("callback_host")
                if faults.barrier_now():
                    dist.barrier()
            with timer.stage(OPTIMIZER_STAGE):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            markers.mkdir(parents=True, exist_ok=True)
            (markers / STEP_MARKER.format(step=step)).touch()
    timer.close()
    Path(config.out_dir, f"losses-rank{rank}.json").write_text(json.dumps(losses))
    dist.barrier()
    dist.destroy_process_group()


def _make_timer(rank: int, config: DemoConfig) -> StageTimer:
    enabled = config.timed and rank not in config.untimed_ranks
    stages = list(DEFAULT_STAGES)
    if rank in config.extra_stage_ranks:
        stages.insert(-1, "extra.cpu_wall")
    collector = None
    if enabled and rank in config.late_send_s:
        import torch.distributed as dist

        collector = StoreCollector(
            rank=rank,
            world_size=dist.get_world_size(),
            out_dir=config.out_dir,
            timeout_s=config.collect_timeout_s,
            send_delay_s=config.late_send_s[rank],
        )
    return StageTimer(
        stages,
        window=config.window,
        out_dir=config.out_dir,
        collect_timeout_s=config.collect_timeout_s,
        enabled=enabled,
        collector=collector,
    )
