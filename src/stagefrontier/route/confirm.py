"""Does the trace say what the live signal said? The captured ranks' traces, reduced with the
Kineto reducer and analyzed by the one analyzer, against the live matrix restricted to the same
ranks and steps and analyzed the same way; and does the suspect's lead over its reference hold
in the trace, by a material share of the step and above the captured steps' noise?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.analyzer import analyze
from ..analysis.gates import DEFAULT_GATES, Gates
from ..analysis.noise import Difference, mean_excess
from ..analysis.semantic import stage_groups
from ..reducers import reduce_kineto
from ..reducers.result import ReducedTrace

CONFIRM_T = 1.0
"""Standard errors of the mean per-step lead the captured steps must clear. A handful of steps,
where a DataLoader's bursts put a rank's whole wait on one step in a few, carries no stronger
test; the materiality floor does most of the work, and the window that opened the incident
passed the full test over its own steps."""
BLOCK_STEPS = 4
"""The captured steps are cut into consecutive blocks of about this many (two at least), and
the suspect's lead must clear the material floor in every one of them: a mean over the steps
clears it when one step alone carries a large enough delay (a collection, a preemption on the
suspect and not on its reference: 90 ms in one of 20 steps of 45 ms), and that is no lead. A
DataLoader with ``k`` workers puts its wait on one step in ``k``: the blocks are at least ``k``
steps long so that each holds one of them (the decision's ``burst``; five captured steps make
blocks of three and two), and a capture of fewer than two bursts is judged on its mean alone."""


@dataclass(frozen=True)
class LiveWindow:
    """One analyzed window's matrix and where it sits: from a live ``AnalyzedWindow`` on rank 0,
    or from an evidence packet offline."""

    first_step: int
    ranks: tuple[int, ...]
    d: npt.NDArray[np.float64]
    stages: tuple[str, ...]


@dataclass(frozen=True)
class LiveSlice:
    """The live durations of some ranks over some steps: ``d [steps, ranks, stages]``."""

    d: npt.NDArray[np.float64]
    steps: tuple[int, ...]
    ranks: tuple[int, ...]
    stages: tuple[str, ...]


def live_slice(
    windows: Sequence[LiveWindow], ranks: Sequence[int], steps: Sequence[int]
) -> LiveSlice | None:
    """Rows of the analyzed windows for these global steps and ranks (in the given order);
    None when the windows hold none of them."""
    wanted = set(steps)
    rows: list[npt.NDArray[np.float64]] = []
    found: list[int] = []
    stages: tuple[str, ...] = ()
    for window in windows:
        if any(r not in window.ranks for r in ranks):
            continue
        cols = [window.ranks.index(r) for r in ranks]
        first = window.first_step
        for i in range(window.d.shape[0]):
            if first + i in wanted and first + i not in found:
                rows.append(window.d[i, cols, :])
                found.append(first + i)
                stages = window.stages
    if not rows:
        return None
    order = np.argsort(found)
    return LiveSlice(np.stack(rows)[order], tuple(sorted(found)), tuple(ranks), stages)


@dataclass(frozen=True)
class Confirmation:
    confirmed: bool | None
    max_share_diff: float | None
    trace_shares: dict[str, float] = field(default_factory=dict)
    live_shares: dict[str, float] = field(default_factory=dict)
    trace_top: str | None = None
    live_top: str | None = None
    steps: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    weak_lead: str = ""
    """Why the suspect's lead in the stage's time is no confirmation (empty when it is one, or
    when there is none to judge); the only reason ``confirmed`` is False when the rest agrees."""
    step_s: float | None = None
    """The captured steps' median step (the longer of suspect and reference), in seconds."""
    lead_s: float | None = None
    """The suspect's mean lead over the reference in the stage's time per step, in the trace,
    in seconds (None where there was none to judge)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "confirmed": self.confirmed,
            "max_share_diff": self.max_share_diff,
            "trace_shares": self.trace_shares,
            "live_shares": self.live_shares,
            "trace_top": self.trace_top,
            "live_top": self.live_top,
            "compared_steps": list(self.steps),
        }


def broad_stages(live: LiveSlice) -> LiveSlice:
    """The slice with accumulation substages ``name[i]`` summed into their stage: a trace's
    ranges carry the stage's name in every microstep."""
    names, groups = stage_groups(live.stages)
    if len(names) == len(live.stages):
        return live
    d = np.stack([live.d[:, :, members].sum(axis=2) for members in groups], axis=2)
    return LiveSlice(d, live.steps, live.ranks, names)


def confirm(
    trace_files: dict[int, str],
    live: LiveSlice | None,
    stage: str | None,
    gates: Gates | None = None,
    loaded: Mapping[Path, tuple[dict[str, Any], list[Any]]] | None = None,
    lead: tuple[int, int] | None = None,
    min_share: float = 0.0,
    burst: int = 1,
    on_top: bool = True,
) -> Confirmation:
    """``confirmed`` when the trace's top stage is the live top stage (and the routed one, when
    ``on_top``: a stage routed below the window's top one need not be on top here either),
    every share differs by less than ``Gates.share_tie`` and, where ``lead`` names a suspect
    and a distinct reference the trace holds, the suspect's time in ``stage`` (by default the
    trace's top stage) exceeds the
    reference's by at least ``min_share`` of the step on average, in every block of about
    ``BLOCK_STEPS`` captured steps (whole multiples of ``burst``: the steps a DataLoader's
    workers hand their batches over in), and by ``CONFIRM_T`` standard errors over the
    captured steps; ``disagrees`` (False) otherwise."""
    g = gates or DEFAULT_GATES
    if live is None:
        return Confirmation(None, None, notes=("no live windows cover the captured steps",))
    paths = [trace_files[r] for r in sorted(trace_files)]
    live = broad_stages(live)
    reduced = reduce_kineto(
        paths,
        live.stages,
        ranks={trace_files[r]: r for r in trace_files},
        step_source="annotation",
        world_size=None,
        missing_ranks="allow",
        missing_stages="zero",  # a stage the loop never enters is zero in the live matrix too
        loaded=loaded,
    )
    common = [s for s in reduced.step_ids if s in set(live.steps)]
    if not common:
        return Confirmation(None, None, notes=("the traces and the live windows share no step",))
    reduced = reduced.select_steps(common)
    ranks = list(reduced.ranks)
    cols = [live.ranks.index(r) for r in ranks]
    rows = [live.steps.index(s) for s in common]
    live_d = live.d[np.ix_(rows, cols)]
    trace_report = reduced.analyze(g)
    live_report = analyze(live_d, live.stages, gates=g)
    diffs = [abs(trace_report.shares[s] - live_report.shares[s]) for s in live.stages]
    max_diff = float(max(diffs))
    routed = stage is None or not on_top or trace_report.top1 == stage
    agree = trace_report.top1 == live_report.top1 and routed
    weak, step_s, lead_s = _weak_lead(reduced, stage or trace_report.top1, lead, min_share, burst)
    return Confirmation(
        confirmed=bool(agree and max_diff < g.share_tie and not weak),
        max_share_diff=round(max_diff, 6),
        trace_shares={k: round(v, 6) for k, v in trace_report.shares.items()},
        live_shares={k: round(v, 6) for k, v in live_report.shares.items()},
        trace_top=trace_report.top1,
        live_top=live_report.top1,
        steps=tuple(common),
        notes=tuple(reduced.notes),
        weak_lead=weak,
        step_s=step_s,
        lead_s=lead_s,
    )


def _weak_lead(
    reduced: ReducedTrace,
    stage: str | None,
    lead: tuple[int, int] | None,
    min_share: float,
    burst: int = 1,
) -> tuple[str, float | None, float | None]:
    """Why the suspect's lead over its reference in the trace's steps is no confirmation
    (empty when it is one, or when the trace lacks a stage, a suspect or a distinct reference
    to judge it by), the captured steps' median step it was measured against, and the mean
    lead per step."""
    if lead is None or stage not in reduced.stages:
        return "", None, None
    suspect, reference = lead
    if suspect == reference or not {suspect, reference} <= set(reduced.ranks):
        return "", None, None
    j = reduced.stages.index(stage)
    mine, theirs = reduced.ranks.index(suspect), reduced.ranks.index(reference)
    diffs = reduced.d[:, mine, j] - reduced.d[:, theirs, j]
    step = float(np.median(reduced.d[:, [mine, theirs], :].sum(axis=2).max(axis=1)))
    excess, why = lead_shortfall(diffs, reduced.step_ids, min_share * step, burst)
    if not why:
        return "", step, excess.shift_s
    said = (
        f"not confirmed: in the trace rank {suspect}'s {stage} exceeds rank {reference}'s by "
        f"{excess.shift_s * 1e3:.1f} ms/step over {diffs.size} steps of {step * 1e3:.1f} ms, "
    )
    return said + why, step, excess.shift_s


def lead_shortfall(
    diffs: npt.NDArray[np.float64], step_ids: Sequence[int], floor_s: float, burst: int = 1
) -> tuple[Difference, str]:
    """The mean of a suspect's per-step lead over its reference in the captured steps, and why
    it confirms nothing (empty when it does): it must clear ``floor_s`` and ``CONFIRM_T``
    standard errors over the steps, and the floor in every block of about ``BLOCK_STEPS``
    steps (whole multiples of ``burst``)."""
    excess = mean_excess(diffs, floor_s, CONFIRM_T)
    if not excess.stands_out:
        return excess, excess.shortfall()
    size = -(-BLOCK_STEPS // burst) * burst  # whole bursts, four steps at least
    weakest = _weakest_block(diffs, step_ids, floor_s, size, burst)
    if weakest is None:
        return excess, ""
    (first, last), block = weakest
    return excess, (
        f"but by {block.shift_s * 1e3:.1f} ms/step in steps {first}-{last}, "
        f"{block.shortfall()} (the lead must hold in every block of about {size} "
        "steps: a delay in one step is no lead)"
    )


def _weakest_block(
    diffs: npt.NDArray[np.float64],
    step_ids: Sequence[int],
    floor_s: float,
    size: int,
    burst: int,
) -> tuple[tuple[int, int], Difference] | None:
    """The block of consecutive captured steps (about ``size``, a multiple of ``burst``; two
    blocks at least) whose mean lead is the smallest, its first and last step ids and that lead
    against the floor; None when every block clears the floor, or when the steps hold fewer
    than two whole bursts (the mean over them is then the only block). Blocks hold whole
    bursts, the steps after the last whole one left out, so that every block holds as many
    of the workers' waits as the others: cut anywhere, one of three steps holds one wait in
    two and averages less than the mean."""
    bursts = diffs.size // burst
    if bursts < 2:
        return None
    count = max(2, bursts * burst // size)
    bounds = [
        np.arange(group[0] * burst, (group[-1] + 1) * burst)
        for group in np.array_split(np.arange(bursts), count)
    ]
    means = [float(diffs[b].mean()) for b in bounds]
    i = int(np.argmin(means))
    block = Difference(means[i], floor_s, 0.0)
    if block.stands_out:
        return None
    return (step_ids[bounds[i][0]], step_ids[bounds[i][-1]]), block
