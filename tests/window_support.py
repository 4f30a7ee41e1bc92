"""The random window the analyzer and accounting tests share."""

from __future__ import annotations

import numpy as np


def random_window(seed: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Lognormal stage times with zeros and rare per-rank stalls, so the frontier moves around;
    never all zero."""
    rng = np.random.default_rng(seed)
    d = rng.lognormal(mean=-3.0, sigma=0.7, size=shape)
    d[rng.random(shape) < 0.1] = 0.0
    stalls = rng.random(shape) < 0.08
    d[stalls] += rng.exponential(0.5, size=int(stalls.sum()))
    d[0, 0, 0] += 0.01
    return d
