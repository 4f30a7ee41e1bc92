"""Errors raised while reducing a profiler trace to the ordered stage matrix.

The trace errors derive from ``ReportFormatError`` (bad input file), so callers that already handle
unreadable packets handle unusable traces too. Every message names the file (or files) it is about.
"""

from __future__ import annotations

from ..errors import ReportFormatError, StageFrontierError


class TraceFormatError(ReportFormatError):
    """A trace file is unreadable, of an unknown layout, or holds no usable step ranges."""


class MissingStagesError(TraceFormatError):
    """An ordered stage has no range at all on some rank: reducing would invent zeros."""


class MissingRanksError(TraceFormatError):
    """The job's world size names ranks that no trace file covers."""


class MisalignedStepsError(TraceFormatError):
    """The ranks' traces hold different step ids and strict alignment was asked for, or no step
    id is common to every rank."""


class MissingDependencyError(StageFrontierError, ImportError):
    """An optional package a reducer needs (HolisticTraceAnalysis) is not installed."""
