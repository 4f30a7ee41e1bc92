"""A Hugging Face Trainer run under torchrun, with no StageFrontier in it. CPU, no download.

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        examples/unmodified/hf_trainer.py --steps 30 --stall data@2

A two-layer GPT-2 built from a config (random weights) trains on random tokens.
``--workers N`` gives the DataLoader N worker processes; ``--stall data@R`` makes rank R's
samples slow (``slow_sample``: 120 ms of stall per step), ``--stall forward@R`` rank R's
forward (``slow_forward``). The model's own step takes about 25 ms. ``--local-token-count``
turns off the Trainer's cross-rank sum of each batch's label tokens
(``average_tokens_across_devices=False``), which runs after the fetches and makes every rank
wait there for the slowest one.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

STALL_S = 0.12
"""The injected stall per step."""
COMPUTE_S = 0.025
"""The model's own time per step (a sleep: the ranks share a small machine)."""
BATCH = 4


def slow_sample(delay_s: float) -> None:
    time.sleep(delay_s)


def slow_forward(delay_s: float) -> None:
    time.sleep(delay_s)


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int, sample_delay_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, length), generator=generator)
        self.delay_s = sample_delay_s

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.delay_s:
            slow_sample(self.delay_s)
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class SmallGPT(GPT2LMHeadModel):
    delay_s = 0.0

    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        time.sleep(COMPUTE_S)
        if self.delay_s:
            slow_forward(self.delay_s)
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--stall", default="", help="data@RANK or forward@RANK")
    parser.add_argument("--local-token-count", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kind, _, stalled = args.stall.partition("@")
    stall = STALL_S if stalled and int(stalled) == int(os.environ.get("RANK", "0")) else 0.0
    # each worker makes a whole batch: with W workers a batch is W times slower to stall as much
    per_sample = stall * max(1, args.workers) / BATCH if kind == "data" else 0.0
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    model = SmallGPT(config)
    model.delay_s = stall if kind == "forward" else 0.0
    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(
                output_dir=scratch,
                max_steps=args.steps,
                per_device_train_batch_size=BATCH,
                report_to=[],
                save_strategy="no",
                logging_strategy="no",
                use_cpu=True,
                ddp_backend="gloo",
                disable_tqdm=True,
                dataloader_num_workers=args.workers,
                average_tokens_across_devices=not args.local_token_count,
            ),
            train_dataset=RandomTokens(args.steps * BATCH * ranks, 16, 128, per_sample),
        )
        trainer.train()


if __name__ == "__main__":
    main()
