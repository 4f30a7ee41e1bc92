"""StageFrontier: synchronization-aware stage accounting for distributed training."""

from . import baselines
from .accounting import advances, frontier, prefixes, slack
from .analyzer import analyze
from .errors import (
    DurationsError,
    EmptyWindowError,
    ReportFormatError,
    RolesError,
    SideEvidenceError,
    StageFrontierError,
    StageNamesError,
)
from .evidence import StageLocalization
from .gates import Gates
from .labels import ALL_LABELS
from .recorder import ContractViolation, StageTimer
from .report import WindowReport
from .schema import DEFAULT_STAGES, RESIDUAL_STAGE
from .side import SideEvidence

__version__ = "0.1.0"

__all__ = [
    "ALL_LABELS",
    "DEFAULT_STAGES",
    "RESIDUAL_STAGE",
    "ContractViolation",
    "DurationsError",
    "EmptyWindowError",
    "Gates",
    "ReportFormatError",
    "RolesError",
    "SideEvidence",
    "SideEvidenceError",
    "StageFrontierError",
    "StageLocalization",
    "StageNamesError",
    "StageTimer",
    "WindowReport",
    "__version__",
    "advances",
    "analyze",
    "baselines",
    "frontier",
    "prefixes",
    "slack",
]
