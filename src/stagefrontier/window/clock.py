"""The wall clock of a window or an incident: nanoseconds since the epoch as the UTC time and
the host's offset from UTC that a ``wall_clock`` object holds (``formats.wall_clock`` checks
and says them)."""

from __future__ import annotations

from datetime import datetime, timezone


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
