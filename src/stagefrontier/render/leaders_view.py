"""The run report's leaders view: which ranks set the frontier, in which stage, window by
window, or bucket by bucket for a summarized run (``formats.run_digest``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..analysis.leaders import window_leaders
from ..analysis.window_report import WindowReport
from ..formats.run_digest import Bucket
from .plots import RESIDUAL_COLOR
from .run_summary import bucket_span
from .text import index_text

MAX_LEADER_ROWS = 64
"""The leaders view lists at most this many ranks (those that led the most windows first)."""


@dataclass(frozen=True)
class LeaderCell:
    """A rank's cell in a window where it sets the frontier: its stage's colour and share."""

    tip: str
    color: str
    share: str


@dataclass(frozen=True)
class Leaders:
    """The leaders view: ``rows`` are (rank, one cell or None per window) for the ranks that
    ever lead (at most ``MAX_LEADER_ROWS``; ``hidden`` more left out), of ``ranks``."""

    leading: int
    ranks: int
    hidden: int
    windows: list[str]
    rows: list[tuple[int, list[LeaderCell | None]]]


def leaders_view(
    windows: list[tuple[WindowReport, dict[str, Any]]], stages: list[str], colors: list[str]
) -> Leaders:
    """Rank by window: a coloured cell where the rank sets the frontier, in the colour of the
    stage it leads, with that stage's share. Only ranks that ever lead are listed."""
    color = dict(zip(stages, colors, strict=True))
    per_window = [window_leaders(report) for report, _ in windows]
    count: dict[int, int] = {}
    for leaders in per_window:
        for rank in leaders:
            count[rank] = count.get(rank, 0) + 1
    ranks = sorted(sorted(count, key=lambda r: (-count[r], r))[:MAX_LEADER_ROWS])
    rows: list[tuple[int, list[LeaderCell | None]]] = []
    for rank in ranks:
        cells: list[LeaderCell | None] = []
        for (_, meta), leaders in zip(windows, per_window, strict=True):
            if rank not in leaders:
                cells.append(None)
                continue
            stage, share = leaders[rank]
            tip = f"window {index_text(meta)}: rank {rank} sets {stage} ({share:.0%})"
            cells.append(LeaderCell(tip, color.get(stage, RESIDUAL_COLOR), f"{share:.0%}"))
        rows.append((rank, cells))
    return Leaders(
        leading=len(count),
        ranks=max(report.n_ranks for report, _ in windows),
        hidden=len(count) - len(ranks),
        windows=[index_text(meta) for _, meta in windows],
        rows=rows,
    )


def bucket_leaders_view(
    buckets: list[Bucket], ranks: int, stages: list[str], colors: list[str]
) -> Leaders:
    """Rank by bucket: a coloured cell where the rank set the frontier in some window of the
    bucket, in the colour of the stage it led most there, with the share of the bucket's
    windows it led one in."""
    color = dict(zip(stages, colors, strict=True))
    count: dict[int, int] = {}
    for bucket in buckets:
        for rank, (_, windows) in bucket.leaders.items():
            count[rank] = count.get(rank, 0) + windows
    chosen = sorted(sorted(count, key=lambda r: (-count[r], r))[:MAX_LEADER_ROWS])
    rows: list[tuple[int, list[LeaderCell | None]]] = []
    for rank in chosen:
        cells: list[LeaderCell | None] = []
        for bucket in buckets:
            if rank not in bucket.leaders:
                cells.append(None)
                continue
            stage, windows = bucket.leaders[rank]
            tip = (
                f"windows {bucket_span(bucket)}: rank {rank} leads in {windows} of "
                f"{bucket.count} windows, most often {stage}"
            )
            share = f"{windows / bucket.count:.0%}"
            cells.append(LeaderCell(tip, color.get(stage, RESIDUAL_COLOR), share))
        rows.append((rank, cells))
    return Leaders(
        leading=len(count),
        ranks=ranks,
        hidden=len(count) - len(chosen),
        windows=[bucket_span(bucket) for bucket in buckets],
        rows=rows,
    )
