"""Is an analyzed window worth a heavy trace, on which ranks, and from which step?

A window is actionable when its telemetry is complete (no ``telemetry_limited``), one stage
stands out (its share reaches ``Gates.share_dominance``, or the routing set has at most two
stages) and that stage has a confident, stable leader that pulls ahead of the other ranks: it
leads alone in at least ``min_confident_fraction`` of the steps, switches no more often than
``max_switch_rate``, and its lag over the median rank grows within the stage by at least
``share_tie`` of the step (so a healthy run's jitter, whose leader changes by chance, opens
nothing). When the top stage has no such leader, the largest other stage of the routing set
that has one by a lead that matters and stands above the noise is routed instead
(``block_lead.routed_lead_below_top``, the judgment the window line states): one rank's data
wait in every accumulation microstep, beside a backward pass whose lead passes between ranks;
or the data wait of a rank whose DataLoader workers hand over their batches in bursts, its lead
judged over blocks of as many steps as it has workers (``window.loader.data_block_lead``): on
a busy machine the backward every rank shares can outgrow one rank's slow workers.
The suspect rank is that leader; the reference rank is the rank whose total time in the stage
is the median of the other ranks (under hierarchical collection, where rank 0 has no rank
columns, the typical rank the node parts carry: ``typical_reference``).

A window the live regression check flags (``analysis.regression``) asks for a capture even when
no rank leads: ``regression_decision`` names the ranks whose own time in the grown stage grew
most, and a rank that did not grow as the reference. A slowdown of the whole job (every stage,
or every rank, grew alike) asks for none: no rank's trace against another's can show its cause.
A rank the timed collectives name late is its suspect without the lead test below only when the
window before named the same rank late in the same stage, as ``late_rank_decision`` asks.

Both act only on a difference that is material and above the run's noise
(``analysis.noise``): the suspect's time in the stage minus the reference's, per step, must
average at least ``min_share`` of the step and stand ``noise_factor`` standard errors above zero
over the window's steps, or over its blocks of ``k`` steps when the data wait's leader has ``k``
DataLoader workers (they hand over their batches together, so however steady the stall its wait
falls on one step in ``k``, and step by step the steps between read as noise).

When ranks play different roles the decision is taken inside one role, on that role's own
report: the role named by ``role=``, or else the one the window says bounds the step
(``analysis.across_roles``). Its leader is the suspect and the reference is a rank of the same
role; a window whose bounding role is open asks for no capture.

A rank's lead in a stage holds to the regression check's rule that one slow window on a busy
machine is noise, and two in a row or a large jump are news: a lead of at least ``LARGE_JUMP``
times the bar it clears (the larger of the material floor and the noise bar) is captured at
once; a smaller one is marked ``repeat_needed``, and the policy (``route.policy``) captures it
only when the window before led to the same stage and suspect. A healthy DDP run beside
CPU-burning neighbours had rank 2's data wait 17.9 ms/step above the reference's on a 167 ms
step in one window, just over the 16.7 ms floor, and opened an incident that its trace did not
confirm. A window collected as node summaries carries no rank's steps, so no noise bar can be
read for its lead, only the material floor: any lead read from one is held to two windows in a
row. A healthy 16-rank job on a busy machine had rank 15 ahead in the forward by 63 ms/step on
275 ms steps in one window (rank 13 in the next), over twice the floor, and opened an incident.

A rank the timed collectives name late (``late_rank_decision``) is captured only when the
window before named the same rank late in the same stage, by the same memory of the window
before. It keeps no exception for a large lateness: a healthy window beside CPU-burning
neighbours named a rank 53 ms/step late on 203 ms steps, last in 11 of 20 steps, more than
twice the lateness floor, and nothing was late in the next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..analysis.across_roles import bounding_role
from ..analysis.block_lead import (
    LEAD_NOISE_FACTOR,
    MIN_LEAD_SHARE,
    LeadTest,
    median_reference,
    routed_lead_and_burst,
    unsteady_lead,
)
from ..analysis.collective_names import collective_name
from ..analysis.collectives import CollectiveReading
from ..analysis.gates import Gates
from ..analysis.labels import TELEMETRY_LIMITED
from ..analysis.regression import LARGE_JUMP, WHOLE_JOB
from ..analysis.schema import semantic_stage
from ..render.loader_text import block_lead_text
from ..window.loader import data_block_lead, loader_block_lead
from ..window.merged import AnalyzedWindow

REQUEST_LATENCY_S = 0.5
"""Allowance for a store round trip and for a busy rank's watcher thread to be scheduled."""


UNKNOWN_STEP_S = 0.1
"""The step time assumed for a manual request before any window was analyzed."""
MIN_SHARE = MIN_LEAD_SHARE
"""The least share of the step by which a suspect's time in the stage must exceed its
reference's (``ProfilerRouter.min_share``)."""
NOISE_FACTOR = LEAD_NOISE_FACTOR
"""Standard errors of the mean per-step difference it must clear
(``ProfilerRouter.noise_factor``)."""


@dataclass(frozen=True)
class Decision:
    stage: str
    suspect_rank: int
    reference_rank: int
    share: float
    window: int
    reasons: tuple[str, ...]
    role: str | None = None
    burst: int = 1
    """The steps over which the leader's DataLoader workers hand over their batches together
    (its worker count, when its lead was judged over blocks of that many steps; else 1): the
    confirmation's blocks hold at least that many captured steps."""
    below_top: bool = False
    """Whether the stage is below the window's top one (whose lead passed between ranks): the
    captured steps need not have it on top either (``confirm``)."""
    repeat_needed: str = ""
    """Why this window's lead alone opens nothing (a lead under ``LARGE_JUMP`` times the bar it
    clears, or any lead or regression read from node summaries): the policy captures it only
    when the window before named the same stage and suspect. Empty when it acts at once."""


def decide(
    window: AnalyzedWindow,
    gates: Gates | None = None,
    role: str | None = None,
    *,
    min_share: float = MIN_SHARE,
    noise_factor: float = NOISE_FACTOR,
    late_before: CollectiveReading | None = None,
) -> tuple[Decision | None, str]:
    """The capture decision for one analyzed window, or None with the reason it is not one.
    With several roles it is taken inside ``role`` (default: the role that bounds the step).
    ``late_before``: the late rank the timed collectives named in the window just before
    (``CommunicationReading.late``), without which no late rank is captured."""
    report = window.report
    g = gates or report.gates
    regression = window.regression or {}
    if regression.get("kind") == WHOLE_JOB and regression.get("all_ranks", True):
        # every rank slowed alike; a slowdown concentrated on some ranks is left to the lead
        # test below, which names a rank only on a material lead above the window's noise
        return None, "the whole job slowed evenly: no rank's trace can show the cause"
    ranks = [w.rank for w in window.merged.ranks]
    positions = list(range(len(ranks)))
    if report.role_reports and window.summary is not None:
        return None, (
            "ranks play roles and the window came as node summaries, which carry no typical "
            "rank per role to serve as the reference"
        )
    if report.role_reports:
        bound = bounding_role(report)
        role = role or (bound.role if bound is not None else None)
        if role is None:
            return None, "ranks play different roles, and which bounds the step is open"
        if role not in report.role_reports:
            return None, f"no rank of role {role} in this window"
        positions = [i for i, x in enumerate(report.roles or ()) if x == role]
        report = report.role_reports[role]
    analyzed = len(positions) if window.summary is None else window.summary.n_ranks
    if analyzed < 2:
        return None, "fewer than two ranks analyzed" + (f" in role {role}" if role else "")
    if report.has(TELEMETRY_LIMITED):
        return None, "telemetry_limited"
    stage = report.top1  # a broad stage: accumulation substages ``name[i]`` fold into it
    if stage is None or not report.shares_defined:
        return None, "no top stage"
    share = report.semantic_shares[stage]
    if share < g.share_dominance and len(report.routing_set) > 2:
        return None, (
            f"{stage} has {share:.0%} < {g.share_dominance:.0%} and the routing set has "
            f"{len(report.routing_set)} stages"
        )
    late_why = ""
    if not report.role_reports and window.summary is None:
        measured, late_why = late_rank_decision(window, stage, share, ranks, late_before)
        if measured is not None:
            return measured, ""
    loc = report.semantic_localization[stage]
    n = report.n_steps
    why = unsteady_lead(loc, n, report.exposed_s / n, g, stage)
    blocked: tuple[str, ...] = ()
    # A leader whose k DataLoader workers hand over their batches together waits on one step
    # in k: an unsteady lead is judged again over blocks of k steps, and the excess always is.
    data_block = data_block_lead(window.merged.ranks, window.d, report, g, positions)
    block = data_block if data_block is not None and data_block.stage == stage else None
    if why and block is not None:
        if block.why or block.rank != loc.leader_rank:
            return None, (
                f"{why}; over blocks of {block.size} steps, {block.why or 'another leader'}"
            )
        why = ""
        blocked = (block_lead_text(block),)
    elif block is not None:
        blocked = (f"its excess over the reference judged over blocks of {block.size} steps",)
    test = LeadTest(min_share, noise_factor, g)
    d = window.d[:, positions] if window.summary is None else None
    ids = [ranks[i] for i in positions]
    below = routed_lead_and_burst(report, d, ids, test, data_block) if why else None
    suspect = loc.leader_rank  # the report names ranks by number, not by column
    if below is not None:  # the top stage's lead passes between ranks; one leads this one
        blocked = (f"{stage}, on top, has no steady leader ({why})",)
        stage, suspect, why = below[0], below[1], ""
        loc, share = report.semantic_localization[stage], report.semantic_shares[stage]
        if below[2] > 1 and data_block is not None:
            block = data_block  # its lead and its excess judged over the loader's bursts
            blocked = (*blocked, block_lead_text(block))
    if why or suspect is None:
        return None, "; ".join(x for x in (late_why, why) if x)
    if d is not None:
        reference = median_reference(d, report.stages, ids, stage, suspect)
        chosen = f"the median total time in {stage} among the other ranks"
        burst = block.size if block is not None else 1
        pair, step_s = (suspect, reference), report.exposed_s / n
        excess = test.excess(d, report.stages, ids, stage, pair, burst, step_s)
        if not excess.stands_out:
            return None, (
                f"rank {suspect} exceeds reference rank {reference} in {stage} by "
                f"{excess.shift_s * 1e3:.1f} ms/step, {excess.shortfall()}"
            )
        lead_s, bar_s = excess.shift_s, excess.threshold_s
        led = f"rank {suspect} exceeds reference rank {reference} in {stage} by"
    else:
        reference, chosen = typical_reference(window, stage, suspect)
        lead_s, bar_s = loc.delta_lag_mean_s, min_share * report.exposed_s / n
        led = f"rank {suspect} pulls ahead of the median in {stage} by"
    repeat = ""
    if lead_s <= LARGE_JUMP * bar_s:
        repeat = (
            f"{led} {lead_s * 1e3:.1f} ms/step, under {LARGE_JUMP:g} times the "
            f"{bar_s * 1e3:.1f} ms it must clear"
        )
    elif d is None:
        repeat = (
            f"{led} {lead_s * 1e3:.1f} ms/step, read from node summaries, which carry no rank's "
            "steps to judge it against their noise"
        )
    reasons: tuple[str, ...] = (
        f"{stage} {share:.0%} of exposed time (routing set {'+'.join(report.routing_set)})",
        f"rank {suspect} leads it alone in {loc.confident_steps}/{n} steps and pulls ahead of "
        f"the median by {loc.delta_lag_mean_s * 1e3:.1f} ms/step",
        f"reference rank {reference}: {chosen}",
        *blocked,
    )
    if role is not None:
        reasons = (f"inside role {role}, on its own report", *reasons)
    index = window.merged.reference.window
    burst = block.size if block is not None else 1
    return Decision(
        stage, suspect, reference, share, index, reasons, role, burst, below is not None, repeat
    ), ""


def late_rank_decision(
    window: AnalyzedWindow,
    stage: str,
    share: float,
    ranks: list[int],
    before: CollectiveReading | None,
) -> tuple[Decision | None, str]:
    """The capture of the rank the timed collectives name late in ``stage``
    (``analysis.collectives``), against the rank of median time in it among the others: the
    stage matrix cannot name it when the others wait inside the same stage (DDP's all-reduce
    in backward). Only when ``before``, the window just before's late rank, is the same rank
    in the same stage; otherwise None, with why when a rank was late in this window alone."""
    reading = window.communication
    late = None if reading is None else reading.late
    if late is None or late.stage is None or semantic_stage(late.stage) != stage:
        return None, ""
    suspect = int(late.late_rank)  # type: ignore[arg-type]
    if (
        before is None
        or before.late_rank != suspect
        or before.stage is None
        or semantic_stage(before.stage) != stage
    ):
        return None, (
            f"rank {suspect} arrives late into {late.stage} in this window but was not late "
            "into it in the window before (a late rank is captured two windows in a row)"
        )
    reference = median_reference(window.d, window.report.stages, ranks, stage, suspect)
    reasons = (
        f"{stage} {share:.0%} of exposed time",
        f"rank {suspect} arrives at {collective_name(late.family, late.bucket)} in "
        f"{late.stage} ~{late.lateness_ms:.0f} ms/step after the others (last in "
        f"{late.late_steps}/{late.steps} steps), the others timed waiting for it there",
        f"late into {stage} in the window before too (~{before.lateness_ms:.0f} ms/step, last "
        f"in {before.late_steps}/{before.steps} steps): two windows in a row",
        f"reference rank {reference}: the median total time in {stage} among the other ranks",
    )
    index = window.merged.reference.window
    return Decision(stage, suspect, reference, share, index, reasons), ""


def typical_reference(window: AnalyzedWindow, stage: str, suspect: int) -> tuple[int, str]:
    """Under hierarchical collection, the reference rank and how it was chosen: the rank of
    typical time in ``stage`` that the node parts carry (a median of node medians, not the
    exact median), or, when that rank is the suspect itself, the lowest other rank."""
    typical = (window.typical_ranks or {}).get(stage)
    if typical is not None and typical != suspect:
        return typical, (
            f"a typical time in {stage}, the median of the nodes' median ranks (collected "
            "hierarchically: approximate, a median of medians)"
        )
    assert window.summary is not None  # a window collected as node summaries
    runs = window.summary.rank_runs
    first = int(runs[0, 0])
    other = first if first != suspect else first + 1 if runs[0, 1] > 1 else int(runs[1, 0])
    why = (
        "the typical rank the node parts carry is the suspect"
        if typical is not None
        else ("the node parts carry no typical rank")
    )
    return other, f"the lowest rank other than the suspect ({why})"


def start_margin(step_s: float, poll_s: float) -> int:
    """Steps between the step a request is written at and its first captured step: enough for
    every named rank's watcher to poll the store (twice over, in case a poll was just missed)
    plus the request latency, plus one step of skew between ranks and the step in progress."""
    step_s = step_s if np.isfinite(step_s) and step_s > 0 else UNKNOWN_STEP_S
    return math.ceil((2 * poll_s + REQUEST_LATENCY_S) / step_s) + 2


def regression_decision(
    window: AnalyzedWindow,
    *,
    min_share: float = MIN_SHARE,
    noise_factor: float = NOISE_FACTOR,
    late_before: CollectiveReading | None = None,
) -> tuple[Decision | None, str]:
    """The capture for a window that regressed against the run's healthy baseline (None when
    it did not, or when no trace of one rank against another can show the cause, with why): the
    regression must be localized to a stage (not a slowdown of the whole job) and to some ranks
    (not every rank alike), so that a rank that did not grow can be the reference. The suspect
    is the rank that grew most; the reference the rank that grew least. Its time in the stage
    must exceed the reference's by a material share of the step and above the window's noise,
    as a window's lead must (``LeadTest``): a busy machine slows the ranks unevenly, and one
    rank's few milliseconds more in a stage are no stall. The test is skipped only for a rank
    the timed collectives name late (the others then wait for it inside the same stage) in
    this window and in the window before (``late_before``), as ``late_rank_decision`` asks: a
    late rank in one window alone is read as though no rank were named late. From node
    summaries, which carry no rank's steps for that test, the decision is ``repeat_needed``:
    captured only when the window before named the same rank in the same stage."""
    regression = window.regression
    if not regression or regression.get("kind") == WHOLE_JOB:
        return None, ""
    late = regression.get("late")  # the timed collectives name the rank the others wait for
    if late and not _late_before_too(late, late_before):
        late = None
    if regression["all_ranks"] and not late:
        return None, "every rank grew alike"
    stage = regression["top_stage"]
    deltas = {int(rank): float(ms) for rank, ms in regression["rank_delta_ms_per_step"].items()}
    grown = [int(late["rank"])] if late else [int(rank) for rank in regression["ranks"]]
    healthy = [rank for rank in sorted(deltas, key=lambda r: deltas[r]) if rank not in grown]
    if not grown or not healthy:
        return None, "no rank that did not grow to compare with"
    suspect, reference = grown[0], healthy[0]
    broad = semantic_stage(stage)  # the traces' ranges carry the broad stage's name
    burst = 1
    if not late and window.summary is None:
        report = window.report
        block = loader_block_lead(
            window.merged.ranks, window.d, report.stages, broad, suspect, report.gates
        )
        burst = block.size if block is not None else 1
        ids, pair = [w.rank for w in window.merged.ranks], (suspect, reference)
        step_s = report.exposed_s / report.n_steps
        test = LeadTest(min_share, noise_factor)
        excess = test.excess(window.d, report.stages, ids, broad, pair, burst, step_s)
        if not excess.stands_out:
            return None, (
                f"the regression's rank {suspect} exceeds rank {reference} in {broad} by "
                f"{excess.shift_s * 1e3:.1f} ms/step, {excess.shortfall()}"
            )
    repeat = ""
    if not late and window.summary is not None:
        repeat = (
            f"the regression's rank {suspect} grew by {deltas.get(suspect, math.nan):.1f} "
            f"ms/step in {stage}, read from node summaries, which carry no rank's steps to "
            "judge it against their noise"
        )
    first, last = regression["baseline_windows"]
    reasons = (
        f"window slower than windows {first}-{last} by "
        f"{regression['delta_exposed_ms_per_step']:+.1f} ms/step, of which {stage} "
        f"{regression['delta_advance_ms_per_step'][stage]:+.1f} ms/step",
        f"rank {suspect} arrives late into {late['stage']}'s bucket {late['bucket']}, the others "
        "timed waiting for it there"
        if late
        else f"rank {suspect}'s own {stage} grew by {deltas.get(suspect, math.nan):.1f} ms/step",
        f"reference rank {reference}: the rank whose {stage} grew least in this window",
    )
    share = window.report.semantic_shares.get(broad, float("nan"))
    index = window.merged.reference.window
    return Decision(
        broad, suspect, reference, share, index, reasons, burst=burst, repeat_needed=repeat
    ), ""


def _late_before_too(late: dict[str, Any], before: CollectiveReading | None) -> bool:
    """Whether ``before``, the window just before's late rank, is the regression's late rank
    (``late``) in the same broad stage."""
    return (
        before is not None
        and before.late_rank == int(late["rank"])
        and before.stage is not None
        and semantic_stage(before.stage) == semantic_stage(late["stage"])
    )
