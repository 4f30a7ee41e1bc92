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
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

UTC_TIME = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"
"""A ``wall_clock`` time: UTC to the millisecond, ``2026-11-27T20:20:19.123Z``."""
UTC_OFFSET = r"^[+-]\d\d:\d\d$"
"""A ``wall_clock`` offset from UTC: ``+01:00``."""
_ISO = re.compile(UTC_TIME)
_OFFSET = re.compile(UTC_OFFSET)


class WallClock(msgspec.Struct, forbid_unknown_fields=True):
    """A ``wall_clock`` object as a window record, packet or incident holds it, checked on
    read; an empty one (the start unknown) holds no field."""

    start: Annotated[str, msgspec.Meta(pattern=UTC_TIME)] | UnsetType = UNSET
    end: Annotated[str, msgspec.Meta(pattern=UTC_TIME)] | UnsetType = UNSET
    utc_offset: Annotated[str, msgspec.Meta(pattern=UTC_OFFSET)] | UnsetType = UNSET


KEYS = ("start", "end", "utc_offset")


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
