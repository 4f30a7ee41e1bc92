"""A Hugging Face Trainer run under torchrun, with no StageFrontier in it. CPU, no download.

    stagefrontier run --out sf --window 10 --standalone --nproc-per-node 4 \
        examples/unmodified/hf_trainer.py --steps 30

A two-layer GPT-2 built from a config (random weights) trains on random tokens.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(
            model=GPT2LMHeadModel(config),
            args=TrainingArguments(
                output_dir=scratch,
                max_steps=args.steps,
                per_device_train_batch_size=4,
                report_to=[],
                save_strategy="no",
                logging_strategy="no",
                use_cpu=True,
                ddp_backend="gloo",
                disable_tqdm=True,
            ),
            train_dataset=RandomTokens(args.steps * 4 * 4, 16, 128),
        )
        trainer.train()


if __name__ == "__main__":
    main()
