"""Vectorized window evidence: frontier, localization (leaders, ties, lag) and direct-exposure gain.

Everything here is numeric and label-free; ``labels.py`` turns it into claims. The whole window is
computed with a handful of passes over two ``[N, S, R]`` buffers (the prefixes and one scratch
buffer that is reused for every sort), so memory stays within a small multiple of the input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .accounting import FloatArray, advances_from_frontier, rank_last_prefixes
from .gates import Gates
from .side import SideEvidence


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


def compute_evidence(
    d: FloatArray, gates: Gates, side: SideEvidence | None
) -> tuple[WindowEvidence, FloatArray]:
    """All numeric evidence for one validated window ``d [N, R, S]``.

    Returns the evidence and the rank-last prefixes (kept for the critical-path fallback).
    """
    n, r, s = d.shape
    prefix = rank_last_prefixes(d)
    front = prefix.max(axis=2)
    step_exposed = front[:, -1]
    step_adv = advances_from_frontier(front)
    totals = step_adv.sum(axis=0)
    exposed = float(step_exposed.sum())
    defined = exposed > gates.min_exposed_s
    shares = totals / exposed if defined else np.zeros(s)

    scratch = np.empty((n, s, r), dtype=np.float64)
    localization = _localize(prefix, front, step_adv, gates, scratch)
    gain = _direct_gain(d, prefix[:, -1, :], step_exposed, exposed, defined, gates, side, scratch)
    evidence = WindowEvidence(
        step_exposed_s=step_exposed,
        step_advances=step_adv,
        advance_totals=totals,
        shares=shares,
        shares_defined=defined,
        exposed_s=exposed,
        gain=gain,
        localization=localization,
    )
    return evidence, prefix


def _localize(
    prefix: FloatArray, front: FloatArray, step_adv: FloatArray, gates: Gates, scratch: FloatArray
) -> list[StageLocalization]:
    n, s, r = prefix.shape
    leader = prefix.argmax(axis=2)
    threshold = front - (gates.leader_tie * front[:, -1])[:, None]  # [N, S]: the tie cut-off

    np.copyto(scratch, prefix)
    scratch.sort(axis=2)
    lag = front - _sorted_median(scratch)
    delta_lag = np.diff(lag, axis=1, prepend=0.0)
    if r > 1:
        second = scratch[:, :, -2]
        unique = second < threshold  # only the leader is within the tolerance
        gap_means: list[float | None] = (front - second).mean(axis=0).tolist()
        shared = prefix >= threshold[:, :, None]
        shared &= ~unique[:, :, None]
        tie_counts = np.count_nonzero(shared, axis=0)  # [S, R]: steps each rank shared the lead
    else:
        unique = np.ones((n, s), dtype=bool)
        gap_means = [None] * s
        tie_counts = np.zeros((s, r), dtype=np.intp)
    lag_means = lag.mean(axis=0).tolist()
    delta_means = delta_lag.mean(axis=0).tolist()
    stage_totals = step_adv.sum(axis=0).tolist()

    # Per stage and rank: how much of the stage's advance, and how many steps, it led alone.
    cells = (np.arange(s) * r + leader)[unique]
    weights = np.bincount(cells, weights=step_adv[unique], minlength=s * r).reshape(s, r)
    counts = np.bincount(cells, minlength=s * r).reshape(s, r)
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

    out = []
    for j in range(s):
        sequence = leader[unique[:, j], j]
        order = tie_order[j]
        strongest = strength_order[j]
        out.append(
            StageLocalization(
                leader_rank=leads[j] if confident_steps[j] else None,
                leader_fraction=led[j] / stage_totals[j] if stage_totals[j] > 0 else 0.0,
                confident_steps=confident_steps[j],
                leader_switches=int(np.count_nonzero(sequence[1:] != sequence[:-1])),
                tied_ranks=order[tie_counts[j][order] > 0].tolist(),
                lag_mean_s=lag_means[j],
                delta_lag_mean_s=delta_means[j],
                gap_mean_s=gap_means[j],
                leading_ranks=strongest[leading[j][strongest]].tolist(),
            )
        )
    return out


def _direct_gain(
    d: FloatArray,
    rank_totals: FloatArray,
    step_exposed: FloatArray,
    exposed: float,
    defined: bool,
    gates: Gates,
    side: SideEvidence | None,
    scratch: FloatArray,
    groups: Sequence[Sequence[int]] | None = None,
) -> FloatArray:
    """``G_s``: the exposed time removed when stage ``s`` is clipped to its baseline.

    With the clipped baseline ``b = min(d, b~)`` the recomputed step time is
    ``max_r (P[t, r, S] - max(d[t, r, s] - b~, 0))``, one reduction over ranks per stage.
    With ``groups`` (lists of stage indices), one gain per group: all its stages are clipped at
    once, as when a stage repeated in every accumulation microstep is fixed.
    """
    n, r, s = d.shape
    if not defined:
        return np.zeros(s if groups is None else len(groups))
    by_rank = d.transpose(0, 2, 1)  # [N, S, R] view
    if gates.gain_baseline == "rank_median":
        per_rank = scratch.reshape(r, s, n)
        np.copyto(per_rank, d.transpose(1, 2, 0))
        per_rank.sort(axis=2)
        baseline = _sorted_median(per_rank).T[None, :, :]  # [1, S, R]
    elif gates.gain_baseline == "cohort_median":
        np.copyto(scratch, by_rank)
        scratch.sort(axis=2)
        baseline = _sorted_median(scratch)[:, :, None]  # [N, S, 1]
    else:
        if side is None or side.no_stall_reference_s is None:
            # The analyzer checks this before computing; kept as a guard for direct callers.
            raise ValueError("gain_baseline='reference' needs side.no_stall_reference_s")
        ref = np.asarray(side.no_stall_reference_s, dtype=np.float64)
        baseline = (ref[:, None] if ref.ndim == 1 else ref.T)[None, :, :]
    np.subtract(by_rank, baseline, out=scratch)
    np.maximum(scratch, 0.0, out=scratch)  # [N, S, R]: the time clipping removes per stage
    if groups is not None:  # clip every member of a group together
        excess = np.stack([scratch[:, members, :].sum(axis=1) for members in groups], axis=1)
        counterfactual = (rank_totals[:, None, :] - excess).max(axis=2)
    else:
        np.subtract(rank_totals[:, None, :], scratch, out=scratch)
        counterfactual = scratch.max(axis=2)  # [N, S]
    return np.asarray((step_exposed[:, None] - counterfactual).sum(axis=0) / exposed)


def group_gain(
    d: FloatArray,
    prefix: FloatArray,
    evidence: WindowEvidence,
    gates: Gates,
    side: SideEvidence | None,
    groups: Sequence[Sequence[int]],
) -> FloatArray:
    """Direct gain of each group of stages, every member clipped to its baseline at once."""
    n, r, s = d.shape
    scratch = np.empty((n, s, r), dtype=np.float64)
    return _direct_gain(
        d,
        prefix[:, -1, :],
        evidence.step_exposed_s,
        evidence.exposed_s,
        evidence.shares_defined,
        gates,
        side,
        scratch,
        groups,
    )


def _sorted_median(sorted_lanes: FloatArray) -> FloatArray:
    k = sorted_lanes.shape[-1]
    if k % 2:
        return np.asarray(sorted_lanes[..., k // 2])
    return np.asarray(0.5 * (sorted_lanes[..., k // 2 - 1] + sorted_lanes[..., k // 2]))


def critical_path_stages(
    d: FloatArray, prefix: FloatArray, step_exposed: FloatArray, gates: Gates
) -> FloatArray:
    """Fraction of exposed time carried by each stage along the ranks that end a step last.

    A rank whose total is within the tie tolerance of ``F[t, S]`` is critical in step ``t``; its
    largest stage is the path it reached the frontier by. Each step's exposed time is split evenly
    among its critical ranks. Used when the gains cannot separate co-critical paths.
    """
    n, r, s = d.shape
    totals = prefix[:, -1, :]  # [N, R]
    critical = totals >= (step_exposed - gates.leader_tie * step_exposed)[:, None]
    per_rank_weight = step_exposed / np.maximum(critical.sum(axis=1), 1)
    dominant = d.argmax(axis=2)  # [N, R]
    weights = np.broadcast_to(per_rank_weight[:, None], (n, r))[critical]
    carried = np.bincount(dominant[critical], weights=weights, minlength=s)
    total = float(step_exposed.sum())
    return carried / total if total > 0 else np.zeros(s)
