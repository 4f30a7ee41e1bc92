"""The random window the analyzer and accounting tests share, and the typical residual of a
run's packets."""

from __future__ import annotations

from pathlib import Path

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


def median_step_residual_share(packets: Path) -> float:
    """The median, over every step of every rank in the packets of this folder, of the residual
    stage's part of the step's time. A loaded machine preempts the untimed code between two hooks
    in a few steps only, so the median says whether the timed stages close a step where a
    window's ``residual_share`` may carry one such preemption."""
    from stagefrontier.formats.packet import read_packet

    shares = []
    for path in sorted(packets.glob("window-*.json")):
        d = read_packet(path).d
        shares.append(d[..., -1] / d.sum(axis=-1))
    assert shares, f"no packets in {packets}"
    return float(np.median(np.concatenate([s.ravel() for s in shares])))
