"""A small decoder-only transformer language model over characters, and its data."""

from __future__ import annotations

from importlib import resources

import torch
from torch import nn


def load_corpus() -> str:
    """The public-domain demo text shipped with the package (see data/README.md)."""
    return resources.files(__package__).joinpath("data/genesis_kjv.txt").read_text("utf-8")


class CharData:
    """Character-level batches from one text; each rank draws its own seeded batches."""

    def __init__(self, text: str, seq_len: int, batch_size: int, seed: int) -> None:
        vocab = sorted(set(text))
        self.vocab_size = len(vocab)
        index = {ch: i for i, ch in enumerate(vocab)}
        self.tokens = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> CharData:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = len(self.tokens) - self.seq_len - 1
        starts = torch.randint(0, high, (self.batch_size,), generator=self.generator)
        offsets = torch.arange(self.seq_len + 1)
        window = self.tokens[starts[:, None] + offsets[None, :]]
        return window[:, :-1], window[:, 1:]


class TinyDecoder(nn.Module):  # type: ignore[misc]
    """Embedding, a few pre-norm causal self-attention blocks, a tied output projection."""

    def __init__(
        self, vocab_size: int, seq_len: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 4
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(
            d_model,
            n_heads,
            dim_feedforward=4 * d_model,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        x = self.blocks(x, mask=self.mask, is_causal=True)
        return self.norm(x) @ self.embed.weight.T
