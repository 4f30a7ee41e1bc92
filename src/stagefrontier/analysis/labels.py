"""The labeler: from window evidence to labels, the co-critical set and a reason for every call.

Labels sit on separate evidence axes (accounting, model fit, direct gain, device evidence,
ambiguity, role clarity, telemetry); they are not a confidence ladder. Every label that is
emitted, and every strong label that was considered but withheld, gets human-readable reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .accounting import FloatArray
from .collective_names import collective_name
from .collectives import read_collectives
from .evidence import WindowEvidence
from .forward_events import (
    FORWARD_DEVICE_SUPPORTED,
    FORWARD_EVENT_SCOPE_LIMITED,
    FORWARD_HOST_OVERHEAD_SUSPECTED,
    FORWARD_SPILLOVER_SUSPECTED,
    forward_event_labels,
)
from .gates import Gates
from .leaders import lead_switches
from .roles import UNKNOWN_ROLE
from .routing import rank_order
from .schema import semantic_stage
from .side import SideEvidence

FRONTIER_ACCOUNTING = "frontier_accounting"
LIKELY_SYNC_WAIT = "likely_sync_wait"
SYNC_WAIT_MEASURED = "sync_wait_measured"
SYNC_WAIT_DEPENDENT = "sync_wait_dependent"
DIRECT_EXPOSURE = "direct_exposure"
CO_CRITICAL = "co_critical"
GRADIENT_ACCUMULATION_AMBIGUOUS = "gradient_accumulation_ambiguous"
ROLE_AWARE_NEEDED = "role_aware_needed"
TELEMETRY_LIMITED = "telemetry_limited"

ALL_LABELS: tuple[str, ...] = (
    FRONTIER_ACCOUNTING,
    LIKELY_SYNC_WAIT,
    SYNC_WAIT_MEASURED,
    SYNC_WAIT_DEPENDENT,
    DIRECT_EXPOSURE,
    FORWARD_DEVICE_SUPPORTED,
    FORWARD_SPILLOVER_SUSPECTED,
    FORWARD_HOST_OVERHEAD_SUSPECTED,
    FORWARD_EVENT_SCOPE_LIMITED,
    CO_CRITICAL,
    GRADIENT_ACCUMULATION_AMBIGUOUS,
    ROLE_AWARE_NEEDED,
    TELEMETRY_LIMITED,
)
"""Every label, in the order reports list them."""

STRONG_LABELS = (LIKELY_SYNC_WAIT, SYNC_WAIT_DEPENDENT, DIRECT_EXPOSURE)


@dataclass
class Labeling:
    labels: set[str] = field(default_factory=set)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    co_critical_stages: list[str] = field(default_factory=list)
    forward_event: dict[str, float] | None = None

    def emit(self, label: str, reason: str) -> None:
        self.labels.add(label)
        self.reasons.setdefault(label, []).append(reason)

    def withhold(self, label: str, reason: str) -> None:
        self.reasons.setdefault(label, []).append(f"not emitted: {reason}")

    def ordered(self) -> list[str]:
        return [label for label in ALL_LABELS if label in self.labels]


@dataclass(frozen=True)
class LabelInputs:
    stages: Sequence[str]
    n_steps: int
    n_ranks: int
    d: FloatArray | None
    """The broad stages' durations ``[N, R, G]`` for the forward-event checks; None for a
    summary, which carries no per-rank durations (nor event samples)."""
    evidence: WindowEvidence
    gates: Gates
    side: SideEvidence
    roles: Sequence[str] | None
    residual_share: float
    overlap_share: float
    ranks: Sequence[int] | None = None
    """The rank number of each position (``0 .. R-1`` when None)."""


def label_window(x: LabelInputs) -> Labeling:
    """Apply the gates to one window's evidence."""
    out = Labeling()
    ev, g = x.evidence, x.gates
    n, n_ranks = x.n_steps, x.n_ranks
    order = rank_order(ev.shares)
    s1 = order[0]
    a1 = float(ev.shares[s1])

    if ev.shares_defined:
        out.emit(
            FRONTIER_ACCOUNTING,
            f"{ev.exposed_s:.6g} s exposed over {n} step(s) telescopes exactly into stage "
            f"advances; {x.stages[s1]} carries {a1:.1%}",
        )
    else:
        out.emit(
            FRONTIER_ACCOUNTING,
            f"exposed time {ev.exposed_s:.3g} s is at or below the {g.min_exposed_s:g} s floor: "
            "shares are undefined, raw advances are reported",
        )
    for note in ev.notes:
        out.emit(FRONTIER_ACCOUNTING, note)

    blockers = _telemetry(x, out) + _roles(x, out)
    if x.side.accumulation_collapsed:
        out.emit(
            GRADIENT_ACCUMULATION_AMBIGUOUS,
            "accumulation microsteps were collapsed or mixed: data and backward displacement "
            "cannot be separated; record accumulation-indexed substages (timer.microstep)",
        )
        blockers.append(GRADIENT_ACCUMULATION_AMBIGUOUS)
    if x.side.event_state is not None or x.side.event_totals is not None:  # events sampled
        out.forward_event = forward_event_labels(
            x.side, x.gates, x.stages, x.d, x.evidence.shares, order, out.emit
        )
    _measured_wait(x, out, x.stages[s1])

    if not ev.shares_defined:
        for label in STRONG_LABELS:
            out.withhold(label, "shares undefined")
        return out

    # --- ambiguity: near ties, unstable leaders, high share with low direct gain -------------
    name1 = x.stages[s1]
    g1 = float(ev.gain[s1])
    gmax = float(ev.gain.max())
    strong_gains = [j for j in range(len(x.stages)) if ev.gain[j] >= g.gain_threshold]
    loc = ev.localization[s1]
    confident = loc.confident_steps >= g.min_confident_fraction * n
    dominant = a1 > g.share_dominance
    model_fit = name1 in g.model_fit_stages
    threshold = _pct("gain_threshold", g.gain_threshold)
    ambiguities = _ambiguities(x, order, strong_gains)
    if ambiguities:
        for reason, _ in ambiguities:
            out.emit(CO_CRITICAL, reason)
        out.co_critical_stages = _ambiguity_set(x, a1, gmax, strong_gains)
        causes = "; ".join(cause for _, cause in ambiguities)
        for label in STRONG_LABELS:
            out.withhold(label, f"co_critical: {causes}")
        return out

    if not dominant:
        for label in STRONG_LABELS:
            out.withhold(
                label,
                f"top share {a1:.1%} ({name1}) is not above share_dominance={g.share_dominance}",
            )
        return out
    if blockers:
        for label in STRONG_LABELS:
            out.withhold(
                label,
                "suppressed by "
                + "; ".join(f"{b}: {out.reasons[b][0]}" for b in sorted(set(blockers))),
            )
        return out

    if g1 >= g.gain_threshold:
        out.emit(
            DIRECT_EXPOSURE,
            f"{name1}: share {a1:.1%} and clipped direct gain {g1:.1%} "
            f"(>= {threshold}, top gain) agree",
        )
    else:
        out.withhold(
            DIRECT_EXPOSURE,
            f"direct gain {g1:.1%} of {name1} is below {threshold}: " + _low_gain_cause(x, s1),
        )
    if n_ranks == 1:
        for label in (SYNC_WAIT_DEPENDENT, LIKELY_SYNC_WAIT):
            out.withhold(label, "single rank: no cross-rank wait evidence")
        return out
    if not model_fit:
        for label in (SYNC_WAIT_DEPENDENT, LIKELY_SYNC_WAIT):
            out.withhold(
                label, f"Gates.model_fit_stages does not include {name1}: no wait model asserted"
            )
        return out
    if g1 < g.gain_threshold:
        out.emit(
            SYNC_WAIT_DEPENDENT,
            f"{name1}: share {a1:.1%} with direct gain {g1:.1%} < {threshold} under the "
            "caller's synchronization-wait model",
        )
    else:
        out.withhold(SYNC_WAIT_DEPENDENT, f"direct gain of {name1} is high")
    mean_step = ev.exposed_s / n
    if confident and loc.delta_lag_mean_s >= g.share_tie * mean_step:
        out.emit(
            LIKELY_SYNC_WAIT,
            f"rank {loc.leader_rank} pulls ahead of the median by {loc.delta_lag_mean_s:.4g} s "
            f"per step in {name1} and leads it in {loc.confident_steps}/{n} steps",
        )
    else:
        out.withhold(
            LIKELY_SYNC_WAIT,
            f"lag growth in {name1} ({loc.delta_lag_mean_s:.3g} s/step) or leader confidence "
            f"({loc.confident_steps}/{n} steps) is too weak",
        )
    return out


def _ambiguities(
    x: LabelInputs, order: list[int], strong_gains: list[int]
) -> list[tuple[str, str]]:
    """Why the window is co_critical: (full reason, short cause) pairs; empty when it is not.

    Near-tied shares or gains, an unstable lead rank, a dominant share whose direct gain is
    below ``gain_threshold`` (with no wait model asserted), or within ``gain_tie`` above it (too
    close to the threshold to separate direct exposure from wait), or a larger gain elsewhere.
    """
    ev, g = x.evidence, x.gates
    n_ranks = x.n_ranks
    s1 = order[0]
    name1, a1, g1 = x.stages[s1], float(ev.shares[s1]), float(ev.gain[s1])
    gmax = float(ev.gain.max())
    threshold = _pct("gain_threshold", g.gain_threshold)
    out: list[tuple[str, str]] = []
    if len(order) > 1 and a1 > 0 and a1 - ev.shares[order[1]] <= g.share_tie:
        name2, a2 = x.stages[order[1]], float(ev.shares[order[1]])
        out.append(
            (
                f"top shares near-tied: {name1} {a1:.1%} vs {name2} {a2:.1%} "
                f"(within {_pct('share_tie', g.share_tie)})",
                f"{name1} and {name2} carry near-tied shares",
            )
        )
    gain_ties = [j for j in strong_gains if ev.gain[j] >= gmax - g.gain_tie]
    if len(gain_ties) > 1:
        tied = ", ".join(f"{x.stages[j]} {ev.gain[j]:.1%}" for j in gain_ties)
        out.append(
            (
                f"direct gains near-tied: {tied} (within {_pct('gain_tie', g.gain_tie)})",
                f"direct gains near-tied ({tied})",
            )
        )
    loc = ev.localization[s1]
    if n_ranks > 1 and lead_switches(loc, x.n_steps, g):
        switch_rate = loc.leader_switches / max(loc.confident_steps - 1, 1)
        out.append(
            (
                f"lead rank of {name1} switches {loc.leader_switches} times over "
                f"{loc.confident_steps} confident steps "
                f"(rate {switch_rate:.2f} > max_switch_rate={g.max_switch_rate})",
                f"no single rank leads {name1}: the lead changed {loc.leader_switches} times "
                f"in {loc.confident_steps} steps with a clear leader",
            )
        )
    if a1 <= g.share_dominance:
        return out
    if g1 < g.gain_threshold and name1 not in g.model_fit_stages:
        out.append(
            (
                f"{name1} leads with {a1:.1%} of exposed time but its direct gain is {g1:.1%} "
                f"< {threshold} ({_low_gain_cause(x, s1)}); with no wait model asserted for "
                "it (Gates.model_fit_stages) the share may be wait induced or an independent "
                "co-critical path",
                f"{name1}'s direct gain is {g1:.1%} < {threshold} and "
                "Gates.model_fit_stages does not include it",
            )
        )
    elif g.gain_threshold <= g1 < g.gain_threshold + g.gain_tie:
        out.append(
            (
                f"{name1}'s direct gain {g1:.1%} is within {_pct('gain_tie', g.gain_tie)} of "
                f"{threshold}: too close to the threshold to tell direct exposure from a "
                "wait-dependent share",
                f"{name1}'s direct gain {g1:.1%} is within gain_tie of gain_threshold",
            )
        )
    if g1 >= g.gain_threshold and s1 not in gain_ties:
        top = x.stages[int(np.argmax(ev.gain))]
        out.append(
            (
                f"another stage has a larger direct gain than {name1}: {top} {gmax:.1%}",
                f"{top} has a larger direct gain ({gmax:.1%}) than {name1} ({g1:.1%})",
            )
        )
    return out


def _pct(gate: str, value: float) -> str:
    """A gate compared with a percentage, written as one: ``gain_threshold 10%``."""
    return f"{gate} {value:.0%}" if round(value * 100, 6).is_integer() else f"{gate} {value:.1%}"


def _low_gain_cause(x: LabelInputs, stage: int) -> str:
    """Why clipping a stage to its baseline removes little exposed time."""
    g, loc = x.gates, x.evidence.localization[stage]
    n = x.n_steps
    mean_step = x.evidence.exposed_s / n
    steady = (
        loc.leader_rank is not None
        and loc.confident_steps >= g.min_confident_fraction * n
        and loc.delta_lag_mean_s >= g.share_tie * mean_step
    )
    if g.gain_baseline == "rank_median" and steady:
        return (
            f"a steady stall: rank {loc.leader_rank} is {loc.delta_lag_mean_s * 1e3:.3g} ms/step "
            f"behind the median rank in this stage in {loc.confident_steps}/{n} steps, so the "
            "stall is that rank's usual value and clipping to its own median changes nothing"
        )
    if g.gain_baseline == "rank_median":
        return "the stage rarely exceeds each rank's own median duration: there is no tail to clip"
    return f"clipping it to the {g.gain_baseline.replace('_', ' ')} removes little exposed time"


def _telemetry(x: LabelInputs, out: Labeling) -> list[str]:
    g, side = x.gates, x.side
    reasons: list[str] = []
    if not x.evidence.shares_defined:
        reasons.append("exposed time below the share floor")
    if x.residual_share > g.max_residual_share:
        reasons.append(
            f"residual step.other_cpu_wall carries {x.residual_share:.1%} of exposed time "
            f"(> {g.max_residual_share:.0%}): timed stages do not close the step"
        )
    if x.overlap_share > g.max_overlap_share:
        reasons.append(
            f"overlap error is {x.overlap_share:.2%} of step wall time "
            f"(> {g.max_overlap_share:.0%}): ordered spans nest or double count"
        )
    if len(side.missing_ranks) > g.max_missing_ranks:
        reasons.append(f"missing ranks {list(side.missing_ranks)}: analyzed the ranks that arrived")
    if not side.gather_ok and not side.missing_ranks:
        reasons.append("window collection did not complete")
    if side.mismatched_ranks:
        reasons.append(
            f"ranks {list(side.mismatched_ranks)} sent a different schema or step count and "
            "were not merged"
        )
    if side.contract_violations:
        reasons.append(f"{side.contract_violations} ordered-stage contract violation(s)")
    reasons.extend(side.notes)
    for reason in reasons:
        out.emit(TELEMETRY_LIMITED, reason)
    return [TELEMETRY_LIMITED] if reasons else []


def _roles(x: LabelInputs, out: Labeling) -> list[str]:
    """``role_aware_needed`` when ranks play several roles; ``telemetry_limited`` when a role
    of the job has no rank in the window, so its report is missing."""
    present = set(x.roles or ())
    absent = [role for role in x.side.expected_roles if role not in present]
    if absent:
        out.emit(
            TELEMETRY_LIMITED,
            f"role(s) {', '.join(absent)} of the job have no rank in this window: "
            "no report for them",
        )
    blockers = [TELEMETRY_LIMITED] if absent else []
    if x.roles is None or len(present) < 2:
        return blockers
    unknown = [i for i, role in enumerate(x.roles) if role == UNKNOWN_ROLE]
    if unknown:
        out.emit(
            ROLE_AWARE_NEEDED,
            f"ranks {unknown} carry no role while others do: they are left out of the "
            "per-role reports",
        )
    known = sorted(present - {UNKNOWN_ROLE})
    out.emit(
        ROLE_AWARE_NEEDED,
        f"ranks play {len(known)} roles ({', '.join(known)}): a global frontier mixes "
        "boundaries that do not wait on each other; read role_reports, one per role, instead",
    )
    return [*blockers, ROLE_AWARE_NEEDED]


def _ambiguity_set(x: LabelInputs, a1: float, gmax: float, strong_gains: list[int]) -> list[str]:
    """``E_amb = C_A ∪ C_G`` in schema order.

    ``C_A``: stages within eta_A of the top share. ``C_G``: stages within eta_G of the top direct
    gain when some gain reaches gamma_G; otherwise the gains carry no separating evidence and
    ``C_G`` holds the stages along which ranks reach the step's frontier (critical paths).
    """
    g, ev = x.gates, x.evidence
    members = {j for j in range(len(x.stages)) if ev.shares[j] >= a1 - g.share_tie}
    if strong_gains:
        members |= {j for j in strong_gains if ev.gain[j] >= gmax - g.gain_tie}
    else:
        carried = ev.critical_path
        members |= {j for j in range(len(x.stages)) if carried[j] >= g.critical_path_fraction}
    return [x.stages[j] for j in sorted(members)]


def _measured_wait(x: LabelInputs, out: Labeling, top: str) -> None:
    """``sync_wait_measured``: the ranks timed their collectives (``analysis.collectives``) and
    one arrives at a collective of the top stage after the others, which are measured waiting. It
    stands on that measurement, not on the wait model the other sync-wait labels assume."""
    times = x.side.collectives
    if times is None or x.n_ranks < 2 or not x.evidence.shares_defined:
        return
    ranks = list(range(x.n_ranks)) if x.ranks is None else list(x.ranks)
    step_ms = x.evidence.exposed_s / x.n_steps * 1e3
    late = read_collectives(times, ranks, step_ms).late
    if late is None or late.stage is None or semantic_stage(late.stage) != top:
        return
    out.emit(
        SYNC_WAIT_MEASURED,
        f"rank {late.late_rank} arrives at {collective_name(late.family, late.bucket)} in "
        f"{late.stage} ~{late.lateness_ms:.0f} ms per step after the others (last in "
        f"{late.late_steps}/{late.steps} steps); the other ranks wait for it there "
        f"~{late.wait_ms:.0f} ms, timed in the collective",
    )
