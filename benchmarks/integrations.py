"""Per-step overhead of the Lightning and Hugging Face callbacks, paired against the same run
without them, and the cost of the hook work alone.

    python benchmarks/integrations.py                 # writes benchmarks/results/integrations.md
    python benchmarks/integrations.py --groups 3 --steps 120 --no-write   # a quick look

End to end: every run trains the same tiny model on CPU in this process (one rank) with a
measuring callback that records ``perf_counter_ns`` at the end of every step; a run's step time is
the median interval between consecutive steps after ``--warmup`` steps. Runs come in groups of
three, in rotating order: no extra callback, callbacks that do nothing (what the framework's
dispatch of a callback costs by itself), and the StageFrontier callback (default window of 100
steps, local collection writing ``windows.jsonl`` and the log line). The overhead of a group is
the ratio of the StageFrontier run's step time to the no-callback run's; the table gives the
median ratio over groups with its range, and the median difference in microseconds per step.

Hook work alone: the callback's hooks are called in a tight loop in the order the framework calls
them (one optimizer step per iteration), with a real timer and analysis, and timed per step.
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness_common import (
    load_1min,
    load_text,
    quiet_check,
    result_header,
    script_parser,
    write_result,
)

VARIANTS = ("none", "empty", "stagefrontier")
"""Per group of runs: no extra callback, callbacks that do nothing, StageFrontier's callback."""


@dataclass
class GroupStats:
    framework: str
    ms: dict[str, list[float]]
    """Step time (ms) per variant, one value per group, in group order."""

    def ratios(self, variant: str) -> list[float]:
        return [v / b for v, b in zip(self.ms[variant], self.ms["none"], strict=True)]

    def diffs_us(self, variant: str) -> list[float]:
        return [(v - b) * 1e3 for v, b in zip(self.ms[variant], self.ms["none"], strict=True)]


def _median_interval_ms(stamps: list[int], warmup: int) -> float:
    deltas = [(b - a) / 1e6 for a, b in zip(stamps[warmup:], stamps[warmup + 1 :], strict=False)]
    return statistics.median(deltas)


# ------------------------------------------------------------------------------------ Lightning
def lightning_run(steps: int, warmup: int, variant: str, out: Path) -> float:
    import lightning.pytorch as pl
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from stagefrontier.integrations.lightning import StageFrontierCallback

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(pl.Callback):
        def __init__(self) -> None:
            self.stamps: list[int] = []

        def on_train_batch_end(self, *args: Any) -> None:
            self.stamps.append(time.perf_counter_ns())

    torch.manual_seed(0)
    x = torch.randn(steps * 16, 32)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=16)
    clock = Clock()
    callbacks: list[Any] = [clock]
    if variant == "stagefrontier":
        callbacks.append(StageFrontierCallback(out_dir=out, collect="local"))
    elif variant == "empty":  # two callbacks that do nothing, like StageFrontier's head and tail
        callbacks += [type("Empty1", (pl.Callback,), {})(), type("Empty2", (pl.Callback,), {})()]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), loader)
    return _median_interval_ms(clock.stamps, warmup)


def lightning_hooks(steps: int, out: Path) -> float:
    """µs per step of the Lightning callback's hooks alone (real timer, local analysis)."""
    from stagefrontier.integrations.lightning import StageFrontierCallback

    cb = StageFrontierCallback(out_dir=out, collect="local", window=steps + 1)
    trainer = SimpleNamespace(callbacks=[cb], accumulate_grad_batches=1)
    cb.setup(trainer, None, "fit")
    tail = trainer.callbacks[-1]
    cb.on_train_start(trainer, None)
    t0 = time.perf_counter_ns()
    for i in range(steps):
        cb.on_train_batch_start(trainer, None, None, i)
        cb.on_before_backward(trainer, None, None)
        cb.on_after_backward(trainer, None)
        tail.on_before_optimizer_step(trainer, None, None)
        cb.on_train_batch_end(trainer, None, None, None, i)
        tail.on_train_batch_end(trainer, None, None, None, i)
    elapsed = time.perf_counter_ns() - t0
    cb.teardown(trainer, None, "fit")
    return elapsed / steps / 1e3


# --------------------------------------------------------------------------------- transformers
def transformers_run(steps: int, warmup: int, variant: str, out: Path) -> float:
    import torch
    from torch.utils.data import Dataset
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from stagefrontier.integrations.transformers import StageFrontierCallback

    class Tokens(Dataset[dict[str, Any]]):
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    class Clock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.stamps: list[int] = []

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            self.stamps.append(time.perf_counter_ns())

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    )
    clock = Clock()
    callbacks: list[Any] = [clock]
    if variant == "stagefrontier":
        callbacks.append(StageFrontierCallback(out_dir=out, collect="local"))
    elif variant == "empty":  # a callback that does nothing
        callbacks.append(TrainerCallback())
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            output_dir=scratch,
            max_steps=steps,
            per_device_train_batch_size=2,
            use_cpu=True,
            report_to=[],
            logging_steps=50,
            save_strategy="no",
            disable_tqdm=True,
        )
        Trainer(
            model=model, args=args, train_dataset=Tokens(steps * 2), callbacks=callbacks
        ).train()
    return _median_interval_ms(clock.stamps, warmup)


def transformers_hooks(steps: int, out: Path) -> float:
    """µs per step of the HF callback's hooks alone, forward hook included (real timer); the
    time of the bare module call is subtracted."""
    import torch

    from stagefrontier.integrations.transformers import StageFrontierCallback

    cb = StageFrontierCallback(out_dir=out, collect="local", window=steps + 1)
    model = torch.nn.Identity()
    args = SimpleNamespace(gradient_accumulation_steps=1)
    control = SimpleNamespace(should_log=False)
    x = torch.zeros(1)
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        model(x)  # the bare module call, subtracted below
    bare = time.perf_counter_ns() - t0
    cb.on_train_begin(args, None, control, model=model)
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        cb.on_step_begin(args, None, control)
        model(x)  # fires the forward hook
        cb.on_pre_optimizer_step(args, None, control)
        cb.on_optimizer_step(args, None, control)
        cb.on_step_end(args, None, control)
    elapsed = time.perf_counter_ns() - t0 - bare
    cb.on_train_end(args, None, control)
    return elapsed / steps / 1e3


def plain_timer(steps: int, out: Path) -> float:
    """µs per step of a StageTimer driven by ``with`` blocks over five stages: the reference."""
    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.analysis.schema import DEFAULT_STAGES

    names = DEFAULT_STAGES[:-1]
    collection = CollectConfig(mode="local", out_dir=out)
    timer = StageTimer(config=TimerConfig(window=steps + 1, collection=collection))
    t0 = time.perf_counter_ns()
    for _ in range(steps):
        with timer.step():
            for name in names:
                with timer.stage(name):
                    pass
    elapsed = time.perf_counter_ns() - t0
    timer.close()
    return elapsed / steps / 1e3


FRAMEWORKS: dict[str, tuple[Callable[..., float], Callable[..., float]]] = {
    "lightning": (lightning_run, lightning_hooks),
    "transformers": (transformers_run, transformers_hooks),
}


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "lightning", "transformers", "accelerate", "numpy", "stagefrontier"):
        try:
            out[name] = __import__(name).__version__
        except Exception:  # not installed
            out[name] = "not installed"
    return out


def main() -> None:
    parser = script_parser("integrations", __doc__)
    parser.add_argument("--groups", type=int, default=6, help="groups of three runs")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--hook-steps", type=int, default=20000)
    parser.add_argument("--frameworks", default="lightning,transformers")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("lightning", "lightning.pytorch", "transformers", "stagefrontier"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    load_start = load_text()
    started = time.perf_counter()
    stats: list[GroupStats] = []
    hooks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.frameworks.split(","):
            run, hook_cost = FRAMEWORKS[name]
            ms: dict[str, list[float]] = {v: [] for v in VARIANTS}
            run(60, 10, "stagefrontier", Path(tmp) / f"{name}-warm")  # imports, first-run costs
            for i in range(args.groups):
                k = i % len(VARIANTS)
                for variant in VARIANTS[k:] + VARIANTS[:k]:  # the order rotates between groups
                    out = Path(tmp) / f"{name}-{i}-{variant}"
                    ms[variant].append(run(args.steps, args.warmup, variant, out))
                print(
                    f"{name} group {i}: "
                    + ", ".join(f"{v} {ms[v][-1]:.3f}" for v in VARIANTS)
                    + " ms/step",
                    flush=True,
                )
            stats.append(GroupStats(name, ms))
            hooks[name] = statistics.median(
                hook_cost(args.hook_steps, Path(tmp) / f"{name}-hooks-{k}") for k in range(5)
            )
        reference = statistics.median(
            plain_timer(args.hook_steps, Path(tmp) / f"plain-{k}") for k in range(5)
        )
    wall = time.perf_counter() - started

    def ratio_cell(st: GroupStats, variant: str) -> str:
        r = st.ratios(variant)
        return f"{statistics.median(r):.3f} [{min(r):.3f}, {max(r):.3f}]"

    header = (
        "| framework | step, no callback (ms) | step, with StageFrontier (ms) | "
        "ratio StageFrontier/none, median [min, max] | overhead µs/step, median | "
        "ratio empty callback(s)/none | empty callback(s) µs/step | hook work alone µs/step |"
    )
    rows = [header, "|---|---:|---:|---|---:|---|---:|---:|"]
    for st in stats:
        rows.append(
            f"| {st.framework} | {statistics.median(st.ms['none']):.3f} | "
            f"{statistics.median(st.ms['stagefrontier']):.3f} | "
            f"{ratio_cell(st, 'stagefrontier')} | "
            f"{statistics.median(st.diffs_us('stagefrontier')):.1f} | "
            f"{ratio_cell(st, 'empty')} | {statistics.median(st.diffs_us('empty')):.1f} | "
            f"{hooks[st.framework]:.1f} |"
        )
    rows.append(
        f"| (reference: `StageTimer` with `with` blocks, 5 stages) | | | | | | | {reference:.1f} |"
    )
    table = "\n".join(rows)
    print(table)
    if args.no_write:
        return
    versions = _versions()
    quiet = "".join(line + "\n" for line in quiet_check([load_1min()]))
    command = "python benchmarks/integrations.py" + (
        " " + shlex.join(sys.argv[1:]) if sys.argv[1:] else ""
    )
    header = "\n".join(result_header("Integration callbacks: per-step overhead", command))
    text = f"""{header}
- Wall time {wall:.0f} s.
- Python {versions["python"]}, torch {versions["torch"]}, lightning {versions["lightning"]},
  transformers {versions["transformers"]}, accelerate {versions["accelerate"]},
  numpy {versions["numpy"]}, stagefrontier {versions["stagefrontier"]}
- CPU count: {os.cpu_count()}; platform: {platform.platform()}
- Load average (1/5/15 min) at start: {load_start}; at end: {load_text()}
{quiet}
Method: one process, one rank, CPU, `torch.set_num_threads(1)`. Lightning: a 32-128-1 MLP,
batch 16, `Trainer(devices=1)` with logger, checkpointing, progress bar and model summary off.
Hugging Face: a one-layer GPT-2 (n_embd 32, vocab 64, 16 tokens, batch 2) built from a config,
`use_cpu=True`, `report_to=[]`, logging every 50 steps. {args.groups} groups of three
{args.steps}-step runs in rotating order: no extra callback; callbacks that do nothing (two for
Lightning, as StageFrontier's callback adds a companion at the end of the list; one for the HF
Trainer); `StageFrontierCallback(collect="local")` (window 100: `windows.jsonl` and the log line at
each window end). A run's step time is the median interval between consecutive step ends (a
measuring callback present in every run) after {args.warmup} warm-up steps; ratios and differences
are taken within a group. "Hook work alone" calls the callback's hooks {args.hook_steps} times in
framework order on a real timer (median of 5 loops; one window spans the loop, so no analysis runs
inside it), with no framework around them; the reference row times a plain `StageTimer` loop of
five `with timer.stage(...)` blocks the same way.

{table}

Reading: the ratio is the whole cost seen by training: the framework's dispatch of the callback's
hooks (Lightning calls every hook of every callback through a profiler context; the "empty
callback(s)" columns measure that part alone), the hooks' own work with the timer (the last
column), and the analysis thread at window ends competing for the GIL. The cost is a fixed number
of microseconds per step, independent of the model: the toy steps here last a few milliseconds,
so the ratio is an upper bound for real models, whose steps last tens to hundreds of
milliseconds. On this shared machine the spread of the ratio across groups ([min, max]) is as wide
as the effect; differences inside it are noise.
"""
    write_result(args.out, text, echo=False)


if __name__ == "__main__":
    main()
