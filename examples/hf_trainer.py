"""StageFrontier in a Hugging Face Trainer run: one callback. CPU, no download.

    python examples/hf_trainer.py --steps 40 --window 10 --out sf-hf
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py --delay-rank 1 --delay-ms 40

A two-layer GPT-2 is built from a config (random weights) and trained on random tokens. Rank 0
writes OUT/windows.jsonl (plus packets under torchrun) and one log line per window;
``--delay-rank`` makes that rank's dataset sleep in ``__getitem__``.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from stagefrontier.integrations.transformers import StageFrontierCallback


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    """Random token sequences with labels; ``delay_s`` per sample on ``delay_rank``."""

    def __init__(self, n: int, length: int, vocab: int, delay_rank: int, delay_s: float) -> None:
        self.tokens = torch.randint(
            0, vocab, (n, length), generator=torch.Generator().manual_seed(0)
        )
        self.delay_rank = delay_rank
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.delay_s and int(os.environ.get("RANK", "0")) == self.delay_rank:
            time.sleep(self.delay_s)
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--delay-rank", type=int, default=-1)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="per sample")
    parser.add_argument("--out", default="sf-hf")
    parser.add_argument("--csv", help="also write one CSV row per window here")
    parser.add_argument("--no-split-forward", action="store_true")
    parser.add_argument("--no-callback", action="store_true", help="run without StageFrontier")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
    model = GPT2LMHeadModel(config)
    n = args.steps * args.batch_size * args.accumulation * int(os.environ.get("WORLD_SIZE", "1"))
    data = RandomTokens(n, 32, config.vocab_size, args.delay_rank, args.delay_ms / 1e3)

    sinks: list[Any] = []
    if args.csv:
        from stagefrontier.sinks import CsvSink

        sinks.append(CsvSink(args.csv))
    callbacks = (
        []
        if args.no_callback
        else [
            StageFrontierCallback(
                window=args.window,
                out_dir=args.out,
                sinks=sinks,
                split_forward=not args.no_split_forward,
            )
        ]
    )
    with tempfile.TemporaryDirectory() as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            gradient_accumulation_steps=args.accumulation,
            learning_rate=1e-3,
            use_cpu=True,
            report_to=[],
            logging_steps=10,
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=data, callbacks=callbacks)
        trainer.train()


if __name__ == "__main__":
    main()
