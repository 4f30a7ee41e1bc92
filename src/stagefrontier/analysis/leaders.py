"""Which rank leads a stage in a window, read from its report: the rule the verdict names a
rank by, and the ranks a run report's leaders view colours. Both read only a few report
fields, so a run summary applies them to a stored window's lean row
(``formats.window_rows.WindowRow``) as well as to a whole ``WindowReport``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

MIN_LEAD_STEPS = 2
"""A window of fewer steps names no rank as a stage's leader: a run's last window can hold a
single step (what was left when the timer closed), and one step's front rank is jitter."""
MIN_LEADER_SHARE = 0.05
"""A rank counts as setting the frontier in a window when it leads a stage carrying at least
this share of the exposed time."""


class Lead(Protocol):
    """A stage's localization as the rule reads it (``analysis.evidence.StageLocalization``)."""

    @property
    def leader_rank(self) -> int | None: ...
    @property
    def leader_fraction(self) -> float: ...
    @property
    def confident_steps(self) -> int: ...
    @property
    def leader_switches(self) -> int: ...
    @property
    def leading_ranks(self) -> Sequence[int]: ...


class SwitchGates(Protocol):
    @property
    def min_confident_fraction(self) -> float: ...
    @property
    def max_switch_rate(self) -> float: ...


class LeadReport(Protocol):
    """The report fields the rule reads (``WindowReport`` has them all)."""

    @property
    def n_steps(self) -> int: ...
    @property
    def n_ranks(self) -> int: ...
    @property
    def shares_defined(self) -> bool: ...
    @property
    def semantic_shares(self) -> Mapping[str, float]: ...
    @property
    def semantic_localization(self) -> Mapping[str, Lead]: ...
    @property
    def gates(self) -> SwitchGates: ...


def lead_switches(loc: Lead, n_steps: int, gates: SwitchGates) -> bool:
    """Whether a stage's lead rank changes too often to name one: enough steps have a clear
    leader (``min_confident_fraction``) and it changes in more than ``max_switch_rate`` of
    them."""
    confident = loc.confident_steps >= gates.min_confident_fraction * n_steps
    switch_rate = loc.leader_switches / max(loc.confident_steps - 1, 1)
    return confident and switch_rate > gates.max_switch_rate


def single_leader(report: LeadReport, stage: str) -> int | None:
    """The one rank that leads ``stage``: the only leading rank, or the rank that led at least
    half of the stage's advance alone; None when the lead is shared or keeps changing, or the
    window has fewer than :data:`MIN_LEAD_STEPS` steps."""
    loc = report.semantic_localization.get(stage)
    if loc is None or loc.leader_rank is None or report.n_steps < MIN_LEAD_STEPS:
        return None
    if report.n_ranks > 1 and lead_switches(loc, report.n_steps, report.gates):
        return None
    if list(loc.leading_ranks) == [loc.leader_rank] or loc.leader_fraction >= 0.5:
        return loc.leader_rank
    return None


def window_leaders(report: LeadReport) -> dict[int, tuple[str, float]]:
    """Per rank that sets the frontier in this window: the (broad) stage it leads with the
    largest share, and that share. Only a single, steady leader counts (as the verdict names
    one); stages under ``MIN_LEADER_SHARE`` are left out."""
    out: dict[int, tuple[str, float]] = {}
    if not report.shares_defined:
        return out
    for stage in report.semantic_localization:
        share = float(report.semantic_shares.get(stage, 0.0))
        leader = single_leader(report, stage)
        if leader is None or share < MIN_LEADER_SHARE:
            continue
        if leader not in out or out[leader][1] < share:
            out[leader] = (stage, share)
    return out
