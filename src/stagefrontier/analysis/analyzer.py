"""``analyze``: one window of ``[steps, ranks, stages]`` durations in, one WindowReport out.

This is the only analysis path: live windows, evidence packets and reduced profiler traces all
end here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import RolesError, SideEvidenceError
from .accounting import FloatArray, advances_from_frontier, as_window
from .evidence import compute_evidence
from .gates import Gates
from .labels import LabelInputs, label_window
from .routing import rank_order, routing_set
from .schema import (
    RESIDUAL_STAGE,
    SCHEMA_VERSION,
    check_stage_names,
    semantic_stage,
    stage_order_hash,
)
from .semantic import semantic_view
from .side import SideEvidence
from .window_report import WindowReport

DEFAULT_GATES = Gates()
NO_SIDE_EVIDENCE = SideEvidence()


def analyze(
    d: Any,
    stages: Iterable[str],
    *,
    gates: Gates | None = None,
    roles: Sequence[str] | None = None,
    side: SideEvidence | None = None,
) -> WindowReport:
    """Frontier accounting, localization and labels for one window.

    Args:
        d: durations in seconds, array-like ``[N steps, R ranks, S stages]``.
        stages: the ``S`` ordered stage names (a list, tuple or other ordered iterable;
            a set is refused).
        gates: labeler thresholds; ``Gates()`` by default.
        roles: optional role per rank (e.g. pipeline stage). Mixed roles give
            ``role_aware_needed`` and per-role shares instead of a global attribution:
            ``top1``, ``top2`` and ``routing_set`` stay empty.
        side: optional side evidence (CUDA-event samples, accumulation, telemetry errors).

    Raises:
        StageFrontierError subclasses for malformed input, each naming the problem.
    """
    names = check_stage_names(stages)  # once: a generator is read a single time
    arr = as_window(d, names)
    n, r, s = arr.shape
    gates = gates or DEFAULT_GATES
    role_list = _check_roles(roles, r)
    side = (side or NO_SIDE_EVIDENCE).checked(n, r, s)
    if gates.gain_baseline == "reference" and side.no_stall_reference_s is None:
        raise SideEvidenceError("gain_baseline='reference' needs side.no_stall_reference_s")

    ev, prefix = compute_evidence(arr, gates, side)
    view = semantic_view(arr, prefix, ev, names, gates, side)
    residual = ev.shares[names.index(RESIDUAL_STAGE)] if RESIDUAL_STAGE in names else 0.0
    wall = float(prefix[:, -1, :].sum()) - side.overlap_error_s
    overlap = side.overlap_error_s / wall if wall > 0 else 0.0
    labeling = label_window(
        LabelInputs(
            stages=view.stages,
            d=view.d,
            prefix=prefix,  # over the substages: the labeler reads only its rank totals
            evidence=view.evidence,
            gates=gates,
            side=side,
            roles=role_list,
            residual_share=float(residual),
            overlap_share=overlap,
        )
    )
    broad = view.evidence
    labels = labeling.ordered()
    # Ranks in different roles: a global ranking of stages is unsafe, only role_shares stand.
    ranked = "role_aware_needed" not in labels
    scores = broad.shares if broad.shares_defined else broad.advance_totals
    # Only a stage that advanced the frontier can be a top stage: none when nothing is exposed.
    order = [i for i in rank_order(scores) if scores[i] > 0] if ranked else []
    stage_dict, broad_dict = _per_stage(names), _per_stage(view.stages)
    return WindowReport(
        stages=list(names),
        n_steps=n,
        n_ranks=r,
        schema_version=SCHEMA_VERSION,
        stage_order_hash=stage_order_hash(names),
        exposed_s=ev.exposed_s,
        shares_defined=ev.shares_defined,
        shares=stage_dict(ev.shares),
        advances=stage_dict(ev.advance_totals),
        direct_gain=stage_dict(ev.gain),
        top1=view.stages[order[0]] if order else None,
        top2=view.stages[order[1]] if len(order) > 1 else None,
        routing_set=routing_set(broad.shares, view.stages, gates.candidate_threshold)
        if broad.shares_defined and ranked
        else [],
        labels=labels,
        reasons=labeling.reasons,
        co_critical_stages=labeling.co_critical_stages,
        leaders={name: loc.leader_rank for name, loc in zip(names, ev.localization, strict=True)},
        localization=dict(zip(names, ev.localization, strict=True)),
        semantic_shares=broad_dict(broad.shares),
        semantic_gain=broad_dict(broad.gain),
        semantic_localization=dict(zip(view.stages, broad.localization, strict=True)),
        residual_share=float(residual),
        overlap_share=overlap,
        roles=role_list,
        role_shares=_role_shares(prefix, names, role_list, gates),
        forward_event=labeling.forward_event,
        gates=gates,
    )


def _per_stage(names: Sequence[str]) -> Any:
    def to_dict(values: FloatArray) -> dict[str, float]:
        return {name: float(v) for name, v in zip(names, values, strict=True)}

    return to_dict


def _check_roles(roles: Sequence[str] | None, n_ranks: int) -> list[str] | None:
    if roles is None:
        return None
    if isinstance(roles, str):
        raise RolesError("roles must be a sequence with one role per rank, not a single string")
    role_list = [str(x) for x in roles]
    if len(role_list) != n_ranks:
        raise RolesError(f"{len(role_list)} roles given for {n_ranks} ranks: need one per rank")
    return role_list


def _role_shares(
    prefix: FloatArray, names: Sequence[str], roles: list[str] | None, gates: Gates
) -> dict[str, dict[str, float]] | None:
    """Frontier shares computed within each role group, by broad stage: the role-aware view."""
    if roles is None or len(set(roles)) < 2:
        return None
    out = {}
    role_arr = np.array(roles)
    for role in sorted(set(roles)):
        group = prefix[:, :, role_arr == role]
        step_adv = advances_from_frontier(group.max(axis=2))
        exposed = float(step_adv.sum())
        shares = (
            step_adv.sum(axis=0) / exposed if exposed > gates.min_exposed_s else 0 * step_adv[0]
        )
        folded: dict[str, float] = {}
        for name, value in zip(names, shares, strict=True):
            stage = semantic_stage(name)
            folded[stage] = folded.get(stage, 0.0) + float(value)
        out[role] = folded
    return out
