"""The Lightning and Hugging Face callbacks in real training runs on CPU.

- Lightning: a real ``Trainer(accelerator="cpu", devices=2, strategy="ddp")`` fit (Lightning
  starts the second rank by running the script again) with a data-loading delay on rank 1:
  rank 0's ``windows.jsonl`` routes every window to ``data.next_wait`` led by rank 1.
- Hugging Face: a real ``Trainer`` on a tiny GPT-2 built from a config (no download), CPU.

Skipped, with the extra to install, where the framework is missing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rank_support import agent_store_env, job_env, run_job
from window_support import median_step_residual_share

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEADLINE_S = 300


def _needs(module: str, extra: str) -> Any:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return pytest.mark.skipif(
            True, reason=f"{module} missing ({exc}); pip install '.[{extra}]'"
        )
    return pytest.mark.skipif(False, reason="")


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]


def _example(
    script: str, cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(EXAMPLES / script), *args]
    return run_job(command, DEADLINE_S, cwd=cwd, env=job_env(**(env or {})))


@_needs("lightning", "lightning")
def test_lightning_ddp_routes_a_rank_1_data_delay_to_the_data_stage(tmp_path: Path) -> None:
    from stagefrontier.integrations.lightning import LIGHTNING_STAGES

    with agent_store_env() as store:  # the 2 ranks meet at a store held here
        proc = _example(
            "lightning_ddp.py",
            tmp_path,
            *("--devices", "2", "--steps", "24", "--window", "8"),
            *("--delay-rank", "1", "--delay-ms", "40", "--out", "sf"),
            env=store,
        )
    assert "Tip:" not in proc.stdout + proc.stderr  # Lightning's own chatter stays quiet
    records = _records(tmp_path / "sf")
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 7), (8, 15), (16, 23)]
    for r in records:
        assert r["world_size"] == 2 and r["ranks_present"] == [0, 1] and r["gather_ok"]
        assert r["stages"] == list(LIGHTNING_STAGES)
        assert r["contract_violations"] == 0
        assert r["top1"] == "data.next_wait", r["shares"]
        assert r["shares"]["data.next_wait"] > 0.5
        assert r["leaders"]["data.next_wait"] == 1
    # every step's wall time is covered by the hook-bounded stages
    assert median_step_residual_share(tmp_path / "sf" / "packets") < 0.05


@_needs("lightning", "lightning")
def test_lightning_gradient_accumulation_times_microsteps(tmp_path: Path) -> None:
    from stagefrontier.analysis.schema import expand_microsteps
    from stagefrontier.integrations.lightning import LIGHTNING_STAGES

    _example(
        "lightning_ddp.py",
        tmp_path,
        *("--devices", "1", "--steps", "8", "--window", "4", "--accumulation", "2"),
        *("--out", "sf", "--csv", "sf/windows.csv"),
    )
    records = _records(tmp_path / "sf")
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7)]
    for r in records:
        assert r["accumulation_factor"] == 2
        assert r["stages"] == list(expand_microsteps(LIGHTNING_STAGES, 2))
        assert r["contract_violations"] == 0
        assert "gradient_accumulation_ambiguous" not in r["labels"]
        # micro-batch 1 has its own data wait, forward and backward; the optimizer runs once
        advances = r["advances"]
        assert advances["model.backward_cpu_wall[1]"] > 0
        assert advances["optim.step_cpu_wall[1]"] > 0 and advances["optim.step_cpu_wall[0]"] == 0
    assert len((tmp_path / "sf" / "windows.csv").read_text().splitlines()) == 3


def _fit_tiny(tmp_path: Path, loader: Any, callback: Any, max_steps: int) -> None:
    """A one-device CPU Lightning fit of a one-layer model on batches of 4 features: pairs
    ``(x, y)`` fit ``y``, plain tensors are pushed towards zero."""
    import lightning.pytorch as pl
    import torch

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if isinstance(batch, list | tuple):
                x, y = batch
                return torch.nn.functional.mse_loss(self.layer(x), y)
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), loader)


@_needs("lightning", "lightning")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # raised inside Lightning 2.6
def test_lightning_callback_passes_gates_to_the_live_analysis(tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from stagefrontier import Gates
    from stagefrontier.integrations.lightning import StageFrontierCallback

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    out = tmp_path / "sf"
    callback = StageFrontierCallback(window=4, out_dir=out, gates=Gates(share_dominance=0.3))
    _fit_tiny(tmp_path, DataLoader(data, batch_size=2), callback, max_steps=8)
    records = _records(out)
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7)]
    assert all(r["gates"]["share_dominance"] == 0.3 for r in records)


@_needs("lightning", "lightning")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # raised inside Lightning 2.6
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_lightning_persistent_workers_are_restarted_once_and_timed(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from loader_support import MarkWorker, Samples
    from stagefrontier.integrations.lightning import StageFrontierCallback

    marks = tmp_path / "marks"
    marks.mkdir()
    loader = DataLoader(
        Samples(24),
        batch_size=4,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        worker_init_fn=MarkWorker(str(marks)),
    )
    out = tmp_path / "sf"
    callback = StageFrontierCallback(window=4, out_dir=out)
    _fit_tiny(tmp_path, loader, callback, max_steps=2 * len(loader))  # two epochs
    figures = [r["loader_workers"]["0"] for r in _records(out)]
    # Lightning started the first epoch's persistent workers before any hook; the callback shut
    # them down and the epoch started again with workers that count every batch they make.
    assert all("note" not in f and f["workers"] == 2 for f in figures), figures
    assert sum(f["batches"] for f in figures) == 2 * len(loader)
    assert sum(f["consumed"] for f in figures) == 2 * len(loader)
    # The user's worker_init_fn ran in both sets of workers (2 + 2), and the second set served
    # both epochs.
    assert len(list(marks.iterdir())) == 4


def _fit_until_the_loader_fails(
    tmp_path: Path, dataset: Any, error: str, workers: int = 2, **loader_args: Any
) -> Any:
    """A Lightning fit whose DataLoader raises ``error`` in the training loop; the one rank's
    figures of the window the callback closed on."""
    from torch.utils.data import DataLoader

    from stagefrontier.integrations.lightning import StageFrontierCallback

    loader = DataLoader(dataset, batch_size=4, num_workers=workers, **loader_args)
    callback = StageFrontierCallback(window=100, out_dir=tmp_path / "sf")
    with pytest.raises(RuntimeError, match=error):
        _fit_tiny(tmp_path, loader, callback, max_steps=12)
    (record,) = _records(tmp_path / "sf")
    return record["loader_workers"]["0"]


@_needs("lightning", "lightning")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # raised inside Lightning 2.6
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_lightning_names_a_dataloader_worker_that_dies_in_a_batch(tmp_path: Path) -> None:
    from loader_support import DiesAt

    # Worker 2 dies in its first batch (batch 2; Lightning fetches one batch ahead, so step 0
    # has run). Lightning closes the timer as soon as the loader fails.
    figures = _fit_until_the_loader_fails(
        tmp_path, DiesAt(48, at=9), "exited unexpectedly", workers=3
    )
    assert figures["note"] == "worker(s) 2 exited while in use", figures
    assert figures["consumed"] >= 1


@_needs("lightning", "lightning")
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*")  # raised inside Lightning 2.6
@pytest.mark.filterwarnings("ignore:.*does not have many workers.*")
def test_lightning_says_a_worker_hung_past_the_loader_timeout_and_gives_no_advice(
    tmp_path: Path,
) -> None:
    from loader_support import HangsAt
    from stagefrontier.render.loader_text import loader_sentence

    figures = _fit_until_the_loader_fails(tmp_path, HangsAt(48, at=37), "timed out", timeout=2)
    assert re.fullmatch(r"worker\(s\) 1 hung in one batch for \d+ s", figures["note"]), figures
    assert figures["hung_s"] >= 2
    # The window measured the hang, not the workers' speed: no saturation, no worker count.
    assert not {"saturated", "workers_needed", "busy"} & set(figures), figures
    sentence = loader_sentence(figures, 0)
    assert sentence.startswith("rank 0's DataLoader worker(s) 1 hung in one batch for ")
    assert "num_workers" not in sentence


def _hf_run(
    tmp_path: Path, *, accumulation: int, split_forward: bool, **timer_kwargs: Any
) -> list[dict[str, Any]]:
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from stagefrontier.integrations.transformers import StageFrontierCallback

    class Tokens(Dataset[dict[str, torch.Tensor]]):
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    )
    steps, window = 12, 4
    out = tmp_path / "sf"
    callback = StageFrontierCallback(
        window=window, out_dir=out, split_forward=split_forward, **timer_kwargs
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=accumulation,
        use_cpu=True,
        report_to=[],
        logging_steps=5,  # a logging step inside a window: the step closes at on_log
        save_strategy="no",
        disable_tqdm=True,
    )
    data = Tokens(steps * 2 * accumulation)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    assert callback.timer is None  # closed at on_train_end
    # the forward hook is gone with the run
    assert not model._forward_hooks
    return _records(out)


@_needs("transformers", "transformers")
def test_hf_trainer_run_produces_windows(tmp_path: Path) -> None:
    from stagefrontier import Gates
    from stagefrontier.integrations.transformers import TRAINER_STAGES
    from stagefrontier.sinks import PacketSink

    gates = Gates(share_dominance=0.3)
    packets = PacketSink(tmp_path / "sf")  # a single process writes none by default
    records = _hf_run(tmp_path, accumulation=1, split_forward=True, gates=gates, sinks=[packets])
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7), (8, 11)]
    for r in records:
        assert r["gates"]["share_dominance"] == 0.3  # the callback's gates reach the analysis
        assert r["stages"] == list(TRAINER_STAGES)
        assert r["contract_violations"] == 0
        assert r["world_size"] == 1 and r["gather_ok"]
        adv = r["advances"]
        # the forward hook splits forward from backward; every hooked stage saw time
        for stage in TRAINER_STAGES[:-1]:
            assert adv[stage] > 0, (stage, adv)
    assert median_step_residual_share(tmp_path / "sf" / "packets") < 0.05


@_needs("transformers", "transformers")
def test_hf_trainer_accumulation_without_the_forward_split(tmp_path: Path) -> None:
    from stagefrontier.analysis.schema import expand_microsteps
    from stagefrontier.integrations.transformers import FWD_BWD_STAGE, TRAINER_STAGES_LUMPED

    records = _hf_run(tmp_path, accumulation=2, split_forward=False)
    assert len(records) == 3
    for r in records:
        assert r["stages"] == list(expand_microsteps(TRAINER_STAGES_LUMPED, 2))
        assert r["accumulation_factor"] == 2 and r["contract_violations"] == 0
        assert r["advances"][f"{FWD_BWD_STAGE}[0]"] > 0
        assert r["advances"][f"{FWD_BWD_STAGE}[1]"] > 0


@_needs("lightning", "lightning")
@_needs("transformers", "transformers")
def test_overhead_benchmark_quick_prints_its_table() -> None:
    script = EXAMPLES.parent / "benchmarks" / "integrations.py"
    proc = subprocess.run(
        [
            *(sys.executable, str(script), "--groups", "1", "--steps", "30"),
            *("--warmup", "5", "--hook-steps", "200", "--no-write"),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| framework | step, no callback (ms)")
    assert [row.split("|")[1].strip() for row in rows[1:3]] == ["lightning", "transformers"]
