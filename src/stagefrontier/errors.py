"""Exception hierarchy. Every error the analyzer raises on bad input derives from one root."""

from __future__ import annotations


class StageFrontierError(Exception):
    """Root of every error raised by stagefrontier."""


class DurationsError(StageFrontierError, ValueError):
    """The duration matrix has the wrong shape or holds NaN, infinite or negative values."""


class EmptyWindowError(DurationsError):
    """The window holds no steps, ranks or stages."""


class StageNamesError(StageFrontierError, ValueError):
    """The stage list does not match the matrix, is empty, or repeats a name."""


class RolesError(StageFrontierError, ValueError):
    """The role list does not give exactly one role per rank."""


class SideEvidenceError(StageFrontierError, ValueError):
    """Side evidence (CUDA-event samples, accumulation info, telemetry errors) is malformed."""


class ReportFormatError(StageFrontierError, ValueError):
    """A serialized report, packet or input file is corrupt, truncated or of an unknown version."""
