"""Checks of the timer's and the collection's settings, run once at construction.

A wrong type or an out-of-range value fails there with one TimerSettingError naming the argument,
never later as a numpy error, a MemoryError, an overflow in a timeout or a collector that waits
forever.
"""

from __future__ import annotations

import dataclasses
import math
import os
from numbers import Integral, Real
from typing import Any

from ..analysis.values import exact_type
from ..errors import TimerSettingError

MAX_WINDOW = 1_000_000
"""Steps per window: the window buffer is preallocated (8 bytes per step and stage column)."""
MAX_TIMEOUT_S = 86_400.0
"""A day: longer waits are a mistake, and much longer ones overflow a ``timedelta``."""
MAX_QUEUE_SIZE = 1024
"""Completed windows that may wait for the background thread: each holds a copy of its rows."""


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TimerSettingError(f"{name} must be an integer, got {value!r:.60}")
    number = int(value)
    if not low <= number <= high:
        raise TimerSettingError(f"{name} must be in [{low}, {high}], got {number}")
    return number


def check_number(
    name: str, value: Any, low: float, high: float, *, open_low: bool = False
) -> float:
    """A finite real in ``[low, high]`` (``(low, high]`` with ``open_low``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TimerSettingError(f"{name} must be a number, got {value!r:.60}")
    number = float(value)
    above = number > low if open_low else number >= low
    if not (math.isfinite(number) and above and number <= high):
        bracket = "(" if open_low else "["
        raise TimerSettingError(f"{name} must be in {bracket}{low:g}, {high:g}], got {value}")
    return number


def check_flag(name: str, value: Any) -> bool:
    return exact_type(value, bool, f"{name} must be True or False", TimerSettingError)


def check_optional_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    return exact_type(value, str, f"{name} must be a string or None", TimerSettingError)


def check_optional_callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TimerSettingError(f"{name} must be callable or None, got {value!r:.60}")
    return value


def check_path(name: str, value: Any) -> str | os.PathLike[str]:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise TimerSettingError(f"{name} must be a non-empty path, got {value!r:.60}")
    return value


def check_has_methods(name: str, value: Any, *methods: str) -> Any:
    missing = [m for m in methods if not callable(getattr(value, m, None))]
    if missing:
        raise TimerSettingError(f"{name} {value!r:.60} has no {', '.join(missing)} method")
    return value


FLAG: dict[str, Any] = {"flag": True}
"""A dataclass field's ``metadata`` for a setting that is True or False (``check_fields``)."""


def between(low: float, high: float, *, open_low: bool = False) -> dict[str, Any]:
    """A dataclass field's ``metadata`` for a setting in ``[low, high]`` (``(low, high]`` with
    ``open_low``): an integer where both bounds are integers, else a finite number."""
    return {"between": (low, high, open_low)}


def check_fields(settings: Any, owner: str) -> None:
    """Check each field of the dataclass ``settings`` that states its range (``between``) or is
    a flag (``FLAG``), in their order; the first wrong one raises TimerSettingError naming it
    as ``{owner} {field}``."""
    for item in dataclasses.fields(settings):
        name, value = f"{owner} {item.name}", getattr(settings, item.name)
        if "flag" in item.metadata:
            check_flag(name, value)
        elif "between" in item.metadata:
            low, high, open_low = item.metadata["between"]
            if isinstance(low, int) and isinstance(high, int):
                check_int(name, value, low, high)
            else:
                check_number(name, value, low, high, open_low=open_low)
