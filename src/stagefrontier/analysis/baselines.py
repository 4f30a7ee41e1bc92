"""The rank-local summaries StageFrontier is compared against, each ``d -> shares [S]``.

They see exactly the window matrix the analyzer sees and go through the same validation; only
the scoring rule differs. A window whose score total is zero gets all-zero shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .accounting import FloatArray, as_window

if TYPE_CHECKING:
    from .summary import WindowSummary


def _normalized(per_stage: FloatArray) -> FloatArray:
    total = float(per_stage.sum())
    return per_stage / total if total > 0 else np.zeros_like(per_stage)


def per_stage_max(d: Any, stages: Sequence[str] | None = None) -> FloatArray:
    """Share of ``sum_t max_r d[t, r, s]``: the slowest rank's time per stage, summed."""
    return _normalized(as_window(d, stages).max(axis=1).sum(axis=0))


def per_stage_mean(d: Any, stages: Sequence[str] | None = None) -> FloatArray:
    """Share of ``sum_t mean_r d[t, r, s]``: the cross-rank average per stage."""
    return _normalized(as_window(d, stages).mean(axis=1).sum(axis=0))


def rank_spread(d: Any, stages: Sequence[str] | None = None) -> FloatArray:
    """Share of ``sum_t (max_r d - median_r d)``: a dispersion heuristic across ranks."""
    arr = as_window(d, stages)
    return _normalized((arr.max(axis=1) - np.median(arr, axis=1)).sum(axis=0))


def slowest_rank(d: Any, stages: Sequence[str] | None = None) -> FloatArray:
    """Stage breakdown of each step's slowest rank (largest total), summed over steps."""
    arr = as_window(d, stages)
    slowest = arr.sum(axis=2).argmax(axis=1)
    return _normalized(arr[np.arange(arr.shape[0]), slowest, :].sum(axis=0))


def rank0_total(d: Any, stages: Sequence[str] | None = None) -> FloatArray:
    """Rank 0's own stage breakdown, ignoring every other rank."""
    return _normalized(as_window(d, stages)[:, 0, :].sum(axis=0))


BASELINES = {
    "per_stage_max": per_stage_max,
    "per_stage_mean": per_stage_mean,
    "rank_spread": rank_spread,
    "slowest_rank": slowest_rank,
    "rank0_total": rank0_total,
}
"""Every baseline by name, in the order reports list them."""


def summary_baselines(summary: WindowSummary) -> dict[str, FloatArray]:
    """The baselines a merged summary holds exactly (per-stage maxima, means, the slowest rank's
    breakdown). ``rank_spread`` needs the median rank and ``rank0_total`` rank 0's column,
    which a summary does not keep."""
    return {
        "per_stage_max": _normalized(summary.stage_max.sum(axis=0)),
        "per_stage_mean": _normalized((summary.stage_sum / summary.n_ranks).sum(axis=0)),
        "slowest_rank": _normalized(summary.slowest.sum(axis=0)),
    }
