"""A mergeable histogram of the ranks' prefixes per step and boundary, for the median.

The median prefix over ranks (and so the lag) does not combine across rank groups by max or
sum. Each lane (one step, one boundary) therefore keeps a histogram on fixed log-spaced buckets
shared by every group: bucket ``i`` holds the prefixes in ``(growth**(i-1), growth**i]``. Merging
adds counts, so the rank of every order statistic stays exact and only its value is known to
within its bucket. The median's error bound is half the width of the bucket (or buckets) holding
it, narrowed by the lane's exact minimum and frontier.

A lane keeps at most ``max_buckets`` buckets. When a merge would hold more, the buckets farther
than ``max_buckets // 2`` from the median bucket are folded into the outermost kept ones; the
lane's minimum (for the lowest kept bucket) and frontier (for the highest) keep the bound
valid, and the median itself sits in the middle, away from the folds. A lane remembers where it
was folded, and a later merge folds the other groups' buckets at the same edges, so the lowest
and highest kept buckets are always the ones that may hold folded prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..errors import SummaryError
from .accounting import FloatArray

IntArray = npt.NDArray[np.int64]

DEFAULT_GROWTH = 1.02
"""Neighbouring bucket edges differ by 2%: a median is known to within about 1% of itself."""
DEFAULT_MAX_BUCKETS = 16
"""Buckets per lane: at 2% apart they span -15% to +17% around the median bucket (prefixes
beyond are counted in the edge buckets); a lane of many ranks fills them all, so a merged
summary's size stops growing with its ranks."""
FLOOR_S = 1e-9
"""Prefixes at or below this share the lowest bucket."""
_SLACK = 1e-12
"""Relative widening of bucket edges, against roundoff in the bucket index."""
NO_FOLD_LOW = -(1 << 40)
NO_FOLD_HIGH = 1 << 40
_SPAN = 1 << 24
"""Keys are ``lane * _SPAN + index + _SPAN // 2``: room for every index of a valid growth."""


@dataclass(frozen=True, eq=False)
class PrefixSketch:
    """Per lane ``(t, s)`` of an ``[N, S]`` window, the bucket counts of the ranks' prefixes."""

    growth: float
    max_buckets: int
    lane_min: FloatArray
    """``[N, S]`` the smallest prefix of the lane, exact."""
    sizes: IntArray
    """``[N * S]`` buckets kept per lane, lanes in row-major order."""
    index: IntArray
    """``[E]`` bucket numbers, ascending within each lane."""
    count: IntArray
    """``[E]`` ranks per bucket."""
    fold_low: IntArray
    """``[N * S]`` the bucket that holds every lower prefix too (``NO_FOLD_LOW`` if none)."""
    fold_high: IntArray
    """``[N * S]`` the bucket that holds every higher prefix too (``NO_FOLD_HIGH`` if none)."""


def check_settings(growth: float, max_buckets: int) -> None:
    """Raise SummaryError for a bucket growth outside ``(1.0001, 2]`` or fewer than 4 buckets."""
    if not isinstance(growth, float) or not 1.0001 <= growth <= 2.0:
        raise SummaryError(f"sketch growth must be a float in [1.0001, 2], got {growth!r}")
    if isinstance(max_buckets, bool) or not isinstance(max_buckets, int) or max_buckets < 4:
        raise SummaryError(f"sketch max_buckets must be an integer >= 4, got {max_buckets!r}")


def sketch_prefixes(lanes: FloatArray, growth: float, max_buckets: int) -> PrefixSketch:
    """The sketch of ``lanes [N, S, R]``, every rank's prefix per step and boundary."""
    n, s, r = lanes.shape
    index = np.ceil(np.log(np.maximum(lanes, FLOOR_S)) / np.log(growth)).astype(np.int64)
    lane = np.broadcast_to(np.arange(n * s).reshape(n, s, 1), lanes.shape)
    folds = (np.full(n * s, NO_FOLD_LOW), np.full(n * s, NO_FOLD_HIGH))
    ones = np.ones(n * s * r, np.int64)
    entries = (lane.ravel(), index.ravel(), ones)
    return _from_entries(entries, lanes.min(axis=2), folds, r, growth, max_buckets)


def merge_sketches(parts: Sequence[PrefixSketch], n_ranks: int) -> PrefixSketch:
    """One sketch of the union of disjoint rank groups (``n_ranks`` ranks in all)."""
    first = parts[0]
    lanes = [np.repeat(np.arange(p.sizes.size), p.sizes) for p in parts]
    entries = (
        np.concatenate(lanes),
        np.concatenate([p.index for p in parts]),
        np.concatenate([p.count for p in parts]),
    )
    folds = (
        np.maximum.reduce([p.fold_low for p in parts]),
        np.minimum.reduce([p.fold_high for p in parts]),
    )
    lane_min = np.minimum.reduce([p.lane_min for p in parts])
    return _from_entries(entries, lane_min, folds, n_ranks, first.growth, first.max_buckets)


def sketch_median(
    sketch: PrefixSketch, front: FloatArray, n_ranks: int
) -> tuple[FloatArray, FloatArray]:
    """The median prefix per lane ``[N, S]`` and the bound on its error.

    ``front`` is the exact frontier (the lane maximum), which caps the highest bucket.
    """
    shape = sketch.lane_min.shape
    cumulative = np.cumsum(sketch.count)
    base = np.arange(sketch.sizes.size) * n_ranks
    low_all, high_all = entry_bounds(sketch, front)
    estimate = np.zeros(sketch.sizes.size)
    half_widths = np.zeros(sketch.sizes.size)
    for k in sorted({(n_ranks - 1) // 2, n_ranks // 2}):
        entry = np.searchsorted(cumulative, base + k, side="right")
        low, high = low_all[entry], high_all[entry]
        estimate += 0.5 * (low + high)
        half_widths += 0.5 * (high - low)
    pairs = 1 if n_ranks % 2 else 2
    return (estimate / pairs).reshape(shape), (half_widths / pairs).reshape(shape)


def entry_bounds(sketch: PrefixSketch, front: FloatArray) -> tuple[FloatArray, FloatArray]:
    """``[E]`` the least and the most each bucket's values can be: its edges, narrowed by its
    lane's exact minimum and ``front`` (its exact maximum), which also bound a lane's lowest and
    highest kept buckets (where folded values sit)."""
    lane = np.repeat(np.arange(sketch.sizes.size), sketch.sizes)
    ends = np.cumsum(sketch.sizes)
    starts = ends - sketch.sizes
    entry = np.arange(sketch.index.size)
    lane_min, top = sketch.lane_min.ravel()[lane], front.ravel()[lane]
    bucket = sketch.index.astype(np.float64)
    low = np.power(sketch.growth, bucket - 1) * (1 - _SLACK)
    high = np.power(sketch.growth, bucket) * (1 + _SLACK)
    low = np.where(entry == starts[lane], lane_min, np.maximum(low, lane_min))
    high = np.where(entry == ends[lane] - 1, top, np.minimum(high, top))
    return low, high


def widen_lanes(sketch: PrefixSketch, columns: IntArray, width: int, n_ranks: int) -> PrefixSketch:
    """The sketch of ``[N, S]`` lanes laid out as ``[N, width]``: column ``s`` moves to
    ``columns[s]``, and each new column holds the ``n_ranks`` ranks at the floor (lanes where
    they recorded nothing), so sketches of groups that recorded different columns merge."""
    n = sketch.lane_min.shape[0]
    moved = (np.arange(n)[:, None] * width + columns[None, :]).ravel()
    lane = np.repeat(moved, sketch.sizes)
    empty = np.setdiff1d(np.arange(n * width), moved)
    floor = int(np.ceil(np.log(FLOOR_S) / np.log(sketch.growth)))
    entries = (
        np.concatenate([lane, empty]),
        np.concatenate([sketch.index, np.full(empty.size, floor)]),
        np.concatenate([sketch.count, np.full(empty.size, n_ranks)]),
    )
    lane_min = np.zeros(n * width)
    lane_min[moved] = sketch.lane_min.ravel()
    folds = (np.full(n * width, NO_FOLD_LOW), np.full(n * width, NO_FOLD_HIGH))
    folds[0][moved], folds[1][moved] = sketch.fold_low, sketch.fold_high
    return _from_entries(
        entries, lane_min.reshape(n, width), folds, n_ranks, sketch.growth, sketch.max_buckets
    )


def _from_entries(
    entries: tuple[IntArray, IntArray, IntArray],
    lane_min: FloatArray,
    folds: tuple[IntArray, IntArray],
    n_ranks: int,
    growth: float,
    max_buckets: int,
) -> PrefixSketch:
    """Fold (lane, bucket, count) entries at the lanes' fold edges, add up equal buckets, then
    fold lanes that still hold too many buckets around their median bucket."""
    lane, index, count = entries
    fold_low, fold_high = folds
    n_lanes = lane_min.size
    lane, index, count = _aggregate(lane, np.clip(index, fold_low[lane], fold_high[lane]), count)
    sizes = np.bincount(lane, minlength=n_lanes)
    if sizes.max(initial=0) > max_buckets:
        crowded = sizes > max_buckets
        cumulative = np.cumsum(count)
        middle = np.arange(n_lanes) * n_ranks + (n_ranks - 1) // 2
        low = index[np.searchsorted(cumulative, middle, side="right")] - max_buckets // 2
        fold_low = np.where(crowded, np.maximum(fold_low, low), fold_low)
        fold_high = np.where(crowded, np.minimum(fold_high, low + max_buckets - 1), fold_high)
        lane, index, count = _aggregate(
            lane, np.clip(index, fold_low[lane], fold_high[lane]), count
        )
        sizes = np.bincount(lane, minlength=n_lanes)
    return PrefixSketch(
        growth=growth,
        max_buckets=max_buckets,
        lane_min=lane_min,
        sizes=sizes.astype(np.int64),
        index=index,
        count=count,
        fold_low=fold_low,
        fold_high=fold_high,
    )


def _aggregate(
    lane: IntArray, index: IntArray, count: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    keys = lane * _SPAN + index + _SPAN // 2
    unique, inverse = np.unique(keys, return_inverse=True)
    summed = np.bincount(inverse, weights=count).astype(np.int64)
    return unique // _SPAN, unique % _SPAN - _SPAN // 2, summed
