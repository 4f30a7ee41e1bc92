"""Window evidence: frontier, localization (leaders, ties, lag) and direct-exposure gain.

Everything here is numeric and label-free; ``labels.py`` turns it into claims. The evidence is
computed from ``FrontierInputs``, the few per-step quantities that rank groups combine by max or
sum (the largest prefixes with their ranks, the clipped step times of the gain, rank totals),
plus the median prefix, which is exact for a whole window and bounded for a merged summary.
A whole window is reduced to these inputs first (``window_inputs``); a merged node summary
(``summary.WindowSummary``) yields the same inputs, so both run the one ``compute_evidence``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .accounting import FloatArray, advances_from_frontier, rank_last_prefixes
from .gain import clipped_step_times, direct_gain
from .gates import Gates
from .order_stats import partitioned_median, second_largest
from .side import SideEvidence

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class StageLocalization:
    """Which rank sets the frontier at one stage boundary, and how clearly, over a window."""

    leader_rank: int | None
    """Rank that most often leads the boundary uniquely, weighted by the stage's advance."""
    leader_fraction: float
    """Fraction of the stage's advance in steps this rank led uniquely."""
    confident_steps: int
    """Steps where exactly one rank was within the tie tolerance of the frontier."""
    leader_switches: int
    """Changes of leader between consecutive confident steps."""
    tied_ranks: list[int]
    """Ranks that shared the lead (tie set larger than one) in some step, most frequent first."""
    lag_mean_s: float
    """Mean over steps of ``max_r P - median_r P`` at this boundary."""
    delta_lag_mean_s: float
    """Mean lag growth within this stage (lag here minus lag at the previous boundary)."""
    gap_mean_s: float | None
    """Mean gap between the leading and the second prefix; None with a single rank."""
    leading_ranks: list[int] = field(default_factory=list)
    """Ranks that led this boundary alone for at least ``gates.leading_rank_fraction`` of its
    uniquely led advance, or shared the lead in at least that fraction of steps; strongest
    first."""
    lag_error_bound_s: float = 0.0
    """Bound on the error of ``lag_mean_s`` and ``delta_lag_mean_s``: zero for a whole window,
    the median sketch's bound for a merged summary."""
    tie_truncated_steps: int = 0
    """Steps where a merged summary kept only its top-k prefixes and the k-th was still within
    the tie tolerance: the tie set (``tied_ranks``, ``leading_ranks``) may miss ranks there."""


@dataclass(frozen=True)
class FrontierInputs:
    """The reduced window the evidence is computed from; ``K`` lane entries per step and boundary.

    A whole window keeps every rank in rank order (``K = R``); a summary keeps each lane's ``K``
    largest prefixes, largest first, equal values in rank order. Either way the first largest
    entry of a lane is its leader.
    """

    n_ranks: int
    rank_runs: IntArray
    """``[U, 2]`` the rank numbers covered, as ascending runs of (first rank, length)."""
    lanes: FloatArray
    """``[N, S, K]`` rank-last prefixes ``P[t, s, r]``."""
    lane_ranks: IntArray
    """``[N, S, K]`` the rank of each lane entry."""
    second: FloatArray
    """``[N, S]`` the second largest prefix (any value with one rank)."""
    median: FloatArray
    """``[N, S]`` the median prefix over ranks."""
    median_bound_s: FloatArray
    """``[N, S]`` bound on the error of ``median``; zeros when it is exact."""
    dominant: IntArray
    """``[N, K]`` the largest broad stage of each rank in ``lanes[:, -1, :]`` (read only where
    ``critical_ranks`` holds; a whole window fills in just those)."""
    clipped: FloatArray
    """``[N, S]`` the step time with one stage clipped to its baseline (see ``gain``)."""
    group_clipped: FloatArray | None
    """``[N, G]`` the same with all substages of a broad stage clipped; None without substages."""
    rank_total_sum_s: float
    """Sum over steps and ranks of the rank step totals ``P[t, r, S]``."""

    @property
    def ranks(self) -> IntArray:
        """Every rank number covered, ascending (``O(R)``: only for whole windows and the
        rare gates that list every rank)."""
        return expand_runs(self.rank_runs)

    @property
    def complete(self) -> bool:
        """Every rank's prefix is in the lanes."""
        return bool(self.lanes.shape[2] >= self.n_ranks)


def window_inputs(
    d: FloatArray,
    gates: Gates,
    side: SideEvidence | None,
    groups: Sequence[Sequence[int]] | None = None,
) -> FrontierInputs:
    """A validated window ``d [N, R, S]`` reduced to the evidence inputs, with every rank kept.

    ``groups`` lists the substages of each broad stage when the schema has accumulation
    substages. Two ``[N, S, R]`` buffers are used: the prefixes and one scratch buffer.
    """
    n, r, s = d.shape
    prefix = rank_last_prefixes(d)
    scratch = np.empty((n, s, r), dtype=np.float64)
    np.copyto(scratch, prefix)
    median = partitioned_median(scratch)  # the scratch buffer is reused below
    second = second_largest(scratch) if r > 1 else np.zeros((n, s))
    totals = prefix[:, -1, :]
    critical = critical_ranks(totals, totals.max(axis=1), gates)
    dominant = np.zeros((n, r), dtype=np.int64)
    dominant[critical] = dominant_stages(d[critical], groups)
    ref = None if side is None else side.no_stall_reference_s
    clipped, group_clipped = clipped_step_times(
        d, totals, gates.gain_baseline, ref, groups, scratch
    )
    all_ranks = np.arange(r, dtype=np.int64)
    return FrontierInputs(
        n_ranks=r,
        rank_runs=np.array([[0, r]], dtype=np.int64),
        lanes=prefix,
        lane_ranks=np.broadcast_to(all_ranks, (n, s, r)),
        second=second,
        median=median,
        median_bound_s=np.zeros((n, s)),
        dominant=dominant,
        clipped=clipped,
        group_clipped=group_clipped,
        rank_total_sum_s=float(totals.sum()),
    )


def rank_runs(ranks: IntArray) -> IntArray:
    """Ascending rank numbers as ``[U, 2]`` runs of (first rank, length): a node's ranks, or a
    merge of whole nodes, are a few runs whatever their count."""
    if ranks.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(ranks) != 1) + 1])
    lengths = np.diff(np.concatenate([starts, [ranks.size]]))
    return np.stack([ranks[starts], lengths], axis=1).astype(np.int64)


def expand_runs(runs: IntArray) -> IntArray:
    """The rank numbers of ``[U, 2]`` runs, ascending."""
    lengths = runs[:, 1]
    offsets = np.repeat(runs[:, 0] - np.cumsum(lengths) + lengths, lengths)
    return np.asarray(offsets + np.arange(offsets.size), dtype=np.int64)


def critical_ranks(totals: FloatArray, step_exposed: FloatArray, gates: Gates) -> FloatArray:
    """``[N, K]``: whether each rank total is within the tie tolerance of its step's exposed
    time (the rank ends the step on the frontier)."""
    return np.asarray(totals >= (step_exposed - gates.leader_tie * step_exposed)[:, None])


def dominant_stages(d: FloatArray, groups: Sequence[Sequence[int]] | None) -> IntArray:
    """The largest broad stage of each row of durations ``d [..., S]``."""
    broad = d if groups is None else np.stack([d[..., m].sum(axis=-1) for m in groups], axis=-1)
    return np.asarray(broad.argmax(axis=-1), dtype=np.int64)


@dataclass(frozen=True)
class WindowEvidence:
    step_exposed_s: FloatArray  # [N] F[t, S]
    step_advances: FloatArray  # [N, S]
    advance_totals: FloatArray  # [S] sum_t a[t, s]
    shares: FloatArray  # [S]
    shares_defined: bool
    exposed_s: float
    gain: FloatArray  # [S] G_s
    localization: list[StageLocalization]
    broad_gain: FloatArray  # [G] the gain of each broad stage, its substages clipped at once
    critical_path: FloatArray  # [G] exposed time carried along the ranks that end steps last
    notes: tuple[str, ...] = ()
    """What is approximate in this evidence (merged summaries only), one sentence each."""


def compute_evidence(inputs: FrontierInputs, gates: Gates, stages: Sequence[str]) -> WindowEvidence:
    """All numeric evidence of one window from its reduced inputs."""
    front = inputs.lanes.max(axis=2)
    step_exposed = front[:, -1]
    step_adv = advances_from_frontier(front)
    totals = step_adv.sum(axis=0)
    exposed = float(step_exposed.sum())
    defined = exposed > gates.min_exposed_s
    s = front.shape[1]
    shares = totals / exposed if defined else np.zeros(s)
    localization, truncated = _localize(inputs, front, step_adv, gates)
    gain = direct_gain(step_exposed, inputs.clipped, exposed) if defined else np.zeros(s)
    broad = inputs.clipped if inputs.group_clipped is None else inputs.group_clipped
    n_broad = broad.shape[1]
    broad_gain = direct_gain(step_exposed, broad, exposed) if defined else np.zeros(n_broad)
    return WindowEvidence(
        step_exposed_s=step_exposed,
        step_advances=step_adv,
        advance_totals=totals,
        shares=shares,
        shares_defined=defined,
        exposed_s=exposed,
        gain=gain,
        localization=localization,
        broad_gain=broad_gain,
        critical_path=_critical_path(inputs, step_exposed, gates, n_broad),
        notes=_approximation_notes(inputs, localization, truncated, stages),
    )


def _localize(
    x: FrontierInputs, front: FloatArray, step_adv: FloatArray, gates: Gates
) -> tuple[list[StageLocalization], FloatArray]:
    n, s, _ = x.lanes.shape
    r = x.n_ranks
    first = x.lanes.argmax(axis=2)[:, :, None]
    leader = np.take_along_axis(x.lane_ranks, first, axis=2)[:, :, 0]  # [N, S] rank numbers
    threshold = front - (gates.leader_tie * front[:, -1])[:, None]  # [N, S]: the tie cut-off

    lag = front - x.median
    delta_lag = np.diff(lag, axis=1, prepend=0.0)
    bound = x.median_bound_s.mean(axis=0)
    lag_bounds = (bound + np.concatenate([[0.0], bound[:-1]])).tolist()
    if r > 1:
        unique = x.second < threshold  # only the leader is within the tolerance
        gap_means: list[float | None] = (front - x.second).mean(axis=0).tolist()
        shared = x.lanes >= threshold[:, :, None]
        shared &= ~unique[:, :, None]
    else:
        unique = np.ones((n, s), dtype=bool)
        gap_means = [None] * s
        shared = np.zeros(x.lanes.shape, dtype=bool)
    # A kept lane whose smallest entry is still tied may have lost tied ranks to truncation.
    truncated = np.zeros((n, s), dtype=bool)
    if not x.complete:
        truncated = (x.lanes.min(axis=2) >= threshold) & ~unique
    lag_means = lag.mean(axis=0).tolist()
    delta_means = delta_lag.mean(axis=0).tolist()
    stage_totals = step_adv.sum(axis=0).tolist()

    # Ranks are counted over a universe of rank numbers: every covered rank when the lanes
    # hold them all (or a zero fraction makes every rank a leading rank), else only those
    # that ever lead alone or share a lead, so a merged summary costs nothing per rank.
    stage_of = np.broadcast_to(np.arange(s), (n, s))
    tie_stage = np.broadcast_to(np.arange(s)[None, :, None], x.lanes.shape)[shared]
    tie_rank = x.lane_ranks[shared]
    if x.complete or gates.leading_rank_fraction <= 0:
        universe = x.ranks
    else:
        universe = np.unique(np.concatenate([leader[unique], tie_rank]))
    if universe.size == 0:
        universe = x.rank_runs[:1, 0]
    u = universe.size
    cells = (stage_of * u + _positions(universe, leader))[unique]
    weights = np.bincount(cells, weights=step_adv[unique], minlength=s * u).reshape(s, u)
    counts = np.bincount(cells, minlength=s * u).reshape(s, u)
    tie_cells = tie_stage * u + _positions(universe, tie_rank)
    tie_counts = np.bincount(tie_cells, minlength=s * u).reshape(s, u)
    leads = np.where(weights.any(axis=1), weights.argmax(axis=1), counts.argmax(axis=1)).tolist()
    led = weights[np.arange(s), leads].tolist()
    confident_steps = counts.sum(axis=1).tolist()
    tie_order = np.argsort(-tie_counts, axis=1, kind="stable")
    led_total = weights.sum(axis=1, keepdims=True)
    lead_score = np.divide(weights, led_total, out=np.zeros(weights.shape), where=led_total > 0)
    tie_score = tie_counts / max(n, 1)
    leading = (lead_score >= gates.leading_rank_fraction) | (
        tie_score >= gates.leading_rank_fraction
    )
    strength_order = np.argsort(-(lead_score + tie_score), axis=1, kind="stable")
    truncated_steps = truncated.sum(axis=0).tolist()

    out = []
    for j in range(s):
        sequence = leader[unique[:, j], j]
        order = tie_order[j]
        strongest = strength_order[j]
        out.append(
            StageLocalization(
                leader_rank=int(universe[leads[j]]) if confident_steps[j] else None,
                leader_fraction=led[j] / stage_totals[j] if stage_totals[j] > 0 else 0.0,
                confident_steps=confident_steps[j],
                leader_switches=int(np.count_nonzero(sequence[1:] != sequence[:-1])),
                tied_ranks=universe[order[tie_counts[j][order] > 0]].tolist(),
                lag_mean_s=lag_means[j],
                delta_lag_mean_s=delta_means[j],
                gap_mean_s=gap_means[j],
                leading_ranks=universe[strongest[leading[j][strongest]]].tolist(),
                lag_error_bound_s=lag_bounds[j],
                tie_truncated_steps=int(truncated_steps[j]),
            )
        )
    return out, truncated


def _positions(universe: IntArray, ranks: IntArray) -> IntArray:
    """Where ``ranks`` sit in the ascending ``universe`` (the ranks themselves when the
    universe is ``0..u-1``, as for a whole window)."""
    if universe[0] == 0 and universe[-1] == universe.size - 1:
        return ranks
    return np.asarray(np.searchsorted(universe, ranks), dtype=np.int64)


def _critical_path(
    x: FrontierInputs, step_exposed: FloatArray, gates: Gates, n_broad: int
) -> FloatArray:
    """Fraction of exposed time carried by each broad stage along the ranks that end a step last.

    A rank whose total is within the tie tolerance of ``F[t, S]`` is critical in step ``t``; its
    largest stage is the path it reached the frontier by. Each step's exposed time is split evenly
    among its critical ranks. Used when the gains cannot separate co-critical paths.
    """
    totals = x.lanes[:, -1, :]  # [N, K]
    critical = critical_ranks(totals, step_exposed, gates)
    per_rank_weight = step_exposed / np.maximum(critical.sum(axis=1), 1)
    weights = np.broadcast_to(per_rank_weight[:, None], totals.shape)[critical]
    carried = np.bincount(x.dominant[critical], weights=weights, minlength=n_broad)
    total = float(step_exposed.sum())
    return carried / total if total > 0 else np.zeros(n_broad)


def _approximation_notes(
    x: FrontierInputs,
    localization: list[StageLocalization],
    truncated: FloatArray,
    stages: Sequence[str],
) -> tuple[str, ...]:
    notes = []
    if x.median_bound_s.any():
        worst = max(loc.lag_error_bound_s for loc in localization)
        notes.append(
            "lag and lag growth come from a mergeable histogram of the ranks' prefixes: each "
            f"stage's lag is within its lag_error_bound_s (at most {worst * 1e3:.3g} ms here)"
        )
    if truncated.any():
        cut = [
            f"{name} ({loc.tie_truncated_steps})"
            for name, loc in zip(stages, localization, strict=True)
            if loc.tie_truncated_steps
        ]
        notes.append(
            f"tie sets may be incomplete: more than {x.lanes.shape[2]} ranks were within the tie "
            f"tolerance of the frontier in some steps of {', '.join(cut)}; the summary keeps "
            "that many prefixes per boundary, so tied and leading ranks may miss some"
        )
    return tuple(notes)
