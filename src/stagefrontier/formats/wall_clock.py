"""Times of day: when a window ran, or an incident opened, on the wall clock.

A window's record, the run report and an incident carry a ``wall_clock`` object so that a person
can line them up with an alert, a log or a dashboard: ``{"start": "2026-11-27T20:20:19.123Z",
"end": "2026-11-27T20:20:22.987Z", "utc_offset": "+01:00"}``, UTC times to the millisecond and
the offset of the writing host's local time from UTC (at ``start``). Files written before these
fields read as before; their times show as unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_OFFSET = re.compile(r"[+-]\d\d:\d\d")
KEYS = ("start", "end", "utc_offset")


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


def wall_clock_problem(value: Any) -> str:
    """What is wrong with a ``wall_clock`` object read from a file ("" when nothing is)."""
    if not isinstance(value, Mapping) or set(value) - set(KEYS):
        return "an object of start, end and utc_offset"
    for key in ("start", "end"):
        if key in value and not (isinstance(value[key], str) and _ISO.fullmatch(value[key])):
            return f"an object whose {key} is a UTC time like 2026-11-27T20:20:19.123Z"
    offset = value.get("utc_offset", "+00:00")
    if not (isinstance(offset, str) and _OFFSET.fullmatch(offset)):
        return "an object whose utc_offset is like +01:00"
    return ""


def clock_of(record: Mapping[str, Any]) -> dict[str, str] | None:
    """The record's ``wall_clock`` when it holds a start (and is well formed), else None."""
    clock = record.get("wall_clock")
    if not isinstance(clock, Mapping) or wall_clock_problem(clock) or "start" not in clock:
        return None
    return {
        "start": clock["start"],
        "end": clock.get("end", clock["start"]),
        "utc_offset": clock.get("utc_offset", "+00:00"),
    }


def run_clock(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A record-like object whose ``wall_clock`` spans the records' windows (first start to
    last end), for ``span_text``; empty when the first or last window has no times."""
    first, last = (clock_of(records[0]), clock_of(records[-1])) if records else (None, None)
    if first is None or last is None:
        return {}
    return {"wall_clock": {**first, "end": last["end"]}}


def span_text(record: Mapping[str, Any], dated: bool = False) -> str:
    """``20:20:19-20:20:22 UTC`` (``2026-11-27 20:20:19-20:20:22 UTC`` when ``dated``), with
    `` (local UTC+01:00)`` when the writer's local time is not UTC; ``?`` when the record has
    no times (written before they were kept)."""
    clock = clock_of(record)
    if clock is None:
        return "?"
    start, end = clock["start"], clock["end"]
    day = start[:10] + " " if dated else ""
    end_day = end[:10] + " " if dated and end[:10] != start[:10] else ""
    text = f"{day}{start[11:19]}-{end_day}{end[11:19]} UTC"
    offset = clock["utc_offset"]
    return text if offset == "+00:00" else f"{text} (local UTC{offset})"


def clock_cell(record: Mapping[str, Any]) -> str:
    """``20:20:19-20:20:22``: a window's times of day in UTC for a table, ``?`` when unknown."""
    clock = clock_of(record)
    return "?" if clock is None else f"{clock['start'][11:19]}-{clock['end'][11:19]}"
