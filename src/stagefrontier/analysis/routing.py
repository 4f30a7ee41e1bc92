"""Ranking stages by a score vector: top-k and the compact routing set.

Shared by the analyzer and every baseline so that only the scoring rule differs between methods.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt


def rank_order(scores: npt.ArrayLike) -> list[int]:
    """Stage indices by descending score; equal scores keep schema order."""
    return [int(i) for i in np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")]


def top_stages(scores: npt.ArrayLike, stages: Sequence[str], k: int) -> list[str]:
    """The ``k`` highest-scoring stage names."""
    return [stages[i] for i in rank_order(scores)[:k]]


def routing_set(scores: npt.ArrayLike, stages: Sequence[str], threshold: float) -> list[str]:
    """Shortest prefix of the score-ordered stages whose cumulative normalized score reaches
    ``threshold``. Scores are normalized to sum to one; an all-zero vector gives an empty set."""
    values = np.asarray(scores, dtype=np.float64)
    total = float(values.sum())
    if total <= 0.0:
        return []
    chosen: list[str] = []
    cumulative = 0.0
    for i in rank_order(values):
        chosen.append(stages[i])
        cumulative += values[i] / total
        # A tiny slack keeps a set whose shares sum to exactly the threshold from growing by one
        # stage because of floating-point roundoff.
        if cumulative >= threshold - 1e-12:
            break
    return chosen
