"""A pipeline-parallel demo job: 2 pipeline stages x 2 data-parallel replicas on CPU Gloo.

A small character transformer is split in two (embedding and the first block on pipeline stage
0, the second block and the output head on stage 1) and trained with
``torch.distributed.pipelining`` (``PipelineStage`` and ``ScheduleGPipe``) over a ``("pp", "dp")``
device mesh; each stage's gradients are all-reduced over its data-parallel replicas. Every rank
times the stages the docs suggest for a pipeline schedule, with its role read from the mesh:

    data.next_wait   the next batch (stage 0 its inputs, stage 1 its targets)
    pp.schedule      schedule.step(): every microbatch's forward and backward with the
                     pipeline's sends and receives (a rank's wait for the other stage is here)
    dp.grad_sync     the all-reduce of this stage's gradients over its replicas
    optim.step_cpu_wall  the optimizer

Faults use the demo grammar (``KIND@RANK:DELAYms``, ranks numbered globally: rank
``pp * 2 + dp``): ``data`` sleeps in the data stage, ``forward`` in the stage module's first
forward of the step (inside the schedule). The stage module's forward also runs inside the probe
``pp.forward_compute`` (reported per rank and window, outside the frontier), which measures the
rank's own compute inside the schedule apart from its waits.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..analysis.schema import DATA_STAGE, OPTIMIZER_STAGE, RESIDUAL_STAGE
from ..collect.config import CollectConfig
from ..errors import DemoError
from ..record.config import TimerConfig
from ..record.recorder import StageTimer
from ..sinks.output_folder import clear_run_files
from .faults import Fault, FaultInjector
from .launch import read_windows, run_ranks
from .train import leave_process_group, show_rank_lines

PIPELINE_STAGES = (DATA_STAGE, "pp.schedule", "dp.grad_sync", OPTIMIZER_STAGE, RESIDUAL_STAGE)
PP, DP = 2, 2
COMPUTE_PROBE = "pp.forward_compute"


@dataclass(frozen=True)
class PipelineConfig:
    """One pipeline run; passed unchanged to every rank."""

    steps: int = 40
    window: int = 20
    faults: tuple[Fault, ...] = ()
    out_dir: str = "stagefrontier-pipeline"
    microbatches: int = 2
    batch_size: int = 8
    seq_len: int = 32
    d_model: int = 32
    seed: int = 0
    quiet: bool = False
    collective_timeout_s: float = 120.0
    collect: str = "auto"
    """The timer's collect mode; ``hierarchical`` lays the ranks out in nodes of ``per_node``
    consecutive ranks, as torchrun would (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``)."""
    per_node: int = PP * DP


def run_pipeline(config: PipelineConfig, deadline_s: float = 300.0) -> list[dict[str, Any]]:
    """Run the job on ``PP * DP`` spawned ranks; returns the windows rank 0 wrote."""
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clear_run_files(out)  # a new run, not a continuation of the last one
    codes = run_ranks(_rank, PP * DP, config, deadline_s=deadline_s)
    failed = {rank: code for rank, code in codes.items() if code != 0}
    if failed:
        raise DemoError(f"pipeline rank(s) failed with exit codes {failed}")
    return read_windows(out)


def _rank(rank: int, config: PipelineConfig, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if config.collect == "hierarchical":
        os.environ.update(
            LOCAL_RANK=str(rank % config.per_node),
            LOCAL_WORLD_SIZE=str(config.per_node),
            GROUP_RANK=str(rank // config.per_node),
        )
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    show_rank_lines(rank, config.quiet)
    store = dist.TCPStore(
        "127.0.0.1", port, PP * DP, is_master=False, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=PP * DP,
        timeout=timedelta(seconds=config.collective_timeout_s),
    )
    # --8<-- [start:mesh-timer]
    mesh = init_device_mesh("cpu", (PP, DP), mesh_dim_names=("pp", "dp"))
    pp, dp = (int(c) for c in mesh.get_coordinate() or (0, 0))
    timer = StageTimer(
        config=TimerConfig(
            stages=PIPELINE_STAGES,
            window=config.window,
            collection=CollectConfig(
                mode=config.collect, out_dir=config.out_dir, log=not config.quiet
            ),
            mesh=mesh,
        )
    )
    # --8<-- [end:mesh-timer]
    faults = FaultInjector(config.faults, rank)
    _train(config, mesh, pp, dp, timer, faults)
    timer.close()
    leave_process_group()


def _train(
    config: PipelineConfig, mesh: Any, pp: int, dp: int, timer: StageTimer, faults: FaultInjector
) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from .model import CharData, load_corpus

    torch.manual_seed(config.seed)  # the same initial weights on every replica of a stage
    data = CharData(load_corpus(), config.seq_len, config.batch_size, seed=config.seed * 997 + dp)
    module = _stage_module(pp, data.vocab_size, config, faults, timer.probe(COMPUTE_PROBE))
    stage = PipelineStage(module, pp, PP, torch.device("cpu"), group=mesh.get_group("pp"))

    def loss_fn(logits: Any, targets: Any) -> Any:
        return F.cross_entropy(logits.reshape(-1, data.vocab_size), targets.reshape(-1))

    schedule = ScheduleGPipe(stage, config.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=3e-3)
    dp_group = mesh.get_group("dp")
    losses: list[float] = []
    for step in range(config.steps):
        faults.step = step
        module.stall_pending = True
        # --8<-- [start:pipeline-step]
        with timer.step():
            with timer.stage(DATA_STAGE):
                inputs, targets = next(data)
                faults.delay("data")
            with timer.stage("pp.schedule"):
                if pp == 0:
                    schedule.step(inputs)
                else:
                    step_losses: list[Any] = []
                    schedule.step(target=targets, losses=step_losses)
                    losses.append(float(sum(x.item() for x in step_losses)))
            with timer.stage("dp.grad_sync"):
                for p in module.parameters():
                    if p.grad is not None:
                        dist.all_reduce(p.grad, group=dp_group)
                        p.grad /= DP
            with timer.stage(OPTIMIZER_STAGE):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        # --8<-- [end:pipeline-step]
    if pp == PP - 1:
        Path(config.out_dir, f"losses-dp{dp}.json").write_text(json.dumps(losses))


def _stage_module(
    pp: int, vocab: int, config: PipelineConfig, faults: FaultInjector, probe: Any
) -> Any:
    """One half of the transformer, its forward inside ``probe``; a ``forward`` fault sleeps in
    its first forward per step."""
    import torch
    from torch import nn

    d = config.d_model

    class Half(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.stall_pending = False
            self.embed = nn.Embedding(vocab, d) if pp == 0 else None
            self.block = nn.TransformerEncoderLayer(
                d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True
            )
            self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, vocab)) if pp else None
            mask = nn.Transformer.generate_square_subsequent_mask(config.seq_len)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with probe:
                if self.stall_pending:
                    self.stall_pending = False
                    faults.delay("forward")
                if self.embed is not None:
                    x = self.embed(x)
                x = self.block(x, src_mask=self.mask, is_causal=True)
                return x if self.head is None else self.head(x)

    return Half()
