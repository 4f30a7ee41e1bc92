"""Exact type tests for values read from JSON or given by a caller.

Python counts ``True`` as the int 1 and ``1.0 == 1`` holds, so ``isinstance`` and ``==`` alone let
``"version": true`` or ``1.0`` pass as the integer 1. These tests do not.
"""

from __future__ import annotations

import numbers
from typing import Any, TypeGuard


def is_int(value: Any) -> TypeGuard[int]:
    """An integer (Python or numpy), not a bool and not a float with an integral value."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> TypeGuard[float]:
    """A real number (int or float, Python or numpy), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_version(value: Any, expected: int) -> bool:
    """Whether a format's ``version`` field is exactly the integer ``expected``."""
    return is_int(value) and value == expected
