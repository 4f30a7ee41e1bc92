"""The verdict: a short plain statement per window, built from its labels, never claiming more.

It says what the top stage costs per step, which rank (or node) sets it, where the other ranks
make up the gap, and what to profile. A direct exposure is a profiling target; a sync-wait label
(the wait model asserted by the caller) says the others wait; ``co_critical`` keeps the causal
reading open and says why; telemetry, role and accumulation limits are stated first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.across_roles import bounding_role
from ..analysis.block_lead import steady_lead_below_top
from ..analysis.labels import (
    CO_CRITICAL,
    DIRECT_EXPOSURE,
    GRADIENT_ACCUMULATION_AMBIGUOUS,
    LIKELY_SYNC_WAIT,
    SYNC_WAIT_DEPENDENT,
    TELEMETRY_LIMITED,
)
from ..analysis.leaders import MIN_LEAD_STEPS, lead_switches, single_leader
from ..analysis.schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
    semantic_stage,
)
from ..analysis.window_report import WindowReport
from .communication import (
    SLOW_NEXT,
    before_first_layer,
    late_finding,
    late_rank,
    slow_collective,
    slow_finding,
    starved_note,
)
from .escape import printable
from .loader_text import block_leader, window_loader_sentence

PLAIN_NAMES = {
    DATA_STAGE: "data loading",
    FORWARD_STAGE: "forward+loss",
    BACKWARD_STAGE: "backward",
    CALLBACKS_STAGE: "callbacks",
    OPTIMIZER_STAGE: "the optimizer step",
    RESIDUAL_STAGE: "untimed step time",
}
"""What a person calls the default stages; other stage names are used as they are."""


def plain(stage: str) -> str:
    return PLAIN_NAMES.get(stage, stage)


def both_names(stage: str) -> str:
    """``data loading (data.next_wait)``: the plain name and the stage's own, or the one name
    when they are the same."""
    return plain(stage) if plain(stage) == stage else f"{plain(stage)} ({stage})"


def listing(stages: Sequence[str]) -> str:
    """``backward``, ``forward+loss and backward``, ``a, b and c``: plain names, joined."""
    names = [plain(s) for s in stages]
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def ranks_text(ranks: Sequence[int]) -> str:
    """``[3, 1, 2, 0] -> "0-3"``, ``[1, 4, 5] -> "1,4-5"``: sorted, runs collapsed."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


MAX_RANK_RUNS = 4
"""A rank list of more runs than this is said as a count (``230 of 256 ranks``)."""


def ranks_phrase(ranks: Sequence[int], n_ranks: int) -> str:
    """``ranks 0-3``, ``ranks 1,4-5``, or ``230 of 256 ranks`` when naming them all would take
    more than ``MAX_RANK_RUNS`` runs (a 256-rank job whose lead is spread over most ranks)."""
    text = ranks_text(ranks)
    if text.count(",") >= MAX_RANK_RUNS:
        return f"{len(set(ranks))} of {n_ranks} ranks"
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + text


def lead_below_top(report: WindowReport, record: Mapping[str, Any]) -> tuple[str, int] | None:
    """The stage below the top one that one rank leads and the profiler router captures, and
    that rank: the record's ``lead_below_top`` (judged on rank 0 by the router's own settings,
    ``block_lead.routed_lead_below_top``); for a record written before it was kept, judged from
    the report alone with the default settings."""
    if "lead_below_top" not in record:
        stage = steady_lead_below_top(report)
        rank = None if stage is None else report.semantic_localization[stage].leader_rank
        return None if stage is None or rank is None else (stage, rank)
    stored = record["lead_below_top"]
    return None if stored is None else (str(stored["stage"]), int(stored["rank"]))


def routed_below(report: WindowReport, record: Mapping[str, Any]) -> tuple[str, list[int]] | None:
    """The stage below the top one the window names, with its rank (``lead_below_top``), when
    no rank or node is named for the top stage; None otherwise."""
    top = report.top1
    if top is None or not report.shares_defined or _lead(report, record, top).who:
        return None
    below = lead_below_top(report, record)
    return None if below is None else (below[0], [below[1]])


def block_note(record: Mapping[str, Any], stage: str) -> str:
    """``rank 2 leads over blocks of 2 steps: ...`` when the lead is judged over blocks."""
    lead = block_leader(record, stage)
    if lead is None:
        return ""
    rank, size = lead
    name = rank_name(rank, record)
    return (
        f"{name[0].upper()}{name[1:]} leads over blocks of {size} steps: its {size} DataLoader "
        f"workers hand over their batches {size} at a time, so its wait falls on one step in "
        f"{size} and step by step the lead seems to pass between ranks."
    )


def rank_name(rank: int, record: Mapping[str, Any]) -> str:
    """``rank 2@node7``; just ``rank 2`` when the host is unknown or the job runs on one host.
    ``record`` is a window's ``windows.jsonl`` object or packet metadata (``hosts``)."""
    hosts = record.get("hosts")
    if not isinstance(hosts, Mapping) or len(set(hosts.values())) < 2:
        return f"rank {rank}"
    host = hosts.get(str(rank))
    return f"rank {rank}@{host}" if host else f"rank {rank}"


def node_lead(record: Mapping[str, Any]) -> tuple[str, list[int]] | None:
    """The host and ranks when the top stage's leading ranks all run on one node of a
    multi-host job (the record's ``lead`` scope ``node``); None otherwise."""
    lead = record.get("lead")
    if isinstance(lead, Mapping) and lead.get("scope") == "node":
        return str(lead["hosts"][0]), sorted(lead["ranks"])
    return None


def ms(value: float) -> str:
    """Milliseconds as a verdict says them: whole above 10 ms, one decimal below."""
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


@dataclass(frozen=True)
class Said:
    """A verdict in its parts: what it finds, the next step (empty when there is none to take)
    and what it adds after that step (why a label was chosen, the DataLoader's figures)."""

    finding: str
    next_step: str = ""
    after: str = ""

    def text(self) -> str:
        said = self.finding + (f". Next: {self.next_step}." if self.next_step else ".")
        return said + (f" {self.after}" if self.after else "")


def verdict(report: WindowReport, record: Mapping[str, Any] | None = None) -> str:
    """The plain verdict (a sentence or three) that ends every window line and report.
    ``record`` is the window's ``windows.jsonl`` object or packet metadata, for hosts and the
    lead scope; without it ranks are named without hosts."""
    caveats = _caveats(report) if report.shares_defined else ""
    text = caveats + verdict_parts(report, record).text()
    return printable(text[0].upper() + text[1:])


def next_step(report: WindowReport, record: Mapping[str, Any] | None = None) -> str:
    """The verdict's next step alone (``profile data loading (data.next_wait) on rank 2``);
    empty when the verdict names none."""
    return printable(verdict_parts(report, record).next_step)


def verdict_parts(report: WindowReport, record: Mapping[str, Any] | None = None) -> Said:
    """The verdict without its caveats, in its parts."""
    record = record or {}
    if not report.shares_defined:
        return Said("no exposed step time in this window: nothing to attribute")
    if report.top1 is None:
        return _roles_verdict(report, record)
    said = _main_verdict(report, record)
    lead = _lead(report, record, report.top1)
    stepwise = single_leader(report, report.top1) is not None
    # The DataLoader's figures of the rank the finding names, never of a rank it does not
    routed = routed_below(report, record)
    stage, named = (report.top1, lead.ranks if lead.who else []) if routed is None else routed
    extras = (
        said.after,
        "" if stepwise else block_note(record, report.top1),
        window_loader_sentence(record, stage, list(named)),
        starved_note(record, report.top1, plain(report.top1)),
    )
    return Said(said.finding, said.next_step, " ".join(extra for extra in extras if extra))


def _roles_verdict(report: WindowReport, record: Mapping[str, Any]) -> Said:
    """Each role's top stage and leader, then which role bounds the step, or why that is open."""
    tops = []
    for role, rep in (report.role_reports or {}).items():
        top = rep.top1
        if top is None or not rep.shares_defined:
            tops.append(f"{role}: no exposed time")
            continue
        leader = single_leader(rep, top)
        who = "no single leader" if leader is None else f"led by {rank_name(leader, record)}"
        tops.append(f"{role}: {plain(top)} {rep.semantic_shares[top]:.0%}, {who}")
    text = "ranks play different roles, so no global verdict: per role, " + "; ".join(tops)
    bound = bounding_role(report)
    if bound is None:
        return Said(text)
    if bound.role is None:
        return Said(f"{text}. Which role the others wait for is open: {bound.reason}")
    top = (report.role_reports or {})[bound.role].top1
    named = (
        "its top stage"
        if top is None
        else (plain(top) if plain(top) == top else f"{plain(top)} ({top})")
    )
    return Said(
        f"{text}. {bound.role} bounds the step: {bound.reason}",
        f"profile {named} within {bound.role}",
    )


def _caveats(report: WindowReport) -> str:
    notes = []
    if report.n_ranks > 1 and report.n_steps < MIN_LEAD_STEPS:
        notes.append(
            f"this window holds only {report.n_steps} step{'s' if report.n_steps > 1 else ''}, "
            "too few to name a leading rank, so treat this as provisional"
        )
    if report.has(TELEMETRY_LIMITED):
        first = report.reasons.get(TELEMETRY_LIMITED, ["incomplete telemetry"])[0]
        notes.append(f"telemetry is incomplete ({first}), so treat this as provisional")
    if report.has(GRADIENT_ACCUMULATION_AMBIGUOUS):
        notes.append("accumulation microsteps were mixed, so data and backward waits blur")
    return "".join(f"{note}; " for note in notes)


def _main_verdict(report: WindowReport, record: Mapping[str, Any]) -> Said:
    top = str(report.top1)
    step_ms = report.mean_step_s * 1e3
    share = report.semantic_shares[top]
    cost = f"~{ms(share * step_ms)} ms of the {ms(step_ms)} ms step ({share:.0%})"
    cost += _microstep_note(report, top)
    late = late_rank(record, top)
    if late is not None:  # measured in the collectives: the late rank, whatever the lead
        finding = late_finding(late, plain(top), full=True)
        return Said(f"{finding}; {plain(top)} costs {cost}", _late_next(late, top))
    slow = slow_collective(record, top)
    if slow is not None:
        return Said(f"{slow_finding(slow, full=True)}; {plain(top)} costs {cost}", SLOW_NEXT)
    lead = _lead(report, record, top)
    routed = routed_below(report, record)
    if routed is not None:  # the stage the router captures (``route.decide``)
        below, who = routed[0], rank_name(routed[1][0], record)
        below_share = report.semantic_shares[below]
        block = block_leader(record, below)
        how = f"over blocks of {block[1]} steps" if block else _behind(report, below)
        return Said(
            f"no single rank leads {plain(top)}, which takes {cost}, but {who} alone leads "
            f"{plain(below)} ({below_share:.0%} of the step), {how}",
            f"profile {both_names(below)} on {who}",
            block_note(record, below),
        )
    target = f"profile {both_names(top)} " + (f"on {lead.who}" if lead.who else "on any rank")
    if report.has(LIKELY_SYNC_WAIT) or report.has(SYNC_WAIT_DEPENDENT):
        waits = _wait_stages(report, top)
        return Said(
            f"{lead.who or 'the leading rank'}'s {plain(top)} holds every rank back by "
            f"{_behind(report, top)}; it costs {cost}"
            + (f" and the others wait in {waits}" if waits else ""),
            target,
        )
    if report.has(DIRECT_EXPOSURE):
        gain = report.semantic_gain[top] * step_ms
        what = f"{lead.who}'s {plain(top)}" if lead.who else f"the {plain(top)} stage"
        return Said(
            f"{what} costs {cost}; clipping it to its usual duration would save "
            f"~{ms(gain)} ms/step",
            target,
        )
    if report.has(CO_CRITICAL):
        return _co_critical_verdict(report, record, top, cost, lead, target)
    if share > report.gates.share_dominance:  # strong labels withheld by the limits above
        return Said(f"{plain(top)} takes {cost}", target)
    stages = ", ".join(f"{plain(s)} {report.semantic_shares[s]:.0%}" for s in report.routing_set)
    return Said(
        f"no stage dominates the {ms(step_ms)} ms step ({stages})",
        f"profile {listing(report.routing_set)}",
    )


def _late_next(late: Mapping[str, Any], top: str) -> str:
    """Profile the stage on the late rank; with the stage before it when the rank was late
    into its first FSDP2 all-gather (its data loading, or forward before the first layer)."""
    where = both_names(top)
    if before_first_layer(late) and top != DATA_STAGE:
        where = f"{both_names(DATA_STAGE)} and {where}"
    return f"profile {where} on rank {late['late_rank']}"


def _co_critical_verdict(
    report: WindowReport, record: Mapping[str, Any], top: str, cost: str, lead: _Lead, target: str
) -> Said:
    loc = report.semantic_localization[top]
    steady = bool(lead.who) and loc.delta_lag_mean_s >= report.gates.share_tie * report.mean_step_s
    if steady:
        waits = _wait_stages(report, top)
        return Said(
            f"{lead.who}'s {plain(top)} runs {_behind(report, top)}; {plain(top)}, which "
            f"{lead.who} finishes last, accounts for {cost}"
            + (
                f"; the other ranks make up the gap in {waits}, most likely waiting for it"
                if waits
                else ""
            ),
            target,
            _steady_caveat(report, record, top, lead.who),
        )
    spread = _end_lag_ms(report)
    quiet = spread < report.gates.share_tie * report.mean_step_s * 1e3
    others = [s for s in report.co_critical_stages if s != top]
    named = listing([top, *others])
    if len(lead.ranks) > 1:
        how = "alternate at the front of" if lead.switching else "share the lead in"
        return Said(
            f"no single rank leads: {ranks_phrase(lead.ranks, report.n_ranks)} {how} "
            f"{plain(top)}, which "
            f"takes {cost}"
            + (f", with {listing(others)} close behind" if others else "")
            + (
                f"; ranks end their steps within ~{ms(spread)} ms of the median rank, so no "
                "rank holds the others back"
                if quiet
                else ""
            ),
            f"profile {named} on any rank to shorten the step",
        )
    if quiet or report.n_ranks == 1:
        gain = report.semantic_gain[top]
        behind = f", with {listing(others)} close behind," if others else ""
        opening = (
            "a single rank, so no rank can hold others back: "
            if report.n_ranks == 1
            else f"nothing stalls (ranks end their steps within ~{ms(spread)} ms of the median "
            "rank): "
        )
        return Said(
            f"{opening}{plain(top)} takes {cost}{behind} at about its usual duration (clipping "
            f"it to that removes {gain:.0%})",
            f"profile {named} to shorten the step",
        )
    if others:
        return Said(
            f"{plain(top)} takes {cost}, but {named} stay jointly plausible bottlenecks "
            f"({_short_cause(report)})",
            f"profile {named}",
        )
    return Said(f"{plain(top)} takes {cost} ({_short_cause(report)})", target)


def _baseline_windows(record: Mapping[str, Any]) -> str:
    """``windows 0-1``: the healthy windows the live analysis clipped the gains to; empty when
    the record does not say."""
    windows = record.get("gain_reference_windows")
    if not (isinstance(windows, Sequence) and len(windows) == 2):
        return ""
    first, last = windows
    return f"window {first}" if first == last else f"windows {first}-{last}"


def _steady_caveat(report: WindowReport, record: Mapping[str, Any], top: str, who: str) -> str:
    """Why a clear, steady one-rank stall is labeled ``co_critical`` rather than a wait or a
    direct exposure, said after the finding. When rank 0's live analysis clipped to the run's
    baseline windows (``gain_reference_windows``), the sentence names them: a stall present
    from the run's start is in that baseline too, so it is no stall-free reference."""
    gain = report.semantic_gain[top]
    g = report.gates
    if gain >= g.gain_threshold or top in g.model_fit_stages:
        return f"Why co_critical: {_short_cause(report)}."
    if g.gain_baseline == "rank_median":
        low = (
            f"the stall is steady, so it is {who}'s usual time and clipping each rank to its own "
            "median removes nothing"
        )
    elif g.gain_baseline == "reference" and _baseline_windows(record):
        low = (
            f"the run's baseline ({_baseline_windows(record)}) already had it: clipping each "
            "rank to its durations there removes little"
        )
    else:
        low = (
            "clipping it to "
            + (
                "the no-stall reference durations"
                if g.gain_baseline == "reference"
                else "the median rank's durations"
            )
            + " removes little"
        )
    return (
        f"Why co_critical, not a proven wait: no wait model is declared for {plain(top)} "
        f"(Gates.model_fit_stages), and its direct gain is only {gain:.0%} because {low}."
    )


@dataclass(frozen=True)
class _Lead:
    """Who sets the top stage: ``who`` names one rank or a node, and is empty when several
    ranks share the lead or it keeps changing hands."""

    who: str
    ranks: list[int]
    switching: bool


def _lead(report: WindowReport, record: Mapping[str, Any], top: str) -> _Lead:
    loc = report.semantic_localization[top]
    ranks = loc.leading_ranks or ([] if loc.leader_rank is None else [loc.leader_rank])
    switching = report.n_ranks > 1 and lead_switches(loc, report.n_steps, report.gates)
    node = node_lead(record)
    if node is not None:
        return _Lead(f"node {node[0]} (ranks {ranks_text(node[1])})", ranks, False)
    leader = single_leader(report, top)
    if leader is not None:
        return _Lead(rank_name(leader, record), [leader], False)
    block = block_leader(record, top)
    if block is not None:  # the lead over a DataLoader's bursts, as the router judges it
        return _Lead(rank_name(block[0], record), [block[0]], False)
    return _Lead("", ranks, switching)


def _microstep_note(report: WindowReport, stage: str) -> str:
    """``, most of it in microstep 2`` when one accumulation microstep carries more than half
    of a broad stage's share; empty otherwise."""
    parts = {
        name: report.shares[name]
        for name in report.stages
        if name != stage and semantic_stage(name) == stage
    }
    total = report.semantic_shares[stage]
    if len(parts) < 2 or total <= 0:
        return ""
    name = max(parts, key=parts.__getitem__)
    if parts[name] <= total / 2:
        return ""
    return f", most of it in microstep {name[len(stage) + 1 : -1]}"


def _behind(report: WindowReport, stage: str) -> str:
    lag = report.semantic_localization[stage].delta_lag_mean_s
    return f"~{ms(lag * 1e3)} ms/step behind the median rank"


def _wait_stages(report: WindowReport, top: str) -> str:
    """The later stages in which the median rank closes at least a quarter of the lag the top
    stage opened (where the other ranks' waiting shows up), largest first; empty if none."""
    loc = report.semantic_localization
    stages = list(loc)
    growth = loc[top].delta_lag_mean_s
    closing = [
        s for s in stages[stages.index(top) + 1 :] if -loc[s].delta_lag_mean_s >= 0.25 * growth
    ]
    closing.sort(key=lambda s: loc[s].delta_lag_mean_s)
    return listing(closing) if growth > 0 else ""


def _end_lag_ms(report: WindowReport) -> float:
    """How far, on average, the last rank ends its step after the median rank."""
    last = report.stages[-1]
    return report.localization[last].lag_mean_s * 1e3


def _short_cause(report: WindowReport) -> str:
    """The short causes the labeler gave for withholding direct_exposure on co_critical."""
    prefix = "not emitted: co_critical: "
    for reason in report.reasons.get(DIRECT_EXPOSURE, []):
        if reason.startswith(prefix):
            return reason[len(prefix) :]
    return "the evidence does not single it out"
