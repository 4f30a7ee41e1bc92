"""Who leads a stage when its wait comes in bursts: the lead judged over blocks of steps.

A DataLoader with ``k`` worker processes hands its batches over ``k`` at a time, so a rank whose
workers are slow waits on one step in ``k`` and the lead of the data wait seems to pass from rank
to rank step by step. Summed over consecutive blocks of ``k`` steps, each block holds one such
wait per rank, and the slow rank leads every block. The window line and the profiler router both
read the one ``block_lead`` of a window, so the rank the line names is the rank the router
captures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import numpy.typing as npt

from .analyzer import analyze
from .evidence import StageLocalization
from .gates import Gates
from .window_report import WindowReport

MIN_BLOCKS = 4
"""The fewest blocks a window must hold for a stage's lead to be judged over them."""
MIN_LEAD_SHARE = 0.1
"""The least share of the step by which a rank's lead must matter to be acted on (the
profiler router's ``min_share``)."""


@dataclass(frozen=True)
class BlockLead:
    """A stage's lead over blocks of ``size`` steps: ``rank`` leads it steadily when ``why``
    is empty (else ``why`` says why no rank does)."""

    stage: str
    size: int
    rank: int | None
    blocks: int
    confident_blocks: int
    switches: int
    why: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def unsteady_lead(
    loc: StageLocalization, n: int, mean_step: float, g: Gates, stage: str, unit: str = "steps"
) -> str:
    """Why the stage's leader is not one to name (empty when it is): it leads alone in too few
    steps (or blocks of steps), switches too often, or does not pull ahead of the median rank."""
    if loc.leader_rank is None or loc.confident_steps < g.min_confident_fraction * n:
        return f"no confident leader of {stage} ({loc.confident_steps}/{n} {unit})"
    switch_rate = loc.leader_switches / max(loc.confident_steps - 1, 1)
    if switch_rate > g.max_switch_rate:
        return f"the leader of {stage} switches (rate {switch_rate:.2f})"
    if loc.delta_lag_mean_s < g.share_tie * mean_step:
        return (
            f"the leader of {stage} pulls ahead by {loc.delta_lag_mean_s * 1e3:.2f} ms/step, "
            f"under {g.share_tie:.0%} of the step"
        )
    return ""


def steady_lead_below_top(report: WindowReport, min_share: float = MIN_LEAD_SHARE) -> str | None:
    """The largest stage of the routing set after the top one that one rank leads steadily
    (``unsteady_lead`` finds nothing against its leader) and materially (ahead of the median
    rank by ``min_share`` of the step at least), when the top stage has no steady leader: a
    rank that holds the others back in a smaller stage while the lead of the top one passes
    between ranks (one rank's data wait in every accumulation microstep, beside a backward pass
    every rank shares). None when the top stage has a steady leader or no other stage of the
    routing set has such a one. The window line and the router both read it."""
    top = report.top1
    if top is None or not report.shares_defined or report.n_ranks < 2:
        return None
    n = report.n_steps
    mean_step = report.exposed_s / n
    if not unsteady_lead(report.semantic_localization[top], n, mean_step, report.gates, top):
        return None
    for stage in sorted(report.routing_set, key=lambda s: -report.semantic_shares[s]):
        loc = report.semantic_localization[stage]
        steady = not unsteady_lead(loc, n, mean_step, report.gates, stage)
        if stage != top and steady and loc.delta_lag_mean_s >= min_share * mean_step:
            return stage
    return None


def block_sums(d: npt.NDArray[np.float64], size: int) -> npt.NDArray[np.float64]:
    """``d`` summed over consecutive blocks of ``size`` steps along its first axis (a last
    partial block left out)."""
    blocks = d.shape[0] // size
    summed: npt.NDArray[np.float64] = (
        d[: blocks * size].reshape(blocks, size, *d.shape[1:]).sum(axis=1)
    )
    return summed


def block_lead(
    d: npt.NDArray[np.float64],
    stages: Sequence[str],
    rank_ids: Sequence[int],
    stage: str,
    size: int,
    gates: Gates,
) -> BlockLead | None:
    """The lead of the broad ``stage`` over blocks of ``size`` consecutive steps of
    ``d [N, R, S]`` (a last partial block left out); None when fewer than ``MIN_BLOCKS`` blocks
    fit or ``size`` is under 2. The direct gains play no part in a lead, so the blocks are
    analyzed with each rank's own median as the gains' baseline: a no-stall reference of
    single steps does not describe a block's sum."""
    if size < 2 or d.shape[0] // size < MIN_BLOCKS:
        return None
    summed = block_sums(d, size)
    blocks = summed.shape[0]
    g = replace(gates, gain_baseline="rank_median")
    report = analyze(summed, stages, gates=g, rank_ids=list(rank_ids))
    loc = report.semantic_localization[stage]
    why = unsteady_lead(loc, blocks, report.exposed_s / blocks, g, stage, "blocks")
    return BlockLead(
        stage, size, loc.leader_rank, blocks, loc.confident_steps, loc.leader_switches, why
    )
