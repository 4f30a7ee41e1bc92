"""Window summaries of rank groups, which combine exactly into the summary of their union.

At each stage boundary the frontier is a maximum over ranks, so a group of ranks (a node) can
send what its ranks contribute to every maximum instead of its ranks' windows:

* exact by max: per step and boundary the ``top_k`` largest prefixes with their ranks (the
  frontier, its leader and the second prefix, so gaps and advances; tie sets while no group
  holds more than ``top_k`` ranks within the tolerance, and the analysis says when one may
  have), the direct-gain step times ``max_r (P[t, r, S] - excess[t, r, s])`` (exact for the
  rank-median and reference baselines, whose baseline is each rank's own), the per-stage maxima
  and the slowest rank's durations per step (for the baselines);
* exact by sum: per-stage sums over ranks and the sum of rank step totals;
* exact by max and min: per stage the ``top_k`` largest of the ranks' own mean durations over
  the window (with their ranks) and the smallest, what the live regression check needs to say
  which ranks grew;
* not mergeable, so approximated with a stated bound: the median prefix per step and boundary
  (the lag), from a ``PrefixSketch``; and the cohort-median gain, whose baseline is a median
  over all ranks (a merged summary uses each group's own median and says so).

A summary's size is ``O(N * S * top_k)`` plus the sketch's ``O(N * S * max_buckets)`` and the
runs of consecutive ranks covered, whatever the number of ranks; so is the cost of combining and
analyzing it. ``summarize`` builds one from a group's ``[N, R, S]`` window, ``combine`` merges
disjoint groups, and ``analyzer.analyze_summary`` reports on it through the same evidence core
as ``analyze``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SummaryError
from .accounting import FloatArray, as_window, rank_last_prefixes
from .evidence import FrontierInputs, IntArray, dominant_stages, expand_runs, rank_runs
from .gain import clipped_step_times, sorted_median
from .gates import GAIN_BASELINES
from .prefix_sketch import (
    DEFAULT_GROWTH,
    DEFAULT_MAX_BUCKETS,
    PrefixSketch,
    check_settings,
    merge_sketches,
    sketch_median,
    sketch_prefixes,
)
from .roles import checked_rank_ids
from .schema import check_stage_names
from .semantic import substage_groups

DEFAULT_TOP_K = 4
"""Prefixes kept per step and boundary: the leader, the runner-up and two more for ties."""


@dataclass(frozen=True, eq=False)
class WindowSummary:
    """What a group of ranks contributes to one window's analysis (see the module docstring).

    Arrays are ``N`` steps by ``S`` stages; ``K = min(top_k, n_ranks)`` entries per lane.
    """

    stages: tuple[str, ...]
    rank_runs: IntArray
    """``[U, 2]`` the global rank numbers covered, as ascending runs of (first rank, length)
    that do not touch (see ``evidence.rank_runs``)."""
    top_k: int
    top_prefix: FloatArray
    """``[N, S, K]`` the largest prefixes per step and boundary, largest first (equal values
    in rank order)."""
    top_rank: IntArray
    """``[N, S, K]`` the rank of each of them."""
    top_dominant: IntArray
    """``[N, K]`` the largest broad stage of each rank in ``top_rank[:, -1, :]``."""
    clipped: FloatArray
    """``[N, S]`` the direct gain's step times, one stage clipped to its baseline."""
    group_clipped: FloatArray
    """``[N, G]`` the same per broad stage, all its substages clipped (``G = 0`` without
    accumulation substages)."""
    stage_max: FloatArray
    """``[N, S]`` ``max_r d[t, r, s]``."""
    stage_sum: FloatArray
    """``[N, S]`` ``sum_r d[t, r, s]``."""
    slowest: FloatArray
    """``[N, S]`` the durations of each step's slowest rank (``top_rank[t, -1, 0]``)."""
    rank_total_sum_s: float
    """Sum over steps and ranks of the rank step totals."""
    mean_top: FloatArray
    """``[S, K]`` per stage the largest of the ranks' own mean durations over the window's
    steps, largest first (the live regression check's evidence of which ranks grew)."""
    mean_top_rank: IntArray
    """``[S, K]`` the rank of each of them."""
    mean_min: FloatArray
    """``[S]`` per stage the smallest of the ranks' own mean durations."""
    sketch: PrefixSketch
    gain_baseline: str
    """The ``Gates.gain_baseline`` the clipped step times were computed against."""
    gain_exact: bool
    """False when cohort-median gains of several groups were merged (each used its own
    median)."""
    quantum_ns: int = 0
    """The grid (nanoseconds, a power of two) its durations and prefixes lie on when they came
    through a compact encoding (``formats.summary_codec``), the finest among combined parts; 0
    when none did."""
    rounding_s: float = 0.0
    """The largest error a compact encoding put on any one duration or prefix it holds (half a
    quantum; a sum over parts, such as ``stage_sum``, carries at most this per part); 0 when
    its values are the ranks' own."""

    @property
    def n_steps(self) -> int:
        return int(self.top_prefix.shape[0])

    @property
    def n_ranks(self) -> int:
        return int(self.rank_runs[:, 1].sum())

    @property
    def ranks(self) -> IntArray:
        """Every rank number covered, ascending (``O(R)``; the analysis does not need it)."""
        return expand_runs(self.rank_runs)

    def frontier_inputs(self) -> FrontierInputs:
        """The evidence core's inputs: the kept lanes, and the median exactly when the lanes
        hold every rank, else from the sketch with its bound."""
        front = self.top_prefix[:, :, 0]
        if self.top_prefix.shape[2] >= self.n_ranks:
            median = sorted_median(self.top_prefix[:, :, ::-1])
            bound = np.zeros(front.shape)
        else:
            median, bound = sketch_median(self.sketch, front, self.n_ranks)
        second = self.top_prefix[:, :, 1] if self.n_ranks > 1 else np.zeros(front.shape)
        return FrontierInputs(
            n_ranks=self.n_ranks,
            rank_runs=self.rank_runs,
            lanes=self.top_prefix,
            lane_ranks=self.top_rank,
            second=second,
            median=median,
            median_bound_s=bound,
            dominant=self.top_dominant,
            clipped=self.clipped,
            group_clipped=self.group_clipped if self.group_clipped.shape[1] else None,
            rank_total_sum_s=self.rank_total_sum_s,
        )


def summarize(
    d: Any,
    ranks: Sequence[int],
    stages: Sequence[str],
    *,
    top_k: int = DEFAULT_TOP_K,
    gain_baseline: str = "rank_median",
    reference: Any = None,
    growth: float = DEFAULT_GROWTH,
    max_buckets: int = DEFAULT_MAX_BUCKETS,
) -> WindowSummary:
    """The summary of one group's window ``d [N, R, S]`` whose columns are ``ranks``.

    Args:
        d: the group's durations in seconds.
        ranks: the global rank number of each column (distinct, >= 0).
        stages: the ``S`` ordered stage names.
        top_k: prefixes kept per step and boundary (>= 2).
        gain_baseline: the ``Gates.gain_baseline`` the analysis will use.
        reference: with ``gain_baseline="reference"``, the no-stall durations ``[S]`` or the
            group's ``[R, S]``.
        growth: the median sketch's bucket spacing (see ``prefix_sketch``); every summary to be
            combined must use the same.
        max_buckets: the median sketch's size; every summary to be combined must use the same.

    Raises:
        DurationsError, StageNamesError: a malformed window or stage list.
        SummaryError: bad ranks, top_k, baseline, reference or sketch settings.
    """
    names = check_stage_names(stages)
    arr = as_window(d, names)
    n, r, s = arr.shape
    rank_ids = checked_rank_ids(ranks, r, SummaryError)
    _check_settings(top_k, gain_baseline, growth, max_buckets)
    order = np.argsort(rank_ids, kind="stable")
    arr, rank_ids = np.ascontiguousarray(arr[:, order, :]), rank_ids[order]
    ref = _checked_reference(reference, gain_baseline, r, s)
    if ref is not None and ref.ndim == 2:
        ref = ref[order]

    prefix = rank_last_prefixes(arr)  # [N, S, R]
    k = min(top_k, r)
    top = np.argsort(-prefix, axis=2, kind="stable")[:, :, :k]
    groups = substage_groups(names)
    totals = prefix[:, -1, :]
    means = arr.mean(axis=0).T  # [S, R]: each rank's own mean per stage
    slow = np.argsort(-means, axis=1, kind="stable")[:, :k]
    scratch = np.empty((n, s, r), dtype=np.float64)
    clipped, group_clipped = clipped_step_times(arr, totals, gain_baseline, ref, groups, scratch)
    return WindowSummary(
        stages=names,
        rank_runs=rank_runs(rank_ids),
        top_k=top_k,
        top_prefix=np.take_along_axis(prefix, top, axis=2),
        top_rank=rank_ids[top],
        top_dominant=dominant_stages(arr[np.arange(n)[:, None], top[:, -1, :]], groups),
        clipped=clipped,
        group_clipped=np.zeros((n, 0)) if group_clipped is None else group_clipped,
        stage_max=arr.max(axis=1),
        stage_sum=arr.sum(axis=1),
        slowest=arr[np.arange(n), top[:, -1, 0], :],
        rank_total_sum_s=float(totals.sum()),
        mean_top=np.take_along_axis(means, slow, axis=1),
        mean_top_rank=rank_ids[slow],
        mean_min=means.min(axis=1),
        sketch=sketch_prefixes(prefix, growth, max_buckets),
        gain_baseline=gain_baseline,
        gain_exact=True,
    )


def combine(parts: Sequence[WindowSummary]) -> WindowSummary:
    """The summary of the union of disjoint rank groups, exact in every field but the sketch.

    Raises:
        SummaryError: no parts, parts of different stages, step counts, top_k, gain baseline or
            sketch settings, or rank groups that overlap.
    """
    if not parts:
        raise SummaryError("combine needs at least one summary")
    first = parts[0]
    _check_compatible(parts)
    if len(parts) == 1:
        return first
    runs = _merged_runs(np.concatenate([p.rank_runs for p in parts]))
    n_ranks = int(runs[:, 1].sum())
    values = np.concatenate([p.top_prefix for p in parts], axis=2)
    owners = np.concatenate([p.top_rank for p in parts], axis=2)
    k = min(first.top_k, n_ranks)
    order = np.lexsort((owners, -values), axis=2)[:, :, :k]
    dominant = np.concatenate([p.top_dominant for p in parts], axis=1)
    # The part holding each step's slowest rank: the largest total, then the lowest rank.
    tops = np.stack([p.top_prefix[:, -1, 0] for p in parts])  # [P, N]
    top_ranks = np.stack([p.top_rank[:, -1, 0] for p in parts])
    slowest_part = np.lexsort((top_ranks, -tops), axis=0)[0]
    slowest = np.stack([p.slowest for p in parts])[slowest_part, np.arange(first.n_steps)]
    means = np.concatenate([p.mean_top for p in parts], axis=1)
    mean_owners = np.concatenate([p.mean_top_rank for p in parts], axis=1)
    slow = np.lexsort((mean_owners, -means), axis=1)[:, :k]
    return WindowSummary(
        stages=first.stages,
        rank_runs=runs,
        top_k=first.top_k,
        top_prefix=np.take_along_axis(values, order, axis=2),
        top_rank=np.take_along_axis(owners, order, axis=2),
        top_dominant=np.take_along_axis(dominant, order[:, -1, :], axis=1),
        clipped=np.maximum.reduce([p.clipped for p in parts]),
        group_clipped=np.maximum.reduce([p.group_clipped for p in parts]),
        stage_max=np.maximum.reduce([p.stage_max for p in parts]),
        stage_sum=np.add.reduce([p.stage_sum for p in parts]),
        slowest=slowest,
        rank_total_sum_s=float(sum(p.rank_total_sum_s for p in parts)),
        mean_top=np.take_along_axis(means, slow, axis=1),
        mean_top_rank=np.take_along_axis(mean_owners, slow, axis=1),
        mean_min=np.minimum.reduce([p.mean_min for p in parts]),
        sketch=merge_sketches([p.sketch for p in parts], n_ranks),
        gain_baseline=first.gain_baseline,
        gain_exact=all(p.gain_exact for p in parts) and first.gain_baseline != "cohort_median",
        quantum_ns=min((p.quantum_ns for p in parts if p.quantum_ns), default=0),
        rounding_s=max(p.rounding_s for p in parts),
    )


def _merged_runs(runs: IntArray) -> IntArray:
    """Runs of disjoint groups as one sorted list of runs, touching runs joined; raises
    SummaryError when two groups share a rank."""
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    ends = runs[:, 0] + runs[:, 1]
    clash = np.flatnonzero(runs[1:, 0] < ends[:-1])
    if clash.size:
        rank = int(runs[clash[0] + 1, 0])
        raise SummaryError(f"rank groups overlap: rank(s) [{rank}] are in more than one summary")
    heads = np.concatenate([[0], np.flatnonzero(runs[1:, 0] != ends[:-1]) + 1])
    return np.stack([runs[heads, 0], np.add.reduceat(runs[:, 1], heads)], axis=1)


def _check_settings(top_k: int, gain_baseline: str, growth: float, max_buckets: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 2:
        raise SummaryError(f"top_k must be an integer >= 2, got {top_k!r}")
    if gain_baseline not in GAIN_BASELINES:
        raise SummaryError(
            f"unknown gain_baseline {gain_baseline!r}; choose one of {', '.join(GAIN_BASELINES)}"
        )
    check_settings(growth, max_buckets)


def _checked_reference(reference: Any, baseline: str, r: int, s: int) -> FloatArray | None:
    if baseline != "reference":
        if reference is not None:
            raise SummaryError("a reference is only used with gain_baseline='reference'")
        return None
    ref = np.asarray(reference, dtype=np.float64) if reference is not None else None
    if ref is None or ref.shape not in ((s,), (r, s)):
        raise SummaryError(
            f"gain_baseline='reference' needs a reference of shape [S]={(s,)} or [R, S]={(r, s)}"
        )
    if not (np.isfinite(ref).all() and (ref >= 0).all()):
        raise SummaryError("the reference durations must be finite and >= 0")
    return ref


def _check_compatible(parts: Sequence[WindowSummary]) -> None:
    first = parts[0]
    for i, p in enumerate(parts[1:], start=1):
        facts = (
            ("stages", p.stages, first.stages),
            ("steps", p.n_steps, first.n_steps),
            ("top_k", p.top_k, first.top_k),
            ("gain baseline", p.gain_baseline, first.gain_baseline),
            ("sketch growth", p.sketch.growth, first.sketch.growth),
            ("sketch buckets", p.sketch.max_buckets, first.sketch.max_buckets),
        )
        for what, mine, theirs in facts:
            if mine != theirs:
                raise SummaryError(
                    f"summary {i} has {what} {mine!r}, summary 0 has {theirs!r}: "
                    "only summaries of the same window and settings combine"
                )
