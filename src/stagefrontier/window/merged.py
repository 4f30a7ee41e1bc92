"""How the windows of all ranks become a report: merged into ``[N, R, S]`` seconds, analyzed
once, and written as the ``windows.jsonl`` record, with the wall clock the window (or an
incident) ran at: the UTC times and the host's offset from UTC that a ``wall_clock`` object
holds (``formats.wall_clock`` checks them). Everything here runs off the training thread, on
rank 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.analyzer import analyze
from ..analysis.block_lead import (
    DEFAULT_LEAD_TEST,
    BlockLead,
    LeadTest,
    RoutedLead,
    routed_lead_below_top,
)
from ..analysis.collective_summary import CollectiveSummary, read_collective_summary
from ..analysis.collectives import CollectiveTimes, CommunicationReading, read_collectives
from ..analysis.gates import DEFAULT_GATES, Gates
from ..analysis.schema import FORWARD_STAGE
from ..analysis.side import EVENT_NOT_SAMPLED, SideEvidence
from ..analysis.summary import WindowSummary
from ..analysis.window_metrics import WindowMetrics
from ..analysis.window_report import WindowReport
from ..environment import current_attempt
from .loader import data_block_lead, loader_record
from .rank import NS, RankWindow, per_rank_fields, self_cost_summary


@dataclass(frozen=True)
class MergedWindow:
    """The ranks of one window that can be analyzed together, plus what is known to be missing."""

    reference: RankWindow
    ranks: list[RankWindow]
    world_size: int
    missing_ranks: list[int]
    mismatched_ranks: list[int]
    notes: list[str]


def merge_windows(
    windows: Sequence[RankWindow], world_size: int, notes: Sequence[str] = ()
) -> MergedWindow:
    """Select the ranks that share rank 0's (or the lowest rank's) schema and step count.

    Ranks with a different schema hash or N are reported as mismatched, never merged.
    """
    by_rank = sorted(windows, key=lambda w: w.rank)
    reference = next((w for w in by_rank if w.rank == 0), by_rank[0])
    same = [
        w
        for w in by_rank
        if w.schema_hash == reference.schema_hash and w.n_steps == reference.n_steps
    ]
    mismatched = [w.rank for w in by_rank if w not in same]
    present = {w.rank for w in by_rank}
    missing = [r for r in range(world_size) if r not in present]
    return MergedWindow(reference, same, world_size, missing, mismatched, list(notes))


_COMMUNICATION_INPUTS = {"merged", "d", "side", "summary", "collective_summary"}
"""The fields ``AnalyzedWindow.communication`` is read from."""


@dataclass(frozen=True)
class AnalyzedWindow:
    """A merged window with the exact analyzer inputs and its report: what sinks receive."""

    merged: MergedWindow
    d: npt.NDArray[np.float64]
    roles: list[str] | None
    side: SideEvidence
    report: WindowReport
    regression: dict[str, Any] | None = None
    """Set on rank 0 when this window is slower than the run's recent healthy windows
    (``analysis.regression``): how much, and which stage's exposed time grew."""
    gain_reference: list[int] | None = None
    """The healthy windows (first, last) whose per-rank medians the direct gains clipped to;
    None when the gains clip to each rank's median in this window (``Gates.gain_baseline``)."""
    summary: WindowSummary | None = None
    """Under hierarchical collection, the combined node summaries the report was computed from.
    Rank 0 then never sees the ranks' columns: ``d`` is empty (``[N, 0, S]``) and ``merged``
    holds rank 0's own window only (its index and steps are the window's); the regression
    check reads the summary, the profiler router ``typical_ranks`` and ``named_rows``."""
    typical_ranks: dict[str, int] | None = None
    """Under hierarchical collection, per broad stage, a rank whose time in it is typical (the
    node parts' weighted median of node medians, ``collect.node_payload``)."""
    named_rows: dict[int, tuple[int, npt.NDArray[np.float64]]] | None = None
    """Under hierarchical collection, the rows a capture request asked for: per named rank, the
    first global step and its durations ``[steps, stages]`` (seconds) in this window."""
    nodes: dict[str, Any] | None = None
    """Under hierarchical collection: the node size and count, the nodes present, the nodes
    missing (with the reason), the nodes some of whose ranks are missing, and the hosts of the
    nodes the report can name (``collect.node_payload.nodes_entry``)."""
    slow_collective: dict[str, Any] | None = None
    """Set on rank 0 when a collective every rank reached together took much longer than in
    the run's first windows (``analysis.collective_baseline.CollectiveBaseline``)."""
    collective_summary: CollectiveSummary | None = None
    """Under hierarchical collection, the node parts' timed collectives combined, from which
    ``communication`` is read (``analysis.collective_summary``)."""
    host_signals: dict[str, Any] | None = None
    """Rank 0's host signals over the window (``collect.host_signals``): load, CPU steal,
    throttling, its process's CPU per wall second; None when not read."""
    lead_test: LeadTest = DEFAULT_LEAD_TEST
    """When one rank's lead in a stage below the top one is named (``lead_below_top``): the
    profiler router's ``min_share`` and ``noise_factor`` when a router takes the windows
    (``collect.base.Consumers``), so that the line names no lead the router would not
    capture."""

    def changed(self, **changes: Any) -> AnalyzedWindow:
        """``replace(self, **changes)``, keeping the communication reading when it was read
        and ``changes`` leaves its inputs alone: at hundreds of ranks, reading the node
        summaries takes a good part of a second of rank 0's analysis thread."""
        out = replace(self, **changes)
        if "communication" in self.__dict__ and not _COMMUNICATION_INPUTS & changes.keys():
            out.__dict__["communication"] = self.__dict__["communication"]
        return out

    @cached_property
    def record(self) -> dict[str, Any]:
        """The JSON object written per window to ``windows.jsonl``."""
        if self.summary is not None:
            record = summary_record(self.merged, self.report, self.side, self.summary)
        else:
            record = window_record(self.merged, self.report)
        record["regression"] = self.regression
        if self.host_signals is not None:
            record["host_signals"] = self.host_signals
        record["gain_reference_windows"] = self.gain_reference
        record["block_lead"] = None if self.block_lead is None else self.block_lead.to_dict()
        below = self.lead_below_top
        record["lead_below_top"] = None if below is None else below._asdict()
        reading = self.communication
        if reading is not None:
            record["communication"] = {**reading.to_dict(), "slow": self.slow_collective}
        else:
            record["communication"] = None
        if self.nodes is not None:
            record["nodes"] = {k: v for k, v in self.nodes.items() if k != "self_cost"}
            if self.summary is not None:
                # maxima over ranks only: medians would need every rank's cost at rank 0
                record["self_cost"] = self.nodes.get("self_cost", {})
                hosts = {int(n): h for n, h in self.nodes["hosts"].items()}
                size = self.nodes["node_size"]
                names = summary_node_names(self.report, hosts, size)
                record["hosts"] = {str(r): hosts.get(r // size, "") for r in sorted(names)}
                record["lead"] = lead_scope(self.report, names)
        return record

    @cached_property
    def block_lead(self) -> BlockLead | None:
        """The data wait's lead over blocks of the leading rank's DataLoader worker count, when
        that rank's workers hand over batches in bursts and the data wait is the top stage, or
        lies below a top stage no rank leads steadily (``window.loader.data_block_lead``): the
        lead the window line states and the profiler router acts on when the lead step by step
        keeps changing hands."""
        report = self.report
        if report.role_reports:
            return None
        gates = self.lead_test.gates or report.gates
        return data_block_lead(self.merged.ranks, self.d, report, gates)

    @cached_property
    def lead_below_top(self) -> RoutedLead | None:
        """The stage below the top one that one rank leads steadily, materially and above the
        noise, with that rank and the steps its lead was judged over, when the top stage has no
        steady leader
        (``block_lead.routed_lead_below_top`` by ``lead_test``, the data wait's lead over its
        DataLoader's bursts included): what the window line names and the profiler router
        captures. None with roles or without such a lead, and when the top stage is a data
        wait judged over its DataLoader's bursts (``block_lead``): the router then routes that
        stage or nothing."""
        if self.report.role_reports or not self.report.shares_defined:
            return None
        block = self.block_lead
        if block is not None and block.stage == self.report.top1:
            return None
        d = self.d if self.summary is None else None
        return routed_lead_below_top(
            self.report, d, [w.rank for w in self.merged.ranks], self.lead_test, block
        )

    @cached_property
    def step_ms(self) -> float:
        """The window's typical step in milliseconds: the median over every rank's steps, or
        under hierarchical collection the mean step (0 when no step was timed)."""
        if self.summary is not None:
            summary = self.summary
            return 1e3 * summary.rank_total_sum_s / max(summary.n_ranks * summary.n_steps, 1)
        return float(np.median(self.d.sum(axis=2))) * 1e3 if self.d.size else 0.0

    @cached_property
    def communication(self) -> CommunicationReading | None:
        """The clock-free reading of the collectives the ranks timed (``analysis.collectives``),
        or None when no rank watched any; the lateness threshold from ``step_ms``. Under
        hierarchical collection it is read from the node summaries."""
        if self.collective_summary is not None and self.summary is not None:
            n_ranks = self.summary.n_ranks
            return read_collective_summary(self.collective_summary, n_ranks, self.step_ms)
        times = self.side.collectives
        if times is None:
            return None
        return read_collectives(times, [w.rank for w in self.merged.ranks], self.step_ms)

    @cached_property
    def metrics(self) -> WindowMetrics:
        """The numbers the metrics sinks write, computed once for all of them."""
        ref = self.merged.reference
        return WindowMetrics.from_report(
            self.report,
            window=ref.window,
            first_step=ref.first_step,
            last_step=ref.last_step,
            gather_ok=not self.merged.missing_ranks,
            regression=self.regression,
            self_cost_fraction=self.record["self_cost"]["fraction"]["max"],
        )


def analyze_merged(
    merged: MergedWindow,
    gates: Gates | None = None,
    reference_s: npt.NDArray[np.float64] | None = None,
) -> AnalyzedWindow:
    """Run the analyzer on the merged ranks, with the side evidence the windows carry.

    ``reference_s`` (``[R, S]`` seconds, the merged ranks in order) is a no-stall reference: the
    direct gains then clip each stage to it instead of to this window's own medians."""
    ranks = merged.ranks
    d = np.stack([w.durations_ns for w in ranks], axis=1).astype(np.float64) * NS
    role_list = [w.role or "" for w in ranks]
    roles = role_list if any(role_list) else None
    event_ms, event_state, forward_stage = _events(ranks)
    notes = list(merged.notes)
    role_set = {role for w in ranks for role in w.role_set}
    for w in ranks:
        notes.extend(f"rank {w.rank}: {reason}" for reason in w.violation_reasons)
        if w.dropped_windows:
            notes.append(
                f"rank {w.rank} dropped {w.dropped_windows} window(s): hand-off queue full"
            )
        if role_set and w.role and w.role not in role_set:  # ranks disagree on the mesh
            notes.append(f"rank {w.rank}'s role {w.role} is outside the job's role set")
            role_set.add(w.role)
    side = SideEvidence(
        event_ms=event_ms,
        event_state=event_state,
        forward_stage=forward_stage or FORWARD_STAGE,
        accumulation_factor=merged.reference.accumulation_factor,
        accumulation_collapsed=any(w.accumulation_mixed for w in ranks),
        overlap_error_s=sum(w.overlap_ns for w in ranks) * NS,
        missing_ranks=tuple(merged.missing_ranks),
        mismatched_ranks=tuple(merged.mismatched_ranks),
        gather_ok=not merged.missing_ranks,
        contract_violations=sum(w.contract_violations for w in ranks),
        notes=tuple(notes),
        no_stall_reference_s=reference_s,
        expected_roles=tuple(sorted(role_set)),
        collectives=CollectiveTimes.of_ranks(
            merged.reference.first_step,
            merged.reference.last_step - merged.reference.first_step + 1,
            [w.collectives for w in ranks],
        ),
    )
    if reference_s is not None:
        gates = replace(gates or DEFAULT_GATES, gain_baseline="reference")
    report = analyze(
        d,
        merged.reference.stages,
        gates=gates,
        roles=roles,
        side=side,
        rank_ids=[w.rank for w in ranks],
    )
    return AnalyzedWindow(merged, d, roles, side, report)


def _events(
    ranks: Sequence[RankWindow],
) -> tuple[npt.NDArray[np.float64] | None, npt.NDArray[np.int8] | None, str | None]:
    if all(w.event_state is None for w in ranks):
        return None, None, None
    n = ranks[0].n_steps
    ms = np.full((n, len(ranks)), np.nan)
    state = np.full((n, len(ranks)), EVENT_NOT_SAMPLED, dtype=np.int8)
    for i, w in enumerate(ranks):
        if w.event_state is not None and w.event_ms is not None:
            ms[:, i] = w.event_ms
            state[:, i] = w.event_state
    stage = next((w.forward_stage for w in ranks if w.forward_stage), None)
    return ms, state, stage


def window_record(merged: MergedWindow, report: WindowReport) -> dict[str, Any]:
    """The JSON object written per window to ``windows.jsonl``."""
    ref = merged.reference
    wall = sum(float(w.wall_ns.sum()) for w in merged.ranks) * NS
    record: dict[str, Any] = {
        **_record_head(merged),
        "ranks_present": [w.rank for w in merged.ranks],
        "gather_ok": not merged.missing_ranks,
        "missing_ranks": merged.missing_ranks,
        "mismatched_ranks": merged.mismatched_ranks,
        "accumulation_factor": ref.accumulation_factor,
        "step_wall_s": wall,
        "overlap_error_s": sum(w.overlap_ns for w in merged.ranks) * NS,
        "contract_violations": sum(w.contract_violations for w in merged.ranks),
        "paused_steps": ref.paused_steps,
        **phase_fields(ref),
        "self_cost": self_cost_summary(merged.ranks),
        "probes": {str(w.rank): w.probes for w in merged.ranks if w.probes},
        "loader_workers": loader_record(merged.ranks, ref.stages[0]),
        "wall_clock": window_wall_clock(merged.ranks),
        **per_rank_fields(merged.ranks),
        "lead": lead_scope(report, node_names(merged.ranks)),
    }
    record.update(report.to_dict())
    return record


def phase_fields(ref: RankWindow) -> dict[str, Any]:
    """The record's ``phase`` (and ``phase_changed`` when it changed inside the window), only
    when the run names phases."""
    if ref.phase is None and not ref.phase_changed:
        return {}
    return {"phase": ref.phase, **({"phase_changed": True} if ref.phase_changed else {})}


def marks(ref: RankWindow) -> tuple[str | None, bool, bool]:
    """What the regression check follows of the window (``analysis.baseline_phases``): its
    phase, whether the phase changed inside it, whether it holds paused steps."""
    return ref.phase, ref.phase_changed, ref.paused_steps > 0


def _record_head(merged: MergedWindow) -> dict[str, Any]:
    """The fields every window record starts with: which run, attempt, window and steps."""
    ref = merged.reference
    run_id, attempt = current_attempt()
    return {
        "run_id": run_id,
        "attempt": attempt,
        "window": ref.window,
        "first_step": ref.first_step,
        "last_step": ref.last_step,
        "world_size": merged.world_size,
    }


def summary_record(
    merged: MergedWindow, report: WindowReport, side: SideEvidence, summary: WindowSummary
) -> dict[str, Any]:
    """The ``windows.jsonl`` object of a window analyzed from node summaries: the window facts
    ``window_record`` gives, without the per-rank tables (rank 0 never saw the ranks)."""
    record: dict[str, Any] = {
        **_record_head(merged),
        "n_ranks_present": summary.n_ranks,
        "gather_ok": side.gather_ok,
        "missing_ranks": list(side.missing_ranks),
        "mismatched_ranks": list(side.mismatched_ranks),
        "accumulation_factor": side.accumulation_factor,
        "paused_steps": merged.reference.paused_steps,
        **phase_fields(merged.reference),
        "step_wall_s": summary.rank_total_sum_s - side.overlap_error_s,
        "overlap_error_s": side.overlap_error_s,
        "contract_violations": side.contract_violations,
        "wall_clock": window_wall_clock([merged.reference]),
    }
    record.update(report.to_dict())
    return record


def window_wall_clock(ranks: Sequence[RankWindow]) -> dict[str, str]:
    """When the window ran: from the earliest first step to begin to the latest last step to
    end over the ranks given (each rank's own clock), or an empty object when no rank said."""
    starts = [w.started_unix_ns for w in ranks if w.started_unix_ns > 0]
    ends = [w.ended_unix_ns for w in ranks if w.ended_unix_ns > 0]
    return wall_clock(min(starts), max(ends)) if starts and ends else {}


def iso_utc(unix_ns: int) -> str:
    """``2026-11-27T20:20:19.123Z``: a wall-clock time in nanoseconds since the epoch, in UTC."""
    moment = datetime.fromtimestamp(unix_ns / 1e9, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def local_offset(unix_ns: int) -> str:
    """``+01:00``: how far this host's local time was from UTC at that moment."""
    offset = datetime.fromtimestamp(unix_ns / 1e9).astimezone().utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset is not None else 0
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def wall_clock(start_ns: int, end_ns: int) -> dict[str, str]:
    """The ``wall_clock`` object of a span (an empty one when the start is unknown)."""
    if start_ns <= 0 or end_ns < start_ns:
        return {}
    return {
        "start": iso_utc(start_ns),
        "end": iso_utc(end_ns),
        "utc_offset": local_offset(start_ns),
    }


def summary_node_names(
    report: WindowReport, hosts: dict[int, str], node_size: int
) -> dict[int, str]:
    """``node_names`` for the ranks the report names (its leaders and leading ranks), from the
    hosts of their nodes: always ``node<k>@<host>`` (rank 0 cannot tell whether a host runs
    other nodes, so the node index is always given)."""
    ranks = {r for r in report.leaders.values() if r is not None}
    for loc in report.semantic_localization.values():
        ranks.update(loc.leading_ranks)
    return {r: f"node{r // node_size}@{hosts.get(r // node_size, '')}" for r in ranks}


def node_names(ranks: Sequence[RankWindow]) -> dict[int, str]:
    """The node each rank runs on: its host name, or ``node<k>@<host>`` where one host runs
    several launcher agents (as a test of several torchrun nodes on one machine does). A node is
    told by its first rank, ``rank - local_rank``, and ``k`` is that over the node size, as
    torchrun's ``GROUP_RANK`` is for nodes of equal size."""
    first = {w.rank: w.rank - w.local_rank for w in ranks}
    agents: dict[str, set[int]] = {}
    for w in ranks:
        agents.setdefault(w.hostname, set()).add(first[w.rank])
    known = {w.hostname for w in ranks if w.local_rank > 0}  # else local ranks were not set
    shared = {host for host in known if len(agents[host]) > 1}
    size = 1 + max((w.local_rank for w in ranks), default=0)
    return {
        w.rank: f"node{first[w.rank] // size}@{w.hostname}" if w.hostname in shared else w.hostname
        for w in ranks
    }


def lead_scope(report: WindowReport, hosts: dict[int, str]) -> dict[str, Any] | None:
    """Where the top stage's leading ranks run (``hosts``: each rank's node name, see
    ``node_names``): ``scope`` is ``rank`` (one leading rank), ``node`` (several, all on one
    node of a job that spans several: suspect the node, not a rank), ``hosts`` (several, on
    several nodes) or ``one_host_job`` (several, but the whole job runs on one node, so node
    and rank cannot be told apart). None without a top stage."""
    top = report.top1
    if top is None or top not in report.semantic_localization:
        return None
    ranks = report.semantic_localization[top].leading_ranks
    if not ranks:
        return None
    on = sorted({hosts.get(r, "") for r in ranks})
    if len(ranks) == 1:
        scope = "rank"
    elif len(set(hosts.values())) == 1:
        scope = "one_host_job"
    else:
        scope = "node" if len(on) == 1 else "hosts"
    return {"stage": top, "ranks": ranks, "hosts": on, "scope": scope}
