"""``analyze``: one window of ``[steps, ranks, stages]`` durations in, one WindowReport out.

This is the only analysis path: live windows, evidence packets and reduced profiler traces all
end here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import DurationsError, SideEvidenceError, SummaryError
from .accounting import FloatArray, as_window
from .evidence import FrontierInputs, compute_evidence, window_inputs
from .gates import DEFAULT_GATES, Gates
from .labels import LabelInputs, label_window
from .roles import (
    check_roles,
    checked_rank_ids,
    group_side,
    renumbered,
    role_groups,
    wall_fractions,
)
from .routing import rank_order, routing_set
from .schema import RESIDUAL_STAGE, SCHEMA_VERSION, check_stage_names, stage_order_hash
from .semantic import semantic_view, substage_groups
from .side import SideEvidence
from .summary import WindowSummary
from .window_report import WindowReport

NO_SIDE_EVIDENCE = SideEvidence()


def analyze(
    d: Any,
    stages: Iterable[str],
    *,
    gates: Gates | None = None,
    roles: Sequence[str] | None = None,
    side: SideEvidence | None = None,
    rank_ids: Sequence[int] | None = None,
) -> WindowReport:
    """Frontier accounting, localization and labels for one window.

    Args:
        d: durations in seconds, array-like ``[N steps, R ranks, S stages]``.
        stages: the ``S`` ordered stage names (a list, tuple or other ordered iterable;
            a set is refused).
        gates: labeler thresholds; ``Gates()`` by default.
        roles: optional role per rank (e.g. pipeline stage; ``None`` or ``""`` where unknown).
            Mixed roles give ``role_aware_needed`` and no global attribution (``top1``, ``top2``
            and ``routing_set`` stay empty); instead ``role_reports`` holds one full report per
            role, each this same analysis on that role's ranks, with ranks numbered as in ``d``.
        side: optional side evidence (CUDA-event samples, accumulation, telemetry errors, the
            job's full role set).
        rank_ids: the rank number of each column of ``d`` (distinct, >= 0), for a window that
            holds some ranks of a job (a trace of ranks 2 and 0, a window a rank did not reach):
            leaders, tie sets and reasons name these numbers. Default ``0 .. R-1``.

    Raises:
        StageFrontierError: malformed input (a specific subclass, naming the problem).
    """
    names = check_stage_names(stages)  # once: a generator is read a single time
    arr = as_window(d, names)
    n, r, s = arr.shape
    side = (side or NO_SIDE_EVIDENCE).checked(n, r, s)
    role_list = check_roles(roles, r, side.expected_roles)
    ranks = list(range(r)) if rank_ids is None else checked_rank_ids(rank_ids, r, DurationsError)
    return _analyze(arr, names, gates or DEFAULT_GATES, role_list, side, [int(x) for x in ranks])


def _analyze(
    arr: FloatArray,
    names: tuple[str, ...],
    gates: Gates,
    role_list: list[str] | None,
    side: SideEvidence,
    ranks: list[int],
) -> WindowReport:
    """``analyze`` on a checked window whose rank positions stand for ``ranks`` of a larger
    window (the identity, except for a role's report)."""
    n = arr.shape[0]
    if gates.gain_baseline == "reference" and side.no_stall_reference_s is None:
        raise SideEvidenceError("gain_baseline='reference' needs side.no_stall_reference_s")

    inputs = window_inputs(arr, gates, side, substage_groups(names))
    # a mixed window: the same analysis on each role's ranks alone
    groups = role_groups(role_list)
    walls = wall_fractions(arr, groups) if groups else {}
    role_reports = {
        role: _analyze(
            arr[:, cols, :],
            names,
            gates,
            None,
            group_side(side, cols, walls[role]),
            [ranks[c] for c in cols],
        )
        for role, cols in groups.items()
    } or None
    return report_from_inputs(
        inputs, names, n, gates, side, ranks, d=arr, roles=role_list, role_reports=role_reports
    )


def analyze_summary(
    summary: WindowSummary,
    *,
    gates: Gates | None = None,
    side: SideEvidence | None = None,
    role_summaries: Mapping[str, WindowSummary] | None = None,
) -> WindowReport:
    """The report of a (combined) window summary: the same fields as ``analyze``, from the same
    evidence core, with ranks numbered as the summary numbers them.

    ``role_summaries`` (the summaries of each role's ranks, combined across nodes) make a mixed
    window as ``analyze`` does with ``roles``: ``role_aware_needed`` and one report per role,
    each from its role's summary; ``roles`` stays None (no per-rank list), ranks of no role
    are in no role report, and a role's report has no CUDA-event evidence (its node totals
    are not split by role).

    What a summary knows only approximately is said in the report: each stage's
    ``lag_error_bound_s`` and ``tie_truncated_steps``, a ``frontier_accounting`` reason for
    each, and ``telemetry_limited`` when cohort-median gains of several groups were merged.
    ``side`` may carry collection facts (missing ranks, notes, overlap error), not per-rank
    arrays: a summary has no event samples, and its reference is applied when it is built.

    Raises:
        SummaryError: the gates ask for another gain baseline than the summary was built with.
        SideEvidenceError: side evidence with per-rank arrays or a reference.
    """
    gates = gates or DEFAULT_GATES
    if gates.gain_baseline != summary.gain_baseline:
        raise SummaryError(
            f"the summary's direct gains were computed against {summary.gain_baseline!r}; "
            f"the gates ask for {gates.gain_baseline!r}: summarize with that baseline"
        )
    side = side or NO_SIDE_EVIDENCE
    if side.event_ms is not None or side.no_stall_reference_s is not None:
        raise SideEvidenceError(
            "a summary carries no per-rank arrays: event samples and a reference belong to "
            "the rank windows it was built from"
        )
    side = side.checked(summary.n_steps, summary.n_ranks, len(summary.stages))
    if not summary.gain_exact:
        side = replace(
            side,
            notes=(
                *side.notes,
                "direct gains are approximate: cohort medians of several rank groups were "
                "merged, each group clipped to its own median",
            ),
        )
    inputs = summary.frontier_inputs()
    roles = dict(sorted((role_summaries or {}).items()))
    if len(roles) < 2:
        return report_from_inputs(inputs, summary.stages, summary.n_steps, gates, side, None)
    total = summary.rank_total_sum_s
    role_reports = {
        role: analyze_summary(
            part,
            gates=gates,
            side=replace(
                side,
                event_totals=None,
                expected_roles=(),
                overlap_error_s=side.overlap_error_s * part.rank_total_sum_s / total
                if total > 0
                else 0.0,
            ),
        )
        for role, part in roles.items()
    }
    return report_from_inputs(
        inputs,
        summary.stages,
        summary.n_steps,
        gates,
        side,
        None,
        role_reports=role_reports,
        label_roles=list(roles),
    )


def report_from_inputs(
    inputs: FrontierInputs,
    names: tuple[str, ...],
    n: int,
    gates: Gates,
    side: SideEvidence,
    ranks: Sequence[int] | None,
    *,
    d: FloatArray | None = None,
    roles: list[str] | None = None,
    role_reports: dict[str, WindowReport] | None = None,
    label_roles: list[str] | None = None,
) -> WindowReport:
    """The report of one window from its reduced inputs: the one path after the reduction,
    for a whole window (``d`` given, ``ranks`` mapping its positions) and for a summary (rank
    numbers already global, ``ranks`` None; ``label_roles``: the roles of its role summaries,
    which the labels read in place of a per-rank list)."""
    ev = compute_evidence(inputs, gates, names)
    if ranks is not None:
        ev = replace(ev, localization=[renumbered(loc, ranks) for loc in ev.localization])
    view = semantic_view(ev, names, d)
    residual = ev.shares[names.index(RESIDUAL_STAGE)] if RESIDUAL_STAGE in names else 0.0
    wall = inputs.rank_total_sum_s - side.overlap_error_s
    overlap = side.overlap_error_s / wall if wall > 0 else 0.0
    labeling = label_window(
        LabelInputs(
            stages=view.stages,
            n_steps=n,
            n_ranks=inputs.n_ranks,
            d=view.d,
            evidence=view.evidence,
            gates=gates,
            side=side,
            roles=roles if label_roles is None else label_roles,
            residual_share=float(residual),
            overlap_share=overlap,
            ranks=ranks,
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
        n_ranks=inputs.n_ranks,
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
        roles=roles,
        role_shares=None
        if role_reports is None
        else {role: rep.semantic_shares for role, rep in role_reports.items()},
        role_reports=role_reports,
        forward_event=labeling.forward_event,
        gates=gates,
    )


def _per_stage(names: Sequence[str]) -> Any:
    def to_dict(values: FloatArray) -> dict[str, float]:
        return {name: float(v) for name, v in zip(names, values, strict=True)}

    return to_dict
