"""``windows.jsonl``: one JSON record per analyzed window (its metadata and its report).

A record holds the window's report and where it came from, not its matrix: re-analysis needs the
window's evidence packet. Records are matched by window index, and by restart attempt when a
torchelastic restart counted windows from 0 again.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..analysis.window_report import REPORT_FORMAT, WindowReport
from ..errors import ReportFormatError

WINDOWS_FILE = "windows.jsonl"
REPORT_KEYS = frozenset(f.name for f in fields(WindowReport)) | {"format", "version"}
"""The record keys that belong to the report; the others describe the window."""


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a ``windows.jsonl`` file, in file order (blank lines skipped).

    Raises:
        ReportFormatError: a line is not a JSON object, naming the file and line.
    """
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ReportFormatError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(record, dict):
                raise ReportFormatError(f"{path}:{number}: not a window record (a JSON object)")
            records.append(record)
    return records


def looks_like_records(head: bytes) -> bool:
    """Whether the first bytes of a file are a ``windows.jsonl`` record: a one-line JSON object
    that carries a window report."""
    first = head.split(b"\n", 1)[0]
    return first.startswith(b"{") and f'"{REPORT_FORMAT}"'.encode() in first


def select_record(
    records: list[dict[str, Any]], window: int, attempt: int | None, label: str
) -> dict[str, Any]:
    """The record of ``window`` (in ``attempt``, needed only when a restart repeats the index).

    Raises:
        ReportFormatError: no such window, or several attempts hold it and none was named.
    """
    found = [
        r
        for r in records
        if r.get("window") == window and (attempt is None or r.get("attempt", 0) == attempt)
    ]
    if len(found) == 1:
        return found[0]
    if found:
        attempts = ", ".join(str(r.get("attempt", 0)) for r in found)
        raise ReportFormatError(
            f"{label}: window {window} is in restart attempts {attempts}; name one as "
            f"ATTEMPT/{window}"
        )
    held = ", ".join(window_name(r) for r in records) or "none"
    wanted = f"{attempt}/{window}" if attempt is not None else str(window)
    raise ReportFormatError(f"{label}: no window {wanted}; it holds windows {held}")


def window_name(record: dict[str, Any]) -> str:
    """``3``, or ``1/3`` for window 3 of restart attempt 1 (as ``stagefrontier report`` lists)."""
    attempt = record.get("attempt", 0)
    return f"{attempt}/{record.get('window', '?')}" if attempt else str(record.get("window", "?"))


def record_report(record: dict[str, Any], label: str) -> WindowReport:
    """The report stored in a record."""
    try:
        return WindowReport.from_dict({k: v for k, v in record.items() if k in REPORT_KEYS})
    except ReportFormatError as exc:
        raise ReportFormatError(f"{label}: {exc}") from None


def record_meta(record: dict[str, Any]) -> dict[str, Any]:
    """The record's description of its window (everything but the report)."""
    return {k: v for k, v in record.items() if k not in REPORT_KEYS}
