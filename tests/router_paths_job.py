"""One torchrun job for the router's path tests: a tiny Gloo DDP model trained through one of the
ways StageFrontier times data, with the profiler router on.

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/router_paths_job.py \
        --path iter --out OUT --data-rank 2 --data-steps 16:48 --forward-rank 1 \
        --forward-steps 64:96 --steps 128

``--path``: ``stage`` (``with timer.stage(...)``), ``iter`` (``timer.iter`` over a DataLoader with
``num_workers=0``), ``fetch`` (``timer.fetch``), ``accum`` (4 microsteps per step, each batch
fetched with ``timer.fetch`` inside the microstep loop, the next one prefetched as GPT training
scripts do), ``lightning`` and ``hf`` (the two callbacks). The stalls sleep 120 ms per batch in
``slow_sample`` (data, on ``--data-rank`` during ``--data-steps``) or 120 ms per step in
``slow_forward`` (forward, on ``--forward-rank``); both are this file's own functions.
``--workers N`` gives the DataLoader of ``iter``, ``lightning`` and ``hf`` N worker processes
(a worker reads the steps of the stall as they were when the loader forked it: give the data
stall from step 0); ``--sample-ms`` sets the data stall per sample (30 ms: 120 ms a batch).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from rank_support import leave_gloo
from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
from stagefrontier.analysis.schema import (
    BACKWARD_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
)

STALL_S = 0.12
BATCH = 4
FEATURES = 16
ACCUMULATION = 4
RANK = int(os.environ.get("RANK", "0"))


class Faults:
    """Which step the loop is in, and whether a stall is on for this rank now."""

    step = 0
    micro = 0
    data: tuple[int, int, int] = (-1, 0, 0)  # rank, first step, end step
    forward: tuple[int, int, int] = (-1, 0, 0)
    forward_micro = 0  # with microsteps, the forward stalls in this one only
    sample_s = STALL_S / BATCH  # the data stall per sample

    @classmethod
    def on(cls, kind: str) -> bool:
        rank, lo, hi = cls.data if kind == "data" else cls.forward
        if kind == "forward" and cls.micro != cls.forward_micro:
            return False
        return rank == RANK and lo <= cls.step < hi


def slow_sample(seconds: float) -> None:
    time.sleep(seconds)


def slow_forward() -> None:
    time.sleep(STALL_S)


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(RANK)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if Faults.on("data"):
            slow_sample(Faults.sample_s)
        return self.x[i], self.y[i]


class HFSamples(Samples):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x, y = super().__getitem__(i)
        return {"x": x, "labels": y}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(FEATURES, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        if Faults.on("forward"):
            slow_forward()
        out = self.layer(x)
        if labels is None:
            return out
        return {"loss": nn.functional.mse_loss(out, labels)}


def get_batch(data: Samples, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch by hand (what ``timer.fetch`` wraps): BATCH samples from the dataset."""
    rows = [data[(step * BATCH + k) % len(data)] for k in range(BATCH)]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def router() -> ProfilerRouter:
    """The router of every path; after an incident its cooldown covers four windows: a stall of
    four windows opens one incident, and a stall's last batch fetched ahead (a framework's
    loader) falls in a window that opens nothing."""
    return ProfilerRouter(steps=5, cooldown_windows=4, capture_timeout_s=20.0)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, timer: StageTimer, batch: Any) -> None:
    x, y = batch
    with timer.stage(FORWARD_STAGE):
        loss = nn.functional.mse_loss(model(x), y)
    with timer.stage(BACKWARD_STAGE):
        loss.backward()
    with timer.stage(OPTIMIZER_STAGE):
        opt.step()
        opt.zero_grad()


def plain_loop(path: str, steps: int, out: str, window: int, workers: int) -> None:
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = Samples(steps * BATCH * ACCUMULATION)
    collection = CollectConfig(out_dir=out)
    timer = StageTimer(config=TimerConfig(window=window, collection=collection, router=router()))
    if path == "iter":
        loader = DataLoader(data, batch_size=BATCH, num_workers=workers)
        for step, batch in enumerate(timer.iter(loader)):
            if step == steps:
                break
            with timer.step():
                train_step(model, opt, timer, batch)
            Faults.step = step + 1
    elif path == "stage":
        for step in range(steps):
            with timer.step():
                with timer.stage(DATA_STAGE):
                    batch = get_batch(data, step)
                train_step(model, opt, timer, batch)
            Faults.step = step + 1
    elif path == "fetch":
        for step in range(steps):
            batch = timer.fetch(get_batch, data, step)
            with timer.step():
                train_step(model, opt, timer, batch)
            Faults.step = step + 1
    else:  # accum: nanoGPT's loop
        Faults.forward_micro = 1
        batch = timer.fetch(get_batch, data, 0)
        for step in range(steps):
            with timer.step():
                for micro in range(ACCUMULATION):
                    with timer.microstep(micro):
                        Faults.micro = micro
                        model.require_backward_grad_sync = micro == ACCUMULATION - 1
                        x, y = batch
                        with timer.stage(FORWARD_STAGE):
                            loss = nn.functional.mse_loss(model(x), y) / ACCUMULATION
                        if micro == ACCUMULATION - 1:
                            Faults.step = step + 1  # the prefetched batch is the next step's
                        batch = timer.fetch(get_batch, data, step * ACCUMULATION + micro + 1)
                        with timer.stage(BACKWARD_STAGE):
                            loss.backward()
                with timer.stage(OPTIMIZER_STAGE):
                    opt.step()
                    opt.zero_grad()
    leave_gloo(timer)


def leave_framework_group() -> None:
    """Destroy the process group the framework left open, as a tidy script does. Left open, a
    rank could abort at exit (SIGABRT, "terminate called without an active exception"): a
    Gloo worker thread freeing the tensors of the framework's last all_gather (the HF
    Trainer's FLOP count) after the interpreter began to shut down, where it cannot take the
    GIL (a native backtrace showed it, load 50; a PyTorch race, not the timer's)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def lightning_loop(steps: int, out: str, window: int, workers: int) -> None:
    import lightning.pytorch as pl

    from stagefrontier.integrations.lightning import StageFrontierCallback

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            Faults.step = self.trainer.global_step

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = DataLoader(Samples(steps * BATCH * 2), batch_size=BATCH, num_workers=workers)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        callbacks=[StageFrontierCallback(window=window, out_dir=out, router=router())],
    )
    trainer.fit(Module(), loader)
    leave_framework_group()


def hf_loop(steps: int, out: str, window: int, workers: int, scratch: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stagefrontier.integrations.transformers import StageFrontierCallback

    class Step(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            Faults.step = state.global_step

    args = TrainingArguments(
        output_dir=scratch,
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-2,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        logging_steps=10_000,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=workers,
    )
    trainer = Trainer(
        model=Net(),
        args=args,
        train_dataset=HFSamples(steps * BATCH * 2 * int(os.environ["WORLD_SIZE"])),
        callbacks=[Step(), StageFrontierCallback(window=window, out_dir=out, router=router())],
    )
    trainer.train()
    leave_framework_group()


def span(text: str) -> tuple[int, int]:
    lo, hi = text.split(":")
    return int(lo), int(hi)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--path", required=True, choices=("stage", "iter", "fetch", "accum", "lightning", "hf")
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--data-rank", type=int, default=-1)
    parser.add_argument("--data-steps", type=span, default=(0, 0))
    parser.add_argument("--forward-rank", type=int, default=-1)
    parser.add_argument("--forward-steps", type=span, default=(0, 0))
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--sample-ms", type=float, default=STALL_S / BATCH * 1e3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.basicConfig(format="%(message)s")
    logging.getLogger("stagefrontier").setLevel(logging.INFO if RANK == 0 else logging.WARNING)
    Faults.data = (args.data_rank, *args.data_steps)
    Faults.forward = (args.forward_rank, *args.forward_steps)
    Faults.sample_s = args.sample_ms / 1e3
    if args.path == "lightning":
        lightning_loop(args.steps, args.out, args.window, args.workers)
    elif args.path == "hf":
        scratch = os.path.join(args.out, "hf-scratch")
        hf_loop(args.steps, args.out, args.window, args.workers, scratch)
    else:
        plain_loop(args.path, args.steps, args.out, args.window, args.workers)


if __name__ == "__main__":
    main()
