"""Direct-exposure gain: the step times left when a stage is clipped to its baseline.

A rank's clipped step ends at ``P[t, r, S] - max(d[t, r, s] - b, 0)``, so the recomputed step
time is one maximum over ranks per step and stage. That maximum is all the gain needs from the
ranks, and maxima of rank groups combine into the maximum of the whole window: a node summary
carries it exactly, as long as each rank's baseline is its own (``rank_median``, ``reference``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .accounting import FloatArray
from .order_stats import partitioned_median


def sorted_median(sorted_lanes: FloatArray) -> FloatArray:
    """The median of each lane of an array sorted ascending along its last axis."""
    k = sorted_lanes.shape[-1]
    if k % 2:
        return np.asarray(sorted_lanes[..., k // 2])
    return np.asarray(0.5 * (sorted_lanes[..., k // 2 - 1] + sorted_lanes[..., k // 2]))


STEP_BLOCK = 16
"""Steps copied at a time by ``copy_steps_last``."""


def copy_steps_last(d: FloatArray, out: FloatArray) -> None:
    """``d [N, R, S]`` copied into ``out [R, S, N]``, a block of steps at a time: one block of
    the source stays in cache while it is spread over the steps axis, which makes the copy about
    twice as fast as one strided copy at thousands of ranks."""
    for start in range(0, d.shape[0], STEP_BLOCK):
        block = slice(start, start + STEP_BLOCK)
        np.copyto(out[:, :, block], d[block].transpose(1, 2, 0))


def clipped_step_times(
    d: FloatArray,
    rank_totals: FloatArray,
    baseline: str,
    reference: FloatArray | None,
    groups: Sequence[Sequence[int]] | None,
    scratch: FloatArray,
) -> tuple[FloatArray, FloatArray | None]:
    """``max_r (P[t, r, S] - excess[t, r, s])`` per step and stage ``[N, S]``, and per step and
    group of stages ``[N, G]`` (every member clipped at once) when ``groups`` is given.

    ``baseline`` is a ``Gates.gain_baseline``: each rank's window median of the stage, the
    cohort median of the step (over the ranks of ``d``), or ``reference`` (``[S]`` or ``[R, S]``).
    ``scratch`` is an ``[N, S, R]`` buffer that is overwritten.
    """
    n, r, s = d.shape
    by_rank = d.transpose(0, 2, 1)  # [N, S, R] view
    if baseline == "rank_median":
        per_rank = scratch.reshape(r, s, n)
        copy_steps_last(d, per_rank)
        per_rank.sort(axis=2)  # lanes of N steps are short: numpy's sort beats a partition here
        base = sorted_median(per_rank).T[None, :, :]  # [1, S, R]
    elif baseline == "cohort_median":
        np.copyto(scratch, by_rank)
        base = partitioned_median(scratch)[:, :, None]  # [N, S, 1]
    else:
        if reference is None:
            raise ValueError("gain_baseline='reference' needs a no-stall reference")
        ref = np.asarray(reference, dtype=np.float64)
        base = (ref[:, None] if ref.ndim == 1 else ref.T)[None, :, :]
    np.subtract(by_rank, base, out=scratch)
    np.maximum(scratch, 0.0, out=scratch)  # [N, S, R]: the time clipping removes per stage
    grouped = None
    if groups is not None:
        excess = np.stack([scratch[:, members, :].sum(axis=1) for members in groups], axis=1)
        grouped = (rank_totals[:, None, :] - excess).max(axis=2)
    np.subtract(rank_totals[:, None, :], scratch, out=scratch)
    return scratch.max(axis=2), grouped


def direct_gain(step_exposed: FloatArray, clipped: FloatArray, exposed: float) -> FloatArray:
    """``G``: exposed time removed by clipping, as a fraction of the window's exposed time."""
    return np.asarray((step_exposed[:, None] - clipped).sum(axis=0) / exposed)
