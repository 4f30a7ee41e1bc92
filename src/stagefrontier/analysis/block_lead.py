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
from .labels import TELEMETRY_LIMITED
from .noise import Difference, mean_excess
from .schema import semantic_stage
from .window_report import WindowReport

MIN_BLOCKS = 4
"""The fewest blocks a window must hold for a stage's lead to be judged over them."""
MIN_LEAD_SHARE = 0.1
"""The least share of the step by which a rank's lead must matter to be acted on (the
profiler router's ``min_share``)."""
LEAD_NOISE_FACTOR = 4.0
"""Standard errors of the mean per-step lead it must clear (the router's ``noise_factor``)."""


@dataclass(frozen=True)
class LeadTest:
    """When a rank's lead over a reference rank in a stage is one to act on: its time in the
    stage minus the reference's, per step, averages at least ``min_share`` of the mean step and
    stands ``noise_factor`` standard errors above zero (the profiler router's settings of the
    same names; the window line judges a lead by the router's). ``gates``: the router's gates,
    by which it judges which stage leads steadily and dominates (None: the window's own)."""

    min_share: float = MIN_LEAD_SHARE
    noise_factor: float = LEAD_NOISE_FACTOR
    gates: Gates | None = None

    def excess(
        self,
        d: npt.NDArray[np.float64],
        stages: Sequence[str],
        rank_ids: Sequence[int],
        stage: str,
        pair: tuple[int, int],
        burst: int,
        step_s: float,
    ) -> Difference:
        """How far the suspect's time in the broad ``stage`` exceeds the reference's
        (``pair``) per step of ``d [N, R, S]`` (over blocks of ``burst`` steps, per step),
        against ``min_share`` of ``step_s`` and ``noise_factor`` standard errors."""
        columns = [i for i, name in enumerate(stages) if semantic_stage(name) == stage]
        suspect, reference = (list(rank_ids).index(rank) for rank in pair)
        lead = d[:, suspect, columns] - d[:, reference, columns]
        per_step = block_sums(lead.sum(axis=1), burst) / burst
        return mean_excess(per_step, self.min_share * step_s, self.noise_factor)


DEFAULT_LEAD_TEST = LeadTest()


def median_reference(
    d: npt.NDArray[np.float64],
    stages: Sequence[str],
    rank_ids: Sequence[int],
    stage: str,
    suspect: int,
) -> int:
    """The rank whose total time in the broad ``stage`` is the median of the ranks other than
    ``suspect`` (the lower of the two middle ones)."""
    columns = [i for i, name in enumerate(stages) if semantic_stage(name) == stage]
    totals = d[:, :, columns].sum(axis=(0, 2))
    others = sorted((float(totals[i]), r) for i, r in enumerate(rank_ids) if r != suspect)
    return others[(len(others) - 1) // 2][1]


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


def steady_lead_below_top(
    report: WindowReport, min_share: float = MIN_LEAD_SHARE, gates: Gates | None = None
) -> str | None:
    """The largest stage of the routing set after the top one that one rank leads steadily
    (``unsteady_lead`` finds nothing against its leader) and materially (ahead of the median
    rank by ``min_share`` of the step at least), when the top stage has no steady leader: a
    rank that holds the others back in a smaller stage while the lead of the top one passes
    between ranks (one rank's data wait in every accumulation microstep, beside a backward pass
    every rank shares). None when the top stage has a steady leader or no other stage of the
    routing set has such a one. The window line and the router both read it, by ``gates``
    (None: the report's)."""
    top = report.top1
    if top is None or not report.shares_defined or report.n_ranks < 2:
        return None
    g = gates or report.gates
    n = report.n_steps
    mean_step = report.exposed_s / n
    if not unsteady_lead(report.semantic_localization[top], n, mean_step, g, top):
        return None
    for stage in sorted(report.routing_set, key=lambda s: -report.semantic_shares[s]):
        loc = report.semantic_localization[stage]
        steady = not unsteady_lead(loc, n, mean_step, g, stage)
        if stage != top and steady and loc.delta_lag_mean_s >= min_share * mean_step:
            return stage
    return None


def routed_lead_below_top(
    report: WindowReport,
    d: npt.NDArray[np.float64] | None,
    rank_ids: Sequence[int],
    test: LeadTest = DEFAULT_LEAD_TEST,
    blocks: BlockLead | None = None,
) -> tuple[str, int] | None:
    """The stage below the top one that the profiler router captures, and its leading rank:
    ``steady_lead_below_top`` by ``test.min_share``, and, where ``d [N, R, S]`` holds the
    ranks' columns (``rank_ids``), that rank's time in the stage exceeding the rank of median
    time in it by ``test`` (``LeadTest.excess``), judged by the test's gates. Failing that,
    ``blocks``: a stage of the routing set below the top one whose lead was judged over blocks
    of steps (a DataLoader's bursts, ``window.loader.data_block_lead``) and names one rank
    steadily there, its excess judged over the same blocks. The window line names this lead
    and the router acts on it: one judgment. None when there is none, and, as the router asks
    for no capture then, when the telemetry is limited or the top stage falls short of
    ``share_dominance`` with more than two stages in the routing set."""
    routed = routed_lead_and_burst(report, d, rank_ids, test, blocks)
    return None if routed is None else (routed[0], routed[1])


def routed_lead_and_burst(
    report: WindowReport,
    d: npt.NDArray[np.float64] | None,
    rank_ids: Sequence[int],
    test: LeadTest = DEFAULT_LEAD_TEST,
    blocks: BlockLead | None = None,
) -> tuple[str, int, int] | None:
    """``routed_lead_below_top`` with the steps over which its lead was judged: 1, or the
    size of the ``blocks`` it was judged over."""
    g = test.gates or report.gates
    top = report.top1
    if report.has(TELEMETRY_LIMITED) or top is None or not report.shares_defined:
        return None
    if report.semantic_shares[top] < g.share_dominance and len(report.routing_set) > 2:
        return None
    candidates = []
    below = steady_lead_below_top(report, test.min_share, g)
    suspect = None if below is None else report.semantic_localization[below].leader_rank
    if below is not None and suspect is not None:
        candidates.append((below, suspect, 1))
    if _steady_below(report, blocks, g):
        assert blocks is not None and blocks.rank is not None  # checked by _steady_below
        candidates.append((blocks.stage, blocks.rank, blocks.size))
    for stage, rank, burst in candidates:
        if d is not None and d.shape[1] == len(rank_ids) > 1:
            reference = median_reference(d, report.stages, rank_ids, stage, rank)
            step_s = report.exposed_s / report.n_steps
            excess = test.excess(
                d, report.stages, rank_ids, stage, (rank, reference), burst, step_s
            )
            if excess.stands_out:
                return stage, rank, burst
        elif burst == 1:  # a lead over blocks is judged against the blocks' noise, or not at all
            return stage, rank, burst
    return None


def _steady_below(report: WindowReport, blocks: BlockLead | None, g: Gates) -> bool:
    """Whether ``blocks`` names one rank steadily in a stage of the routing set below a top
    stage whose own lead is unsteady step by step."""
    top = report.top1
    if blocks is None or blocks.why or blocks.rank is None or top is None:
        return False
    if blocks.stage == top or blocks.stage not in report.routing_set:
        return False
    n = report.n_steps
    return bool(unsteady_lead(report.semantic_localization[top], n, report.exposed_s / n, g, top))


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
