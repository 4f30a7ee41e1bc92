"""A stored report (a ``windows.jsonl`` record's, a packet's) and the window facts stored
beside it, checked value by value against their declarations.

The report and plot commands format what a report holds (shares as percentages, leaders as ranks,
reasons as lines, the window's steps, hosts and lead scope). Stored data is input like any other,
so every value a renderer reads is checked here first: a report's against the field types
``WindowReport`` declares (``formats.typed``), the window facts against ``WindowFacts``. Their
JSON Schemas are ``docs/schemas/window-report.json`` and ``docs/schemas/window-facts.json``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError
from .typed import Amount, Count, Number, Text, check
from .wall_clock import WallClock


def check_stored_report(report: WindowReport) -> WindowReport:
    """``report`` when every value has the type ``WindowReport`` declares for it (role reports
    too), it covers at least one step and rank, its per-stage tables hold one value per stage
    (the semantic ones one per semantic stage), and its top stages are among its semantic
    shares.

    Raises:
        ReportFormatError: the first field that does not, by name.
    """
    check(report.to_dict(), WindowReport, "malformed report")
    _check_consistent(report)
    return report


def _check_consistent(report: WindowReport) -> None:
    if report.n_steps < 1 or report.n_ranks < 1:
        raise ReportFormatError(
            f"a report of {report.n_steps} step(s) and {report.n_ranks} rank(s)"
        )
    for names, keys in (
        (("shares", "advances", "direct_gain", "leaders", "localization"), set(report.stages)),
        (("semantic_gain", "semantic_localization"), set(report.semantic_shares)),
    ):
        for name in names:
            if set(getattr(report, name)) != keys:
                raise ReportFormatError(
                    f"malformed report: field {name!r} does not hold one value per stage"
                )
    for name in ("top1", "top2"):
        top = getattr(report, name)
        if top is not None and top not in report.semantic_shares:
            raise ReportFormatError(f"malformed report: {name} {top!r} has no share")
    for role, own in (report.role_reports or {}).items():
        try:
            _check_consistent(own)
        except ReportFormatError as exc:
            raise ReportFormatError(f"role {role}'s report: {exc}") from None


class Lead(msgspec.Struct):
    """Where the top stage's leading ranks run (``window.merged.lead_scope``)."""

    scope: str | UnsetType = UNSET
    ranks: list[int] | UnsetType = UNSET
    hosts: list[str] | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.scope == "node" and not (self.hosts and isinstance(self.ranks, list)):
            raise ValueError("a node's lead must name its hosts and ranks")


class BlockLeadFacts(msgspec.Struct):
    """The data wait's lead over blocks of steps (``analysis.block_lead``)."""

    stage: str
    why: str
    size: Annotated[int, msgspec.Meta(ge=2)]
    rank: Count | None = None


class CollectiveFacts(msgspec.Struct):
    """One collective's reading as the verdict says it (``analysis.collectives``)."""

    family: Text
    bucket: Count
    stage: Text | None
    nbytes: Count
    last_bucket: bool
    spread_ms: Number
    transfer_ms: Number
    late_rank: Count | None = None
    lateness_ms: Number = 0.0


class SlowCollectiveFacts(CollectiveFacts):
    """A slow collective against its baseline (``analysis.collective_baseline``)."""

    baseline_ms: Number = 0.0
    baseline_windows: Annotated[list[Count], msgspec.Meta(min_length=2, max_length=2)] = []


class CommunicationFacts(msgspec.Struct):
    """What the verdict reads of a window's timed collectives (the record's
    ``communication``)."""

    late: CollectiveFacts | None = None
    slow: SlowCollectiveFacts | None = None


class HostSignals(msgspec.Struct):
    """Rank 0's host over a window (``collect.host_signals``); each signal absent where it could
    not be read."""

    load_average: Amount | UnsetType = UNSET
    cpus: Annotated[int, msgspec.Meta(ge=1, le=2**20)] | UnsetType = UNSET
    cpu_per_wall: Amount | UnsetType = UNSET
    steal_share: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    throttled_periods: Count | UnsetType = UNSET
    throttled_ms: Amount | UnsetType = UNSET


class LeadBelowTop(msgspec.Struct):
    """A stage below the top one that one rank leads (``block_lead.routed_lead_below_top``)."""

    stage: str
    rank: Annotated[int, msgspec.Meta(ge=0)]


class WindowFacts(msgspec.Struct):
    """The facts of a window a renderer reads, stored beside its report (a record's fields
    other than the report's, a packet's ``meta``); each is checked when present, and other keys
    are free-form."""

    window: Count | UnsetType = UNSET
    attempt: Count | UnsetType = UNSET
    first_step: int | UnsetType = UNSET
    last_step: int | UnsetType = UNSET
    world_size: int | UnsetType = UNSET
    ranks_present: list[int] | UnsetType = UNSET
    missing_ranks: list[int] | UnsetType = UNSET
    gather_ok: bool | UnsetType = UNSET
    paused_steps: Count | UnsetType = UNSET
    self_cost: dict[str, Any] | UnsetType = UNSET
    hosts: dict[str, str] | list[str] | UnsetType = UNSET
    lead: Lead | UnsetType | None = UNSET
    """None without a top stage: mixed roles, or no exposed time."""
    block_lead: BlockLeadFacts | UnsetType | None = UNSET
    """None without a data wait on top, or a DataLoader handing batches over in bursts."""
    wall_clock: WallClock | UnsetType = UNSET
    """When the window ran (``formats.wall_clock``); absent from records written before."""
    communication: CommunicationFacts | UnsetType | None = UNSET
    """The timed collectives' reading (``timer.watch_ddp``); None when none were watched, absent
    from records written before."""
    host_signals: HostSignals | UnsetType = UNSET
    """Rank 0's host signals over the window; absent from records written before."""
    lead_below_top: LeadBelowTop | UnsetType | None = UNSET
    """The stage below the top one that one rank leads and the router captures
    (``AnalyzedWindow.lead_below_top``); None without one; absent from records written before,
    whose verdict judges it again from the report with the router's default settings."""


def check_window_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (a record's window facts, a packet's ``meta``) when each fact a renderer reads
    has its type (``WindowFacts``).

    Raises:
        ReportFormatError: the first fact that does not, by name.
    """
    check(meta, WindowFacts, "window facts")
    return meta
