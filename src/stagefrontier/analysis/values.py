"""Exact type tests for values read from JSON or given by a caller.

Python counts ``True`` as the int 1 and ``1.0 == 1`` holds, so ``isinstance`` and ``==`` alone let
``"version": true`` or ``1.0`` pass as the integer 1. These tests do not.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any, TypeGuard, TypeVar

from ..errors import ReportFormatError

T = TypeVar("T")


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (Python or numpy), not a bool and not a float with an integral value."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> TypeGuard[float]:
    """A real number (int or float, Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_version(value: Any, expected: int) -> bool:
    """Whether a format's ``version`` field is exactly the integer ``expected``."""
    return is_int(value) and value == expected


def exact_type(value: Any, kind: type[T], message: str, error: type[Exception]) -> T:
    """``value`` when its type is exactly ``kind`` (a bool is no int, an int no float); else
    raises ``error`` with ``message`` and the value, shortened."""
    if type(value) is not kind:
        raise error(f"{message}, got {value!r:.60}")
    return value


def check_document(
    obj: Any, fmt: str, version: int, what: str, required: Iterable[str] = (), source: str = ""
) -> dict[str, Any]:
    """A parsed JSON document of format ``fmt`` and ``version`` holding every ``required``
    field (a packet, a report, an incident); raises ReportFormatError naming ``what`` (after
    ``source``, the file, when given). What the document states is quoted shortened."""
    at = f"{source}: " if source else ""
    if not isinstance(obj, dict):
        raise ReportFormatError(f"{at}{what} must be a JSON object, got {type(obj).__name__}")
    if obj.get("format") != fmt:
        raise ReportFormatError(
            f"{at}not a stagefrontier {what}: format is {obj.get('format')!r:.60}, expected {fmt!r}"
        )
    if not is_version(obj.get("version"), version):
        raise ReportFormatError(
            f"{at}unknown {what} version {obj.get('version')!r:.20}: this stagefrontier reads "
            f"version {version}"
        )
    missing = [k for k in required if k not in obj]
    if missing:
        raise ReportFormatError(f"{at}{what} is missing field(s) {missing}")
    return obj
