"""Checks for the values in a window payload's JSON block, one per declared field kind.

Every value read off the wire is checked for its exact JSON type and range before it reaches a
RankWindow, so a malformed payload is a ReportFormatError for that rank only, never an overflow,
a bool read as a count or a float read as a rank.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..analysis.collective_checks import check_rank_collectives
from ..analysis.values import exact_type
from ..errors import ReportFormatError

MAX_COUNT = (1 << 62) - 1
"""Far above any real step, pid or count; below int64, so numpy never overflows on it."""


def check_meta_value(kind: str, value: Any, where: str) -> Any:
    """``value`` as the field of that kind holds it; raises ReportFormatError otherwise."""
    try:
        check = _CHECKS[kind]
    except KeyError:
        raise ReportFormatError(f"{where}: unknown field kind {kind!r}") from None
    return check(value, where)


def _integer(value: Any, where: str, low: int) -> int:
    if type(value) is not int or not low <= value <= MAX_COUNT:
        raise ReportFormatError(f"{where} must be an integer in [{low}, 2**62), got {value!r:.40}")
    return value


def _count(value: Any, where: str) -> int:
    return _integer(value, where, 0)


def _positive(value: Any, where: str) -> int:
    return _integer(value, where, 1)


def _flag(value: Any, where: str) -> bool:
    return exact_type(value, bool, f"{where} must be true or false", ReportFormatError)


def _text(value: Any, where: str) -> str:
    return exact_type(value, str, f"{where} must be a string", ReportFormatError)


def _optional_text(value: Any, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _names(value: Any, where: str) -> tuple[str, ...]:
    if type(value) is not list:
        raise ReportFormatError(f"{where} must be a list of strings, got {value!r:.40}")
    return tuple(_text(v, where) for v in value)


def _ranges(value: Any, where: str) -> tuple[tuple[int, int], ...]:
    """Inclusive ``[first, last]`` step ranges, ``first <= last``."""
    if type(value) is not list:
        raise ReportFormatError(f"{where} must be a list of [first, last] pairs, got {value!r:.40}")
    out = []
    for pair in value:
        if type(pair) is not list or len(pair) != 2:
            raise ReportFormatError(f"{where} must hold [first, last] pairs, got {pair!r:.40}")
        first, last = _count(pair[0], where), _count(pair[1], where)
        if first > last:
            raise ReportFormatError(f"{where} holds the empty range [{first}, {last}]")
        out.append((first, last))
    return tuple(out)


def _probes(value: Any, where: str) -> dict[str, dict[str, float]]:
    if type(value) is not dict:
        raise ReportFormatError(f"{where} must be an object, got {value!r:.40}")
    out: dict[str, dict[str, float]] = {}
    for name, stats in value.items():
        if type(stats) is not dict:
            raise ReportFormatError(f"{where}[{name!r}] must be an object")
        out[name] = {}
        for key, number in stats.items():
            if type(number) not in (int, float) or not math.isfinite(number):
                raise ReportFormatError(f"{where}[{name!r}][{key!r}] must be a finite number")
            out[name][key] = float(number)
    return out


LOADER_COUNTS = ("workers", "batches", "consumed")
LOADER_SECONDS = ("busy_s", "finished_busy_s", "span_s", "hung_s")


def _loader(value: Any, where: str) -> dict[str, Any]:
    """A DataLoader's worker counts (``record.loader_workers``): known keys only, counts as
    integers, seconds finite and >= 0, an optional note."""
    if type(value) is not dict:
        raise ReportFormatError(f"{where} must be an object, got {value!r:.40}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in LOADER_COUNTS:
            out[key] = _count(item, f"{where}[{key!r}]")
        elif key in LOADER_SECONDS:
            if type(item) not in (int, float) or not (math.isfinite(item) and item >= 0):
                raise ReportFormatError(f"{where}[{key!r}] must be a finite number >= 0")
            out[key] = float(item)
        elif key == "note":
            out[key] = _text(item, f"{where}[{key!r}]")
        else:
            raise ReportFormatError(f"{where} holds the unknown key {key!r:.40}")
    return out


_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "count": _count,
    "positive": _positive,
    "flag": _flag,
    "text": _text,
    "optional_text": _optional_text,
    "names": _names,
    "probes": _probes,
    "ranges": _ranges,
    "loader": _loader,
    "collectives": check_rank_collectives,
}
