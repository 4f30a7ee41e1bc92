"""The windows whose packets the disk budget deleted or whose records it cut down to their
summary (``compacted.jsonl``, written by ``sinks.disk_budget``), read back one line at a time
and held as ranges of indices, so that a report can say a packet was compacted rather than
lost, and how many windows keep only their summary.

A range text is ``0/3-9, 0/11, 1/0-4``: (attempt, window) ranges of consecutive indices.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from itertools import groupby
from pathlib import Path

from .records import window_name

COMPACTED_FILE = "compacted.jsonl"


def window_ranges(orders: list[tuple[int, int]]) -> str:
    """``0/3-9, 0/11, 1/0-4``: windows (attempt, index) as ranges of consecutive indices
    (``listed_windows`` reads it back)."""
    parts = []
    for attempt, group in groupby(orders, key=lambda order: order[0]):
        indices = [index for _, index in group]
        start = previous = indices[0]
        for index in [*indices[1:], None]:
            if index is not None and index == previous + 1:
                previous = index
                continue
            parts.append(f"{attempt}/{start}" + (f"-{previous}" if previous > start else ""))
            if index is not None:
                start = previous = index
    return ", ".join(parts)


def _spans(ranges: str) -> list[tuple[int, int, int]]:
    """The (attempt, first, last) spans of a ``window_ranges`` text."""
    spans = []
    for part in filter(None, ranges.split(", ")):
        attempt, _, span = part.partition("/")
        first, _, last = span.partition("-")
        spans.append((int(attempt), int(first), int(last or first)))
    return spans


def listed_windows(ranges: str) -> list[tuple[int, int]]:
    """The windows (attempt, index) of a ``window_ranges`` text, in its order."""
    return [(a, i) for a, first, last in _spans(ranges) for i in range(first, last + 1)]


class Compacted:
    """The windows whose packets a folder's ``compacted.jsonl`` names (its windows and flagged
    windows), as sorted spans, and how many records it cut down to their summary
    (``records_cut``); a line that cannot be read is skipped (the file is advisory)."""

    def __init__(self, folder: Path) -> None:
        spans: list[tuple[int, int, int]] = []
        self.records_cut = 0
        path = folder / COMPACTED_FILE
        if path.is_file():
            with path.open("rb") as handle:
                for line in handle:
                    spans += _line_spans(line)
                    self.records_cut += _records_cut(line)
        self.spans = sorted(spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __contains__(self, window: tuple[int, int]) -> bool:
        at = bisect_right(self.spans, (window[0], window[1], 1 << 62)) - 1
        return at >= 0 and self.spans[at][0] == window[0] and self.spans[at][2] >= window[1]


def _line_spans(line: bytes) -> list[tuple[int, int, int]]:
    try:
        entry = json.loads(line)
        return _spans(str(entry.get("windows", ""))) + _spans(str(entry.get("flagged_windows", "")))
    except (ValueError, AttributeError):
        return []


def _records_cut(line: bytes) -> int:
    try:
        count = json.loads(line).get("records_cut", 0)
    except (ValueError, AttributeError):
        return 0
    return count if isinstance(count, int) and count > 0 else 0


def summarized_line(windows: list[tuple[int, int]], count: int) -> str:
    """``12 window(s) of windows.jsonl keep only their summary: ...``: ``windows`` the (attempt,
    window) of the first few of ``count``, in order."""
    shown = window_ranges(windows)
    more = f" and {count - len(windows)} more" if count > len(windows) else ""
    return (
        f"{count} window(s) of windows.jsonl keep only their summary (steps, ms/step, shares, "
        f"leaders, labels): their records were cut down by the disk budget ({shown}{more}; "
        "see compacted.jsonl)"
    )


def compacted_line(windows: list[tuple[int, int]], count: int) -> str:
    """``12 window(s) have no packet: compacted by the disk budget (0/1-6, 0/9 ...; see
    compacted.jsonl)``: ``windows`` the (attempt, window) of the first few of ``count``, in
    order."""
    shown = window_ranges(windows)
    more = f" and {count - len(windows)} more" if count > len(windows) else ""
    return (
        f"{count} window(s) of windows.jsonl have no packet: compacted by the disk budget "
        f"({shown}{more}; see compacted.jsonl)"
    )


class MissingPackets:
    """The windows of ``windows.jsonl`` whose packet is missing, told apart: those the disk
    budget compacted (``compacted.jsonl`` names them) and the others (not written); the first
    ten of each are kept, the rest counted."""

    def __init__(self, folder: Path) -> None:
        self.compacted = Compacted(folder)
        self.compacted_windows: list[tuple[int, int]] = []
        self.compacted_count = 0
        self.other_names: list[str] = []
        self.other_count = 0

    def add(self, attempt: int, window: int) -> None:
        """Count one window whose packet is missing."""
        if (attempt, window) in self.compacted:
            self.compacted_count += 1
            if len(self.compacted_windows) < 10:
                self.compacted_windows.append((attempt, window))
            return
        self.other_count += 1
        if len(self.other_names) < 10:
            self.other_names.append(window_name({"attempt": attempt, "window": window}))

    def lines(self) -> list[str]:
        """One line for the compacted windows and one for the others, each when any."""
        lines = []
        if self.compacted_count:
            lines.append(compacted_line(self.compacted_windows, self.compacted_count))
        if self.other_count:
            lines.append(packetless_line(self.other_names, self.other_count))
        return lines


def packetless_line(names: list[str], count: int) -> str:
    """``3 window(s) of windows.jsonl have no packet (3, 7, 9: ...)``: ``names`` the first few
    (at most ten named) of ``count``."""
    shown = names[:10]
    more = f" and {count - len(shown)} more" if count > len(shown) else ""
    return (
        f"{count} window(s) of windows.jsonl have no packet ({', '.join(shown)}{more}: "
        "not written, on a full disk say)"
    )
