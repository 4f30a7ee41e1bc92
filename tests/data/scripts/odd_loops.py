"""Training loops whose shape the automatic hooks cannot time as they are (no StageFrontier in
here): ``python odd_loops.py MODE`` with MODE one of

- ``two-optimizers``: a generator and a discriminator, each with its own optimizer step;
- ``no-step``: parameters updated by hand, never through ``optimizer.step()``;
- ``custom-backward``: gradients from ``torch.autograd.grad``, no backward call;
- ``eval-only``: 1,200 forward calls under ``torch.no_grad()``, no training at all;
- ``plain``: one optimizer, one backward per step (the shape that fits).

One process, no launcher: 12 steps of a tiny model (``eval-only``: 1,200 forwards).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 12


def main(mode: str) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    other = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    second = torch.optim.SGD(other.parameters(), lr=0.01)
    if mode == "eval-only":
        with torch.no_grad():
            for _ in range(STEPS * 100):
                model(torch.randn(4, 8))
        print(f"{mode}: done")
        return
    for _ in range(STEPS):
        x = torch.randn(4, 8)
        loss = F.mse_loss(model(x), torch.zeros(4, 1))
        if mode == "no-step":
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
            continue
        if mode == "custom-backward":
            grads = torch.autograd.grad(loss, list(model.parameters()))
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if mode == "two-optimizers":
            F.mse_loss(other(x), torch.ones(4, 1)).backward()
            second.step()
            second.zero_grad()
    print(f"{mode}: done")


if __name__ == "__main__":
    main(sys.argv[1])
