"""What a node leader condenses its node's windows into, how a group's head combines its
children's parts, and how rank 0 analyzes the top part.

A part's body is its group's ``WindowSummary`` (``analysis.summary``, written compact by
``formats.summary_codec``: durations on a grid of at most 2**-12 of the shortest step): a leader
summarizes its node's ``[N, L, S]`` window, a head combines its children's summaries exactly,
and rank 0 runs the one analyzer on the top one (``analyze_summary``). A group whose summary
cannot join (it does not decode, or its stages, steps or settings differ) is reported missing or
mismatched with the reason; nothing raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..analysis.analyzer import analyze_summary
from ..analysis.collective_summary import (
    CollectiveSummary,
    combine_collectives,
    summarize_collectives,
)
from ..analysis.collectives import CollectiveTimes
from ..analysis.gates import DEFAULT_GATES, Gates
from ..analysis.schema import FORWARD_STAGE
from ..analysis.semantic import stage_groups
from ..analysis.side import EVENT_NOT_SAMPLED, EVENT_READY, SideEvidence
from ..analysis.summary import WindowSummary, combine, summarize
from ..errors import ReportFormatError, StageFrontierError
from ..formats.summary_codec import decode_summary, encode_summary
from ..window.merged import AnalyzedWindow, MergedWindow
from ..window.rank import NS, RankWindow, self_cost_summary
from .base import merge_received
from .node import NodeIdentity
from .node_wire import NodePart, capped_notes, decode_node_part, encode_node_part

logger = logging.getLogger("stagefrontier")


@dataclass(frozen=True)
class Group:
    """A part and its summary, decoded once: what a head holds while it combines."""

    part: NodePart
    summary: WindowSummary
    roles: dict[str, WindowSummary] = field(default_factory=dict)
    """When its ranks have roles, each role's summary (role groups that span nodes combine)."""

    def encode(self) -> bytes:
        body = [encode_summary(self.summary, compact=True)]
        lengths = []
        for role, summary in sorted(self.roles.items()):
            own = summary is self.summary
            body.append(b"" if own else encode_summary(summary, compact=True))
            lengths.append((role, len(body[-1])))
        part = replace(self.part, body=b"".join(body), roles=tuple(lengths))
        return encode_node_part(part)


def decode_group(data: bytes) -> Group:
    """Parse a part, its summary and its roles' summaries; raises ReportFormatError."""
    part = decode_node_part(data)
    end = len(part.body) - sum(n for _, n in part.roles)
    summary = decode_summary(part.body[:end])
    roles = {}
    for role, n in part.roles:
        roles[role] = decode_summary(part.body[end : end + n]) if n else summary
        end += n
    width = len(summary.stages)
    if any(len(row) != width for _, rows in part.rows.values() for row in rows):
        raise ReportFormatError(f"node payload rows must have one value per stage ({width})")
    if len(part.typical) not in (0, len(stage_groups(summary.stages)[0])):
        raise ReportFormatError("node payload typical must have one rank per broad stage")
    return Group(replace(part, body=b"", roles=()), summary, roles)


Wanted = tuple[frozenset[int], int, int]
"""Rows a capture request asks for: its named ranks, its first and last step."""


def typical_ranks(
    d: np.ndarray, ranks: Sequence[int], stages: Sequence[str]
) -> tuple[tuple[int, int], ...]:
    """Per broad stage, the rank at the lower median of the group's mean time in it (ties by
    rank number), with that mean in integer nanoseconds per step."""
    _, groups = stage_groups(stages)
    out = []
    for members in groups:
        means = d[:, :, members].sum(axis=2).mean(axis=0)
        order = np.lexsort((np.asarray(ranks), means))
        pick = int(order[(len(order) - 1) // 2])
        out.append((int(ranks[pick]), round(float(means[pick]) / NS)))
    return tuple(out)


def weighted_typical(groups: Sequence[Group]) -> tuple[tuple[int, int], ...]:
    """Per broad stage, the groups' typical ranks combined: the lower median of their means,
    each weighted by its group's rank count. Not exact (a median of medians): see
    docs/scale.md for the bound."""
    carrying = [g for g in groups if g.part.typical]
    if not carrying:
        return ()
    out = []
    for i in range(len(carrying[0].part.typical)):
        entries = sorted(
            (g.part.typical[i][1], g.part.typical[i][0], g.summary.n_ranks) for g in carrying
        )
        half = sum(weight for _, _, weight in entries) / 2
        seen = 0
        for ns, rank, weight in entries:
            seen += weight
            if seen >= half:
                out.append((rank, ns))
                break
    return tuple(out)


def wanted_rows(
    windows: Sequence[RankWindow], wanted: Sequence[Wanted]
) -> dict[int, tuple[int, tuple[tuple[int, ...], ...]]]:
    """The rows of ``windows`` a capture request named, over its steps in the window (the span
    of every request naming the rank, should two fall in one window)."""
    rows: dict[int, tuple[int, tuple[tuple[int, ...], ...]]] = {}
    for w in windows:
        spans = [(first, last) for ranks, first, last in wanted if w.rank in ranks]
        first = max(min((f for f, _ in spans), default=w.last_step + 1), w.first_step)
        last = min(max((last for _, last in spans), default=-1), w.last_step)
        if first <= last:
            block = w.durations_ns[first - w.first_step : last - w.first_step + 1]
            rows[w.rank] = (first, tuple(tuple(int(v) for v in row) for row in block))
    return rows


def node_group(
    node: NodeIdentity,
    own: RankWindow,
    windows: Sequence[RankWindow],
    notes: Sequence[str],
    late: Sequence[int],
    gates: Gates | None,
    wanted: Sequence[Wanted] = (),
) -> Group:
    """The leader's part for its node: the summary of the windows that arrived and match its
    own (``own`` first), the ranks that did not, and ``late``: those of them that said nothing
    (not announced silent), named in a note with the node; the rows ``wanted`` by capture
    requests."""
    merged = merge_received(list(windows), node.first_rank + node.size, notes)
    kept = merged.ranks
    present = {w.rank for w in windows}
    notes = list(merged.notes)
    if late:
        notes.append(f"{node.label()}: rank(s) {list(late)} sent no window to the node leader")
    for w in kept:
        notes.extend(f"rank {w.rank}: {reason}" for reason in w.violation_reasons)
        if w.dropped_windows:
            notes.append(f"rank {w.rank} dropped {w.dropped_windows} window(s): hand-off full")
    d = np.stack([w.durations_ns for w in kept], axis=1).astype(np.float64) * NS
    baseline = (gates or DEFAULT_GATES).gain_baseline
    summary = summarize(d, [w.rank for w in kept], own.stages, gain_baseline=baseline)
    groups: dict[str, list[int]] = {}
    for i, w in enumerate(kept):
        if w.role:
            groups.setdefault(w.role, []).append(i)
    roles = {
        role: summary
        if len(cols) == len(kept)
        else summarize(d[:, cols], [kept[i].rank for i in cols], own.stages, gain_baseline=baseline)
        for role, cols in groups.items()
    }
    part = NodePart(
        window=own.window,
        first_step=own.first_step,
        last_step=own.last_step,
        first_node=node.node,
        node_count=1,
        missing_ranks=tuple(r for r in node.ranks if r not in present),
        mismatched_ranks=tuple(merged.mismatched_ranks),
        notes=capped_notes(notes),
        hosts={node.node: own.hostname},
        contract_violations=sum(w.contract_violations for w in kept),
        overlap_ns=sum(w.overlap_ns for w in kept),
        self_cost_max={k: v["max"] for k, v in self_cost_summary(kept).items() if "max" in v},
        typical=typical_ranks(d, [w.rank for w in kept], own.stages),
        rows=wanted_rows(kept, wanted),
        collectives=node_collectives(kept),
        **event_totals(kept),
    )
    return Group(part, summary, roles)


def node_collectives(windows: Sequence[RankWindow]) -> CollectiveSummary | None:
    """The node's timed collectives summarized (None when none of its ranks watched any)."""
    first = windows[0]
    times = CollectiveTimes.of_ranks(
        first.first_step, first.n_steps, [w.collectives for w in windows]
    )
    if times is None:
        return None
    return summarize_collectives(times, [w.rank for w in windows])


def joined_collectives(parts: Sequence[NodePart], notes: list[str]) -> CollectiveSummary | None:
    """The groups' collective summaries combined; a group whose steps differ is left out of
    the communication reading, with a note."""
    summaries = [p.collectives for p in parts if p.collectives is not None]
    if not summaries:
        return None
    try:
        return combine_collectives(summaries)
    except ValueError as exc:
        notes.append(f"communication evidence not combined: {exc}")
        return None


def event_totals(windows: Sequence[RankWindow]) -> dict[str, Any]:
    """The ``events`` and ``forward_stage`` of a node's part: its ranks' sampled forward
    CUDA-event pairs as four totals (none: empty)."""
    sampled = [w for w in windows if w.event_state is not None and w.event_ms is not None]
    if not sampled:
        return {}
    stage = next((w.forward_stage for w in windows if w.forward_stage), FORWARD_STAGE)
    column = sampled[0].stages.index(stage) if stage in sampled[0].stages else None
    totals = [0.0, 0.0, 0.0, 0.0]
    for w in sampled:
        state = np.asarray(w.event_state)
        ready = state == EVENT_READY
        totals[0] += int((state != EVENT_NOT_SAMPLED).sum())
        totals[1] += int(ready.sum())
        totals[2] += float(np.asarray(w.event_ms)[ready].sum())
        if column is not None:
            totals[3] += float(w.durations_ns[ready, column].sum()) * NS
    return {"events": tuple(totals), "forward_stage": stage}


def combine_groups(
    own: Group,
    node_count: int,
    children: Mapping[int, Group],
    missing: Mapping[range, str],
    notes: Sequence[str],
    node_size: int,
) -> Group:
    """The group ``own`` heads (``node_count`` nodes from its first): ``own`` and the children
    that arrived, combined exactly; the ``missing`` children's nodes (a node span each, with
    the reason) and the wait's ``notes`` added. A child whose summary cannot join ``own``'s
    (other stages, steps or settings) is reported mismatched with its ranks."""
    joined = [own, *children.values()]
    notes = list(notes)
    try:
        summary = combine([g.summary for g in joined])
    except StageFrontierError:
        joined = [own]
        for child in children.values():
            try:
                combine([own.summary, child.summary])
            except StageFrontierError as exc:
                notes.append(f"nodes {_span(child.part)} not combined: {exc}")
                continue
            joined.append(child)
        summary = combine([g.summary for g in joined])
    parts = [g.part for g in joined]
    dropped = [c for c in children.values() if not any(c is g for g in joined)]
    gone: dict[int, str] = {}
    for span, why in missing.items():
        gone.update(dict.fromkeys(span, why))
    mismatched = sorted(
        [
            *(r for p in parts for r in p.mismatched_ranks),
            *(int(r) for c in dropped for r in (*c.summary.ranks, *c.part.mismatched_ranks)),
        ]
    )
    collectives = joined_collectives(parts, notes)
    part = NodePart(
        window=own.part.window,
        first_step=own.part.first_step,
        last_step=own.part.last_step,
        first_node=own.part.first_node,
        node_count=node_count,
        missing_nodes={**{k: v for p in parts for k, v in p.missing_nodes.items()}, **gone},
        missing_ranks=tuple(sorted(r for p in parts for r in p.missing_ranks)),
        mismatched_ranks=tuple(mismatched),
        notes=capped_notes([*notes, *(n for p in parts for n in p.notes)]),
        hosts=_named_hosts(summary, {k: v for p in parts for k, v in p.hosts.items()}, node_size),
        contract_violations=sum(p.contract_violations for p in parts),
        overlap_ns=sum(p.overlap_ns for p in parts),
        self_cost_max=_largest([p.self_cost_max for p in parts]),
        events=_summed([p.events for p in parts]),
        forward_stage=next((p.forward_stage for p in parts if p.forward_stage), ""),
        typical=weighted_typical(joined),
        rows={rank: rows for p in parts for rank, rows in p.rows.items()},
        collectives=collectives,
    )
    return Group(part, summary, _combined_roles(joined, summary))


def _combined_roles(groups: Sequence[Group], summary: WindowSummary) -> dict[str, WindowSummary]:
    """Each role's summaries across the groups combined (a role of every rank: the group's
    own summary); a role whose summaries do not combine is left out, with the error logged."""
    out: dict[str, WindowSummary] = {}
    for role in sorted({role for g in groups for role in g.roles}):
        parts = [g.roles[role] for g in groups if role in g.roles]
        try:
            out[role] = combine(parts)
        except StageFrontierError as exc:
            logger.warning("stagefrontier: role %s's node summaries do not combine: %s", role, exc)
    if len(out) == 1 and next(iter(out.values())).n_ranks == summary.n_ranks:
        out = dict.fromkeys(out, summary)
    return out


def _four(totals: tuple[float, ...]) -> tuple[float, float, float, float] | None:
    return (totals[0], totals[1], totals[2], totals[3]) if totals else None


def _summed(totals: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    present = [t for t in totals if t]
    return tuple(float(sum(column)) for column in zip(*present, strict=True)) if present else ()


def _largest(costs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for cost in costs:
        for name, value in cost.items():
            out[name] = max(out.get(name, 0.0), value)
    return out


def _named_hosts(summary: WindowSummary, hosts: dict[int, str], node_size: int) -> dict[int, str]:
    """The hosts of the nodes whose ranks the summary's top prefixes name: all a report can
    name, bounded by the summary's size whatever the number of nodes."""
    named = {int(r) // node_size for r in np.unique(summary.top_rank)}
    return {n: h for n, h in hosts.items() if n in named}


def _span(part: NodePart) -> str:
    last = part.first_node + part.node_count - 1
    return str(part.first_node) if last == part.first_node else f"{part.first_node}-{last}"


def analyze_group(
    top: Group, own: RankWindow, world_size: int, node_size: int, gates: Gates | None
) -> AnalyzedWindow | None:
    """Rank 0's analysis of the top group, or None when it fails (logged: the window is lost,
    and said so)."""
    part, summary = top.part, top.summary
    gone = sorted(part.missing_nodes)
    missing = sorted(
        {*part.missing_ranks, *(r for n in gone for r in range(n * node_size, (n + 1) * node_size))}
    )
    notes = list(dict.fromkeys([*part.notes, *(part.missing_nodes[n] for n in gone)]))
    side = SideEvidence(
        accumulation_factor=own.accumulation_factor,
        overlap_error_s=part.overlap_ns * NS,
        missing_ranks=tuple(missing),
        mismatched_ranks=part.mismatched_ranks,
        gather_ok=not missing,
        contract_violations=part.contract_violations,
        notes=tuple(notes),
        event_totals=_four(part.events),
        forward_stage=part.forward_stage or FORWARD_STAGE,
    )
    try:
        report = analyze_summary(summary, gates=gates, side=side, role_summaries=top.roles)
    except Exception as exc:
        logger.error("stagefrontier: window %d lost: its summary failed: %s", part.window, exc)
        return None
    merged = MergedWindow(own, [own], world_size, missing, list(part.mismatched_ranks), notes)
    d = np.zeros((summary.n_steps, 0, len(summary.stages)))
    nodes = nodes_entry(part, node_size)
    nodes["rounding_s"] = summary.rounding_s
    costs = {"fraction": 0.0, **part.self_cost_max}
    nodes["self_cost"] = {name: {"max": v} for name, v in costs.items()}
    names = stage_groups(summary.stages)[0] if part.typical else ()
    return AnalyzedWindow(
        merged,
        d,
        None,
        side,
        report,
        summary=summary,
        typical_ranks={name: rank for name, (rank, _) in zip(names, part.typical, strict=True)},
        named_rows={
            rank: (first, np.asarray(rows, dtype=np.float64) * NS)
            for rank, (first, rows) in part.rows.items()
        },
        nodes=nodes,
        collective_summary=part.collectives,
    )


def nodes_entry(part: NodePart, node_size: int) -> dict[str, Any]:
    """The record's ``nodes``: how many, which are missing and why, which lack some ranks, and
    the hosts of the nodes the report can name."""
    partial: dict[str, list[int]] = {}
    for rank in part.missing_ranks:
        partial.setdefault(str(rank // node_size), []).append(rank)
    return {
        "node_size": node_size,
        "nodes": part.node_count,
        "present": part.node_count - len(part.missing_nodes),
        "missing": {str(n): why for n, why in sorted(part.missing_nodes.items())},
        "partial": partial,
        "hosts": {str(n): h for n, h in sorted(part.hosts.items())},
    }
