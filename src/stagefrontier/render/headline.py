"""A window's headline: the one short line a person scans in a terminal.

What holds the step back, who sets it, how much it costs and the next step, in at most
:data:`HEADLINE_MAX` characters. The rest (routing set, labels, regression, StageFrontier's own
cost, the verdict with its reasons) is the window's details line (``render.text.window_details``),
its ``windows.jsonl`` record and the run report. A window that says what the one before it said
is headed ``same as window N``, N being the first window that said it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.across_roles import bounding_role
from ..analysis.labels import TELEMETRY_LIMITED
from ..analysis.leaders import MIN_LEAD_STEPS
from ..analysis.regression import WHOLE_JOB
from ..analysis.schema import DATA_STAGE
from ..analysis.window_report import WindowReport
from .communication import communication_short
from .escape import printable
from .loader_text import block_leader
from .text import index_text, lead_text, window_title
from .verdict import (
    both_names,
    ms,
    next_step,
    plain,
    rank_name,
    ranks_text,
    routed_below,
)

HEADLINE_MAX = 160
"""The most characters a headline takes; a longer one (long stage or host names) is cut, the
details line keeping it whole."""
CUT = "..."
WHOLE_JOB_STEP = "look outside the training code"
"""The next step when the whole job slowed alike (its details line says what the host showed)."""
MIN_FINDING = 24
"""The fewest characters of the finding kept when a headline is too long: with less room, the
line is cut at its end instead."""


def window_headline(
    report: WindowReport, record: Mapping[str, Any] | None = None, same_as: str | None = None
) -> str:
    """``window 3 steps 60-79 | exposed 203.2 ms/step | top data.next_wait 61% (~125 ms) led by
    rank 2 | Next: profile data loading (data.next_wait) on rank 2``; with ``same_as``, the
    qualifiers and the next step are replaced by ``same as window <same_as>``."""
    record = record or {}
    head = [window_title(record)] if "window" in record else []
    head.append(f"exposed {report.mean_step_s * 1e3:.1f} ms/step")
    step = "" if same_as is not None else next_step(report, record)
    if step and _whole_job(record):
        step = WHOLE_JOB_STEP
    flags = _flags(report, record) if same_as is None else []
    same = [f"same as window {same_as}"] if same_as is not None else []
    stage = _named_stage(report)
    # The fullest form that fits: then without the stage's cost, then the next step naming the
    # stage by its plain name alone (the finding names it), then the finding cut.
    for cost, plain_step in ((True, False), (False, False), (False, True)):
        said = _plain_step(step, stage) if plain_step else step
        tail = [*flags, *([f"Next: {said}"] if said else []), *same]
        what = printable(_what(report, record, cost))
        line = printable(" | ".join([*head, what, *tail]))
        if len(line) <= HEADLINE_MAX:
            return line
    room = HEADLINE_MAX - len(printable(" | ".join([*head, "", *tail])))
    what = what[: max(room - len(CUT), MIN_FINDING)] + CUT  # long names: cut the finding
    line = printable(" | ".join([*head, what, *tail]))
    return line if len(line) <= HEADLINE_MAX else line[: HEADLINE_MAX - len(CUT)] + CUT


def _whole_job(record: Mapping[str, Any]) -> bool:
    """Every rank and stage slowed alike (``analysis.regression``): the cause is outside the
    training code, and the next step is to look there, not at a stage."""
    regression = record.get("regression")
    return isinstance(regression, Mapping) and regression.get("kind") == WHOLE_JOB


def _named_stage(report: WindowReport) -> str | None:
    """The stage the headline's finding names: the top stage, or the bounding role's."""
    if report.top1 is not None or not report.shares_defined:
        return report.top1
    bound = bounding_role(report)
    if bound is None or bound.role is None:
        return None
    return (report.role_reports or {})[bound.role].top1


def _plain_step(step: str, stage: str | None) -> str:
    """The next step with the stage (and the data stage it may name with it) said by its plain
    name only: ``profile data loading on rank 2``."""
    for named in () if stage is None else (stage, DATA_STAGE):
        step = step.replace(both_names(named), plain(named))
    return step


def saying(report: WindowReport, record: Mapping[str, Any]) -> tuple[str, ...]:
    """What a headline says, without the numbers that move from window to window (step time,
    shares): two windows of the same saying read the same to a person."""
    top = report.top1 if report.shares_defined else None
    who = lead_text(report, record) if top is not None else ""
    return (str(top), who, *_flags(report, record), next_step(report, record))


class Headlines:
    """The headlines of one run's windows in order: a window that says what the window before it
    said is headed ``same as window N`` (N the first of that run of windows)."""

    def __init__(self) -> None:
        self._said: tuple[tuple[str, ...], str] | None = None

    def same_as(self, report: WindowReport, record: Mapping[str, Any]) -> str | None:
        """The window this one repeats, or None (and this window is remembered as the one that
        said it first)."""
        key = saying(report, record)
        if self._said is not None and self._said[0] == key and report.top1 is not None:
            return self._said[1]
        self._said = (key, index_text(record))
        return None

    def line(self, report: WindowReport, record: Mapping[str, Any]) -> str:
        return window_headline(report, record, self.same_as(report, record))


def _what(report: WindowReport, record: Mapping[str, Any], cost: bool = True) -> str:
    """``top data.next_wait 61% (~125 ms) led by rank 2`` (the cost per step left out without
    ``cost``); with roles, the role that bounds the step and its top stage, or when that is
    open each role's top stage."""
    if not report.shares_defined:
        return "no exposed time"
    top = report.top1
    bound = bounding_role(report) if top is None else None
    if bound is not None and bound.role is not None:  # one role's stage bounds the step
        return f"role {bound.role} bounds the step: " + _what(
            (report.role_reports or {})[bound.role], record, cost
        )
    if top is None:
        tops = []
        for role, rep in (report.role_reports or {}).items():
            if rep.top1 is None or not rep.shares_defined:
                tops.append(f"{role} no exposed time")
            else:
                share = rep.semantic_shares[rep.top1]
                lead = lead_text(rep, record, short=True)
                tops.append(f"{role} top {rep.top1} {share:.0%} {lead}")
        return "per role: " + "; ".join(tops)
    share = report.semantic_shares[top]
    spent = f" (~{ms(share * report.mean_step_s * 1e3)} ms)" if cost else ""
    measured = communication_short(record, top, plain(top))
    if measured:  # the collectives name the late rank or the slow collective: room for it
        return f"{plain(top)} {share:.0%}: {measured}"
    routed = routed_below(report, record)
    if routed is not None:  # the lead the router acts on, then the top stage no rank leads
        below, rank = routed[0], routed[1][0]
        block = block_leader(record, below)
        blocks = f" in {block[1]}-step blocks" if block else ""
        return (
            f"{below} {report.semantic_shares[below]:.0%} led by {rank_name(rank, record)}"
            f"{blocks} below top {plain(top)} {share:.0%}"
        )
    return f"top {top} {share:.0%}{spent} {lead_text(report, record, short=True)}"


def _flags(report: WindowReport, record: Mapping[str, Any]) -> list[str]:
    """What qualifies the finding, a word or two each: provisional, missing ranks, slower than
    the run's baseline."""
    flags = []
    short = report.n_ranks > 1 and report.n_steps < MIN_LEAD_STEPS
    if report.has(TELEMETRY_LIMITED) or short:
        flags.append("provisional")
    missing = record.get("missing_ranks")
    if not record.get("gather_ok", True) and isinstance(missing, list) and missing:
        flags.append(f"missing ranks {ranks_text([int(r) for r in missing])}")
    regression = record.get("regression")
    if isinstance(regression, Mapping):
        slower = f"slower {regression.get('delta_exposed_ms_per_step', 0.0):+.0f} ms/step"
        flags.append(f"whole job {slower}" if _whole_job(record) else slower)
    return flags
