"""Every piece of report text: a window's details line, ``stagefrontier analyze``'s window report,
the per-window table and a run folder's report. Each ends with the verdict sentence (a window's
short headline is ``render.headline``)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..analysis.leaders import MIN_LEAD_STEPS, single_leader
from ..analysis.schema import semantic_stage
from ..analysis.window_report import WindowReport
from ..formats.wall_clock import clock_cell, run_clock, span_text
from .command import cli_command
from .communication import late_lead
from .escape import printable, printable_lines
from .loader_text import block_leader
from .regression_text import regression_text
from .run_summary import sample_note, step_span, summary_text
from .verdict import (
    node_lead,
    rank_name,
    ranks_phrase,
    ranks_text,
    verdict,
)

if TYPE_CHECKING:
    from ..formats.run_folder import RunWindows

METHOD_TITLES = {
    "stagefrontier": "frontier",
    "per_stage_max": "stage-max",
    "per_stage_mean": "stage-mean",
    "rank_spread": "spread",
    "slowest_rank": "slowest",
    "rank0_total": "rank0",
}

METHOD_NOTES = {
    "frontier": "how far each stage moves the frontier, the time by which every rank has "
    "finished that stage: the step time the stage holds all ranks back by",
    "stage-max": "the stage's time on its slowest rank",
    "stage-mean": "the stage's mean time over the ranks",
    "spread": "how far the stage's slowest rank is above the median rank",
    "slowest": "the stage times of each step's slowest rank (largest step total)",
    "rank0": "the first rank's own stage times, what a timer on rank 0 alone sees",
}
"""What each column of the report's comparison table is, by its title."""
METHOD_INTRO = "What each column is (every column adds up to 100% over the stages):"
METHOD_OUTRO = (
    "The five baselines read each rank's own times; only the frontier follows the ranks "
    "waiting for each other."
)
METHOD_LEGEND = (
    METHOD_INTRO,
    *(f"  {title:<10}  {text}" for title, text in METHOD_NOTES.items()),
    METHOD_OUTRO,
)
"""Printed under the report's comparison table."""

SELF_COST_LINE_FRACTION = 0.01
"""The window line shows StageFrontier's own cost when some rank's exceeds this fraction of its
step time (the record's ``self_cost.fraction.max``); below it the line leaves it out."""


# --- one window -----------------------------------------------------------------------------------


def window_details(report: WindowReport, record: Mapping[str, Any] | None = None) -> str:
    """Everything a window line can say, on one line (logged at DEBUG under the headline):
    ``window 3 steps 60-79 | exposed 182.9 ms/step over 20 steps | top ... | route ... | labels
    ... | verdict``; the window index, hosts, lead scope and missing ranks come from ``record`` (a
    ``windows.jsonl`` object) when given."""
    record = record or {}
    parts = [window_title(record)] if "window" in record else []
    parts.append(f"exposed {report.mean_step_s * 1e3:.1f} ms/step over {report.n_steps} steps")
    if report.top1 is not None and report.shares_defined:
        top = report.top1
        parts.append(f"top {top} {report.semantic_shares[top]:.0%} {lead_text(report, record)}")
        parts.append("route " + "+".join(report.routing_set))
    elif not report.shares_defined:
        parts.append("no exposed time: raw advances only")
    elif report.role_reports:
        parts.append("per role: " + "; ".join(role_tops(report, record)))
    parts.append("labels " + (",".join(_flags(report.labels)) or "none"))
    if not record.get("gather_ok", True):
        parts.append(f"missing ranks {record.get('missing_ranks')}")
    if record.get("regression"):
        parts.append("slower: " + regression_text(record["regression"]))
    cost = self_cost_text(record)
    if cost:
        parts.append(cost)
    parts.append(verdict(report, record))
    return printable(" | ".join(parts))


@dataclass(frozen=True)
class SelfCost:
    """What the library cost one window, as the window line and the report both state it: the
    most any rank spent per part, and the share of step time without the profiler router's
    background threads (an incident's one-off, said in the incident's own line)."""

    fraction: float
    """Of step time, on the rank where it was largest, the router's threads left out."""
    spent: dict[str, float]
    """Seconds per part: hot path, hand-off, collection (the most on any rank)."""
    capture_s: float
    """The training thread's time in profiler captures."""
    router_s: float
    """The profiler router's background threads' CPU (left out of ``fraction``)."""
    collection_s: float
    """The parts and the captures together."""


def self_cost(record: Mapping[str, Any]) -> SelfCost | None:
    """The window's :class:`SelfCost`, None when its record has none (written before it was
    kept) or its step time is unknown."""
    cost = record.get("self_cost")
    if not isinstance(cost, Mapping):
        return None

    def most(key: str) -> float:
        value = cost.get(key, {})
        return float(value.get("max", 0.0)) if isinstance(value, Mapping) else 0.0

    fraction, total = most("fraction"), most("total_s")
    parts = {"hot path": "hot_path_s", "hand-off": "handoff_s", "collection": "threads_cpu_s"}
    spent = {name: most(key) for name, key in parts.items()}
    capture_s = most("capture_s")
    collection_s = sum(spent.values()) + capture_s
    # The same step time, without the router's threads.
    share = fraction * min(1.0, collection_s / total) if fraction > 0 and total > 0 else 0.0
    return SelfCost(share, spent, capture_s, most("router_cpu_s"), collection_s)


def self_cost_text(record: Mapping[str, Any]) -> str:
    """``stagefrontier cost 1.4% of step time (up to 4.1 ms in this window on one rank; the most
    any rank spent per part: hot path 0.1 ms, ...)`` when what the collection costs exceeds
    :data:`SELF_COST_LINE_FRACTION` of the step time, else empty. The profiler router's CPU is
    left out: an incident's capture and reduction is a one-off, said once in the incident's own
    line (``render.incident.capture_cost_text``)."""
    cost = self_cost(record)
    if cost is None or not cost.fraction > SELF_COST_LINE_FRACTION:
        return ""
    split = ", ".join(f"{name} {value * 1e3:.1f} ms" for name, value in cost.spent.items())
    if cost.capture_s > 0:
        split += f", profiler capture {cost.capture_s * 1e3:.1f} ms on the training thread"
    return (
        f"stagefrontier cost {cost.fraction:.1%} of step time (up to "
        f"{cost.collection_s * 1e3:.1f} ms in this window on one rank; the most any rank spent "
        f"per part: {split})"
    )


def role_tops(report: WindowReport, record: Mapping[str, Any] | None = None) -> list[str]:
    """Per role: ``pp1 top pp.schedule 85% led by rank 3 route pp.schedule (co_critical)``,
    the labels of the role's own report in brackets."""
    out = []
    for role, rep in (report.role_reports or {}).items():
        if rep.top1 is None or not rep.shares_defined:
            out.append(f"{role} no exposed time")
            continue
        top = rep.top1
        flags = ",".join(_flags(rep.labels))
        out.append(
            f"{role} top {top} {rep.semantic_shares[top]:.0%} {lead_text(rep, record)} "
            f"route {'+'.join(rep.routing_set)}" + (f" ({flags})" if flags else "")
        )
    return out


def lead_text(
    report: WindowReport, record: Mapping[str, Any] | None = None, short: bool = False
) -> str:
    """``led by rank 2@node7``, ``led by node-b (node-level: ranks 4,5,6,7 all on node-b)`` or
    ``rank 1 late into its last bucket`` (the collectives' late rank, ``late_lead``) or
    ``no single leader (ranks 0-3 share it)`` for the top stage; ``short`` (for a headline):
    ``led by node node-b (ranks 4-7)``, ``led by rank 2 in 2-step blocks``, ``no single
    leader``."""
    record = record or {}
    top = str(report.top1)
    node = node_lead(record)
    if node is not None:
        host, ranks = node
        if short:
            return f"led by node {host} (ranks {ranks_text(ranks)})"
        return f"led by {host} (node-level: ranks {','.join(map(str, ranks))} all on {host})"
    leader = single_leader(report, top)
    if leader is not None:
        return f"led by {rank_name(leader, record)}"
    block = block_leader(record, top)
    if block is not None:
        rank, size = rank_name(block[0], record), block[1]
        return (
            f"led by {rank} in {size}-step blocks"
            if short
            else (f"led by {rank} over blocks of {size} steps")
        )
    late = late_lead(record, top)
    if late:  # the stage's shares are alike on every rank; the collectives name who was late
        return late
    if report.n_steps < MIN_LEAD_STEPS:
        return f"no leader named over {report.n_steps} step{'s' if report.n_steps > 1 else ''}"
    loc = report.semantic_localization[top]
    ranks = loc.leading_ranks or loc.tied_ranks
    if len(ranks) == 1:  # one rank leads, but the lead keeps changing hands
        return f"no steady leader ({rank_name(ranks[0], record)} most often)"
    if short:
        return "no single leader"
    return (
        f"no single leader ({ranks_phrase(ranks, report.n_ranks)} share it)"
        if ranks
        else "no single leader"
    )


def window_report_text(
    report: WindowReport, meta: Mapping[str, Any] | None = None, notes: Sequence[str] = ()
) -> str:
    """``stagefrontier analyze``'s report: stage table, routing, labels with their reasons, the
    labels withheld and why, shares by role, what reducing a trace noted, and the verdict."""
    lines = [
        f"window: {report.n_steps} steps x {report.n_ranks} ranks x {len(report.stages)} stages, "
        f"exposed {report.exposed_s:.6g} s ({report.mean_step_s * 1e3:.3f} ms/step)"
    ]
    if meta:
        lines.append("meta: " + ", ".join(f"{k}={v}" for k, v in meta.items()))
    lines += ["", *_stage_table(report)]
    if set(report.semantic_shares) != set(report.stages):
        lines += ["", "folded by stage (accumulation substages summed):", *_semantic_table(report)]
    lines.append("")
    if not report.shares_defined:
        lines.append("shares undefined (exposed time below the floor): raw advances shown")
    lines.append(f"top-1: {report.top1 or '-'}    top-2 (second stage): {report.top2 or '-'}")
    tau = report.gates.candidate_threshold
    lines.append(
        f"routing set (candidate_threshold={tau:g}): {', '.join(report.routing_set) or '-'}"
    )
    lines.append(f"co-critical stages: {', '.join(report.co_critical_stages) or '-'}")
    lines += _label_block("labels", report.labels, report.reasons)
    withheld = [label for label in report.reasons if label not in report.labels]
    lines += _label_block("withheld", withheld, report.reasons)
    for role, rep in (report.role_reports or {}).items():
        ranks = ",".join(str(i) for i, x in enumerate(report.roles or ()) if x == role)
        who = f"ranks {ranks}" if ranks else f"{rep.n_ranks} ranks"  # node summaries: no list
        lines += ["", f"role {role} ({who}), analyzed on its own:", *_stage_table(rep)]
        lines.append(f"  top-1: {rep.top1}    routing set: {', '.join(rep.routing_set) or '-'}")
        lines.append(f"  labels: {', '.join(_flags(rep.labels)) or '-'}")
    if notes:
        lines += ["", "trace notes:", *(f"  - {note}" for note in notes)]
    lines += ["", "verdict: " + verdict(report, meta)]
    return printable_lines(lines)


def _label_block(title: str, labels: list[str], reasons: dict[str, list[str]]) -> list[str]:
    """A titled list of labels, each followed by its reasons; empty when there are no labels."""
    if not labels:
        return []
    lines = ["", f"{title}:"]
    for label in labels:
        lines.append(f"  {label}")
        lines += [f"    - {reason}" for reason in reasons.get(label, [])]
    return lines


def _stage_table(report: WindowReport) -> list[str]:
    width = max(len("stage"), *(len(s) for s in report.stages))
    header = f"{'stage':<{width}}  {'share':>7}  {'advance s':>11}  {'direct gain':>11}  leader"
    rows = [header, "-" * len(header)]
    for stage in report.stages:
        share = f"{report.shares[stage]:.1%}" if report.shares_defined else "n/a"
        leader = report.leaders.get(stage)
        rows.append(
            f"{stage:<{width}}  {share:>7}  {report.advances[stage]:>11.6f}  "
            f"{report.direct_gain[stage]:>11.1%}  {'-' if leader is None else leader}"
        )
    return rows


def _semantic_table(report: WindowReport) -> list[str]:
    width = max(len("stage"), *(len(s) for s in report.semantic_shares))
    header = f"{'stage':<{width}}  {'share':>7}  {'direct gain':>11}  leader"
    rows = [header, "-" * len(header)]
    for stage, share in report.semantic_shares.items():
        leader = report.semantic_localization[stage].leader_rank
        rows.append(
            f"{stage:<{width}}  {share:>7.1%}  {report.semantic_gain[stage]:>11.1%}  "
            f"{'-' if leader is None else leader}"
        )
    return rows


# --- a run folder ---------------------------------------------------------------------------------


def run_report_text(run: RunWindows) -> str:
    """The report printed by ``stagefrontier report`` and at the end of the demo; windows of
    different stage lists (an accumulation factor changed mid-run) get one report each."""
    groups = run.by_schema()
    if len(groups) == 1:
        return _schema_report_text(run)
    lines = [
        printable(
            f"{run.folder} holds windows of {len(groups)} stage lists (the schema changed "
            "mid-run, e.g. a new accumulation factor); each is reported apart."
        )
    ]
    for i, group in enumerate(groups, 1):
        lines += ["", f"=== Stage list {i} of {len(groups)}: {len(group.stages)} stages ==="]
        lines.append(_schema_report_text(group))
    return "\n".join(lines)


def _schema_report_text(run: RunWindows) -> str:
    lines = [_title(run), ""]
    if run.methods is not None:
        lines += _comparison(run)
        if run.packetless:
            lines.append(f"({run.packetless}; left out of these shares)")
    else:
        lines.append(
            "(no per-rank packets: the baselines need the [steps, ranks, stages] matrix, which a "
            "run collected hierarchically keeps on its nodes; showing windows.jsonl only)"
        )
    if run.summarized:
        lines += ["", *summary_text(run)]
    lines += ["", *window_table(run.windows), "", *_labels(run)]
    report, meta = summary_window(run.windows)
    lines += ["", f"Verdict (last full window, {index_text(meta)}): {verdict(report, meta)}"]
    lines += _incidents(run)
    return printable_lines(lines)


def _incidents(run: RunWindows) -> list[str]:
    """One line per profiler-router incident in the folder (``stagefrontier incident`` prints
    each in full)."""
    from ..formats.incident import scan_incidents
    from .incident import summary_line

    found, skipped = scan_incidents(run.folder)
    if not found and not skipped:
        return []
    return [
        "",
        f"Incidents ({len(found)}; `{cli_command()} incident {shlex.quote(str(run.folder))}`"
        " for details):",
        *(f"  {summary_line(incident)}" for _, incident in found),
        *(f"  {problem}" for problem in skipped),
    ]


def summary_window(
    windows: Sequence[tuple[WindowReport, dict[str, Any]]],
) -> tuple[WindowReport, dict[str, Any]]:
    """The window a run's report sums up with: the last one as long as the run's longest. The
    window the timer closes on holds what was left (one step, say), too few to judge a run by."""
    longest = max(report.n_steps for report, _ in windows)
    full = [(report, meta) for report, meta in windows if report.n_steps == longest]
    return full[-1]


def _title(run: RunWindows) -> str:
    first, last = run.windows[0][1], run.windows[-1][1]
    steps = f", steps {step_span(run.tallies)}" if run.tallies.steps else ""
    when = span_text(run_clock([first, last]), dated=True)
    return (
        f"StageFrontier report for {run.folder}: {run.count} window(s){steps}, "
        f"{run.tallies.ranks} rank(s)" + (f", {when}" if when != "?" else "")
    )


def _comparison(run: RunWindows) -> list[str]:
    assert run.methods is not None
    methods, stages = run.methods, run.stages
    mean = {m: methods.mean(m) for m in METHOD_TITLES}
    width = max(len("stage"), *(len(s) for s in stages))
    header = f"{'stage':<{width}}" + "".join(f"  {METHOD_TITLES[m]:>10}" for m in METHOD_TITLES)
    lines = [
        "Stage shares, mean over windows: StageFrontier (frontier) vs rank-local baselines"
        + sample_note(methods),
        header,
        "-" * len(header),
    ]
    for j, stage in enumerate(stages):
        lines.append(f"{stage:<{width}}" + "".join(f"  {mean[m][j]:>10.1%}" for m in METHOD_TITLES))
    lines += ["", *METHOD_LEGEND, ""]
    broad = [semantic_stage(s) for s in stages]
    folded = " (accumulation microsteps folded into their stage)" if broad != stages else ""
    lines.append(f"top-1 stage per method (windows where it was top-1){folded}:")
    for m in METHOD_TITLES:
        stage, count = methods.tops[m].most_common(1)[0]
        lines.append(f"  {METHOD_TITLES[m]:<10} {stage} ({count}/{methods.compared})")
    return lines


def window_table(windows: list[tuple[WindowReport, dict[str, Any]]]) -> list[str]:
    """One row per window: steps, ms/step, the top stage with its share and leader, labels."""
    lines = [
        "Per window (times of day in UTC):",
        "  window  steps      time               ms/step  top-1 (share, leader)  labels",
    ]
    for report, meta in windows:
        top = report.top1
        share = f"{report.semantic_shares[top]:.0%}" if top and report.shares_defined else "n/a"
        who = lead_text(report, meta) if top else "-"
        cell = f"{top} ({share}, {who})"
        if top is None and report.role_reports:  # roles side by side
            cell = "per role: " + "; ".join(role_tops(report, meta))
        flags = ",".join(_flags(report.labels)) or "-"
        span = f"{meta.get('first_step', '?')}-{meta.get('last_step', '?')}"
        ms = report.mean_step_s * 1e3
        clock = clock_cell(meta)
        lines.append(f"  {index_text(meta):>6}  {span:<9}  {clock:<17} {ms:>8.1f}  {cell}  {flags}")
    return lines


def window_title(record: Mapping[str, Any]) -> str:
    """``window 3 steps 60-79`` (``window 1/3 ...`` after a torchelastic restart)."""
    return f"window {index_text(record)} steps {record['first_step']}-{record['last_step']}"


def index_text(meta: Mapping[str, Any]) -> str:
    index = str(meta.get("window", "?"))
    if meta.get("attempt"):  # a torchelastic restart counts windows from 0 again
        index = f"{meta['attempt']}/{index}"
    return index


def _labels(run: RunWindows) -> list[str]:
    tallies, n = run.tallies, run.tallies.windows
    route, count = tallies.routes.most_common(1)[0]
    lines = [f"Routing set (most common, {count}/{n} windows): {route or '-'}"]
    if tallies.co_critical:
        stages, many = tallies.co_critical.most_common(1)[0]
        lines.append(f"Co-critical stages (most common, {many}/{n} windows): {stages}")
    lines.append("Labels: " + ", ".join(f"{label} {k}/{n}" for label, k in tallies.labels.items()))
    last, meta = summary_window(run.windows)
    lines.append(f"Reasons (last full window, {index_text(meta)}):")
    for label in last.labels:
        for reason in last.reasons.get(label, []):
            lines.append(f"  {label}: {reason}")
    return lines


def _flags(labels: list[str]) -> list[str]:
    return [label for label in labels if label != "frontier_accounting"]
