"""Which sinks a collector writes to: the one place the default list is chosen."""

from __future__ import annotations

import os
from collections.abc import Sequence

from .base import Sink
from .files import JsonlSink, PacketSink
from .log import LogSink


def default_sinks(
    out_dir: str | os.PathLike[str],
    packets: bool = False,
    log: bool = True,
    disk_budget_bytes: int | None = None,
) -> list[Sink]:
    """JSONL and (unless ``log`` is False) the log line; with ``packets``, an evidence packet
    per window too. ``disk_budget_bytes``: the folder's budget (None:
    ``STAGEFRONTIER_DISK_BUDGET_MB``)."""
    sinks: list[Sink] = [JsonlSink(out_dir, disk_budget_bytes)]
    if log:
        sinks.append(LogSink())
    if packets:
        sinks.append(PacketSink(out_dir, disk_budget_bytes))
    return sinks


def collector_sinks(
    rank: int,
    out_dir: str | os.PathLike[str],
    *,
    distributed: bool,
    sinks: Sequence[Sink] | None = None,
    extra: Sequence[Sink] = (),
    log: bool = True,
    disk_budget_bytes: int | None = None,
) -> list[Sink]:
    """The sinks a collector on ``rank`` owns. Only rank 0 writes windows, so other ranks own
    none. Rank 0 owns ``sinks`` when given, else the defaults (``windows.jsonl``, the log line
    unless ``log`` is False, and under ``distributed`` collection an evidence packet per
    window, the folder held to ``disk_budget_bytes``), followed by ``extra``."""
    if rank != 0:
        return []
    if sinks is None:
        sinks = default_sinks(out_dir, distributed, log, disk_budget_bytes)
    return [*sinks, *extra]
