"""The disk budget's second resort: old healthy windows' records cut down to their summary.

``windows.jsonl`` is most of a long run's folder once its packets are compacted (about 7 kB a
window at 2 ranks). A record the run's report no longer shows one by one keeps only what its
summary reads (``formats.window_rows.summary_record``: the window's steps, ms/step, shares,
leaders and labels, about a fifth of it), marked ``"compacted": true``. A record stays whole
when its window was flagged by the live regression check, an incident was opened on it, the
profiler router worked in it (``formats.run_digest.router_worked``: a capture, or its export
and reduction costing a rank over 1% of the window), or it is among the newest records; so
is every line this cannot read. The file is rewritten through a temporary file and renamed
into place, so a reader sees the old file or the new one, whole; the ``JsonlSink`` then
appends to the new one (``DiskBudget.records_rewrites``)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ReportFormatError
from ..formats.packet import atomic_file
from ..formats.records import COMPACTED_MARK
from ..formats.run_digest import router_worked
from ..formats.window_rows import record_row, summary_record

Order = tuple[int, int]
"""A window's place in its folder: (attempt, window)."""


def compact_records(path: Path, keep: set[Order], newest: Order) -> tuple[list[Order], int]:
    """Rewrite ``windows.jsonl`` at ``path`` with the records of the windows before ``newest``
    cut down to their summary, but for those in ``keep`` and those that stay whole (see the
    module doc). Returns the windows whose records it cut, in file order, and the bytes it
    freed. Raises OSError (the file is then left as it was)."""
    cut: list[Order] = []
    before = path.stat().st_size
    with path.open("rb") as source, atomic_file(path) as target:
        for line in source:
            summary = _summary_line(line, keep, newest)
            if summary is None:
                target.write(line)
                continue
            order, data = summary
            cut.append(order)
            target.write(data)
    return cut, before - path.stat().st_size


def _summary_line(line: bytes, keep: set[Order], newest: Order) -> tuple[Order, bytes] | None:
    """The window and summary line of a record to cut, None for a line to copy as it is."""
    if COMPACTED_MARK in line or not line.endswith(b"\n"):
        return None
    try:
        record = json.loads(line)
        order = (int(record.get("attempt", 0)), int(record["window"]))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    if order >= newest or order in keep:
        return None
    try:
        row = record_row(record)
    except ReportFormatError:
        return None
    if row.regression or router_worked(row):
        return None
    summary = summary_record(record, row)
    return order, (json.dumps(summary, allow_nan=False) + "\n").encode("utf-8")
