"""Errors raised while reducing a profiler trace to the ordered stage matrix (defined in
``stagefrontier.errors``; importable from here too).

The trace errors derive from ``ReportFormatError`` (bad input file), so callers that already handle
unreadable packets handle unusable traces too. Every message names the file (or files) it is about.
"""

from __future__ import annotations

from ..errors import (
    AmbiguousStageOrderError,
    MisalignedStepsError,
    MissingDependencyError,
    MissingRanksError,
    MissingStagesError,
    TraceFormatError,
)

__all__ = [
    "AmbiguousStageOrderError",
    "MisalignedStepsError",
    "MissingDependencyError",
    "MissingRanksError",
    "MissingStagesError",
    "TraceFormatError",
]
