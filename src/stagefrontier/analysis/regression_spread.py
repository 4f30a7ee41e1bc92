"""Whether a regression's growth is spread over the ranks, as a slowdown of the whole job's is
(a noisy neighbour, CPU throttling, a slower shared resource), or sits on the ranks a stall
holds up (``analysis.regression`` places a flagged window with it; ``analysis.gate`` too).

A rank that stalls in its stages holds the others up only in the collectives they meet it in (a
DDP backward's all-reduce, the buffers' broadcast in rank 0's forward), so their growth sits in
one or two stages while the stalled rank grew in its own. A neighbour burning CPU slows every
rank's compute, unevenly over ranks and stages: each rank grows in several stages.
"""

from __future__ import annotations

from .compare import Comparison
from .semantic import stage_groups

SPREAD_SHARE = 0.5
"""A rank counts among those a whole-job slowdown spread over when its own time in the top stage
grew by at least this share of the most any rank's did (``spread_over_ranks``)."""
EVERY_RANK_SHARE = 0.1
"""A slowdown is spread as well when every rank grew by at least this share of the most any
rank's did: a neighbour burning CPU slows every rank, unevenly (seen: the least grown at 0.39
of the most), where a straggler's peers, waiting in a collective, grow outside it by noise
(seen: 0.001 of the straggler's growth)."""
MATERIAL_SHARE = 0.25
"""Where one stage grew beyond its even share, the ranks' growth outside their own largest stage
must reach this share of that stage's growth on the frontier for the slowdown to be the whole
job's (``spread_beyond_stage``): a stall's waiting peers grow outside it by noise."""


def spread_over_ranks(rank_deltas: dict[str, float], n_ranks: int) -> bool:
    """Whether a slowdown grew on enough ranks to be the whole job's: more than half the ranks,
    and two at least, grew by half the most any rank did, or every rank grew by
    ``EVERY_RANK_SHARE`` of it (an uneven neighbour: known only where every rank's growth is)
    (``rank_deltas``: each rank's growth, the largest ones where a summary kept only those).
    One rank's data alone cannot tell, so it is spread."""
    deltas = sorted(rank_deltas.values(), reverse=True)
    if n_ranks < 2 or not deltas or deltas[0] <= 0:
        return True
    grown = sum(1 for delta in deltas if delta >= SPREAD_SHARE * deltas[0])
    if grown >= max(2, n_ranks // 2 + 1):
        return True
    return len(deltas) >= n_ranks and deltas[-1] >= EVERY_RANK_SHARE * deltas[0]


def _growth(result: Comparison) -> dict[str, list[float]]:
    """Each rank's own growth (ms/step, at least 0) per broad stage (``stage_groups``)."""
    members = stage_groups(result.stages)[1]
    growth: dict[str, list[float]] = {}
    for row in result.rank_deltas:
        own = row["delta_ms_per_step"]
        growth[str(row["rank"])] = [
            max(sum(own[result.stages[j]] for j in group), 0.0) for group in members
        ]
    return growth


def _outside(growth: dict[str, list[float]]) -> dict[str, float]:
    """What each rank grew outside its own largest broad stage: its spread growth."""
    return {rank: sum(g) - max(g) for rank, g in growth.items()}


def rank_spread(result: Comparison, n_ranks: int) -> tuple[bool, str]:
    """Whether a slowdown that grew every stage with the step is spread over the ranks as well,
    and the stage to name: spread when more than half the ranks (two at least) grew outside
    their largest stage by half the most any rank did, or every rank by a tenth of it
    (``spread_over_ranks``). Where it is not, the stage named is, of those where the rank that
    grew most outside its largest stage grew beyond every other rank (by half the most it did
    in any), the one that grew most on the frontier; where no rank grew materially outside its
    largest stage (less than ``MATERIAL_SHARE`` of the frontier's largest growth), the ranks grew
    in one stage, which is named: the others' growth is noise (a rank late into backward's
    last all-reduce and its peers waiting there once named the optimizer's 2 ms)."""
    names, members = stage_groups(result.stages)
    growth = _growth(result)
    outside = _outside(growth)
    if spread_over_ranks(outside, n_ranks):
        return True, result.top_stage
    if (
        max(outside.values(), default=0.0)
        < MATERIAL_SHARE * result.delta_advance_ms[result.top_stage]
    ):
        return False, result.top_stage
    rank = max(outside, key=lambda r: outside[r])
    others = [g for r, g in growth.items() if r != rank] or [[0.0] * len(names)]
    beyond = [growth[rank][k] - max(g[k] for g in others) for k in range(len(names))]
    alone = [k for k in range(len(names)) if beyond[k] >= SPREAD_SHARE * max(beyond)]
    # of the stages it grew in alone, the one (and its substage) that grew most on the frontier
    stages = [result.stages[j] for k in alone for j in members[k]]
    return False, max(stages, key=lambda stage: result.delta_advance_ms[stage])


def spread_beyond_stage(result: Comparison, n_ranks: int, top: str) -> bool:
    """Whether a slowdown in which stage ``top`` grew beyond its even share is still the whole
    job's, as a neighbour's is: every rank's own time in ``top``'s broad stage grew
    (``spread_over_ranks`` of it), their growth outside their own largest stage is spread over
    the ranks too (``rank_spread``), and it is material: the most any rank grew there is at
    least ``MATERIAL_SHARE`` of ``top``'s growth on the frontier. A stall grows its own rank's
    stage, and its waiting peers' collectives, in one stage each."""
    members = stage_groups(result.stages)[1]
    growth = _growth(result)
    outside = _outside(growth)
    if not growth or not spread_over_ranks(outside, n_ranks):
        return False
    if max(outside.values()) < MATERIAL_SHARE * result.delta_advance_ms[top]:
        return False
    k = next(k for k, group in enumerate(members) if result.stages.index(top) in group)
    return spread_over_ranks({rank: g[k] for rank, g in growth.items()}, n_ranks)
