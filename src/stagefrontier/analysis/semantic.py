"""The semantic view of a window: accumulation substages ``name[i]`` folded into ``name``.

The frontier is taken over the expanded, accumulation-indexed stages (microsteps are not
collapsed before it); routing and labels then work on the broad stages a person fixes. Advances
and shares add exactly; a stage's direct gain clips all its substages at once; its localization
is that of the substage carrying most of its advance, with the lag growth of all its substages.
Without substages the view is the window's own evidence, unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from .accounting import FloatArray
from .evidence import StageLocalization, WindowEvidence
from .schema import semantic_stage


@dataclass(frozen=True)
class SemanticView:
    """Evidence over the broad stages, in the order they first occur in the schema."""

    stages: tuple[str, ...]
    groups: list[list[int]]
    """Indices of each broad stage's substages in the window's schema."""
    d: FloatArray | None
    """``[N, R, G]``: each broad stage's durations summed over its substages (None when the
    evidence comes from a summary, which holds no per-rank durations)."""
    evidence: WindowEvidence


def stage_groups(stages: Sequence[str]) -> tuple[tuple[str, ...], list[list[int]]]:
    """Broad stage names, first occurrence first, and the indices of their substages."""
    groups: dict[str, list[int]] = {}
    for j, name in enumerate(stages):
        groups.setdefault(semantic_stage(name), []).append(j)
    return tuple(groups), list(groups.values())


def substage_groups(stages: Sequence[str]) -> list[list[int]] | None:
    """The substages of each broad stage, or None when every stage is its own broad stage."""
    names, groups = stage_groups(stages)
    return None if len(names) == len(stages) else groups


def semantic_view(
    evidence: WindowEvidence, stages: Sequence[str], d: FloatArray | None
) -> SemanticView:
    names, groups = stage_groups(stages)
    if len(names) == len(stages):
        return SemanticView(tuple(stages), groups, d, evidence)
    folded_d = None
    if d is not None:
        folded_d = np.stack([d[:, :, members].sum(axis=2) for members in groups], axis=2)
    folded = replace(
        evidence,
        step_advances=np.stack(
            [evidence.step_advances[:, members].sum(axis=1) for members in groups], axis=1
        ),
        advance_totals=np.array([evidence.advance_totals[members].sum() for members in groups]),
        shares=np.array([evidence.shares[members].sum() for members in groups]),
        gain=evidence.broad_gain,
        localization=[_fold_localization(evidence, members) for members in groups],
    )
    return SemanticView(names, groups, folded_d, folded)


def _fold_localization(evidence: WindowEvidence, members: list[int]) -> StageLocalization:
    """The localization of the substage with the largest advance, with the lag growth of all
    (and the sum of their lag error bounds)."""
    dominant = members[int(np.argmax(evidence.advance_totals[members]))]
    growth = sum(evidence.localization[j].delta_lag_mean_s for j in members)
    bound = sum(evidence.localization[j].lag_error_bound_s for j in members)
    return replace(
        evidence.localization[dominant],
        delta_lag_mean_s=float(growth),
        lag_error_bound_s=float(bound),
    )
