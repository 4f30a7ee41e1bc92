"""StageFrontier: synchronization-aware stage accounting for distributed training."""

from .analysis import baselines
from .analysis.accounting import advances, frontier, prefixes, slack
from .analysis.analyzer import analyze
from .analysis.evidence import StageLocalization
from .analysis.gates import Gates
from .analysis.labels import ALL_LABELS
from .analysis.schema import DEFAULT_STAGES, RESIDUAL_STAGE
from .analysis.side import SideEvidence
from .analysis.window_report import WindowReport
from .collect.config import CollectConfig
from .errors import (
    CompareError,
    ContractViolation,
    DeadlineExceeded,
    DemoError,
    DurationsError,
    EmptyWindowError,
    FaultSpecError,
    GlooProtocolError,
    MisalignedStepsError,
    MissingDependencyError,
    MissingExtraError,
    MissingRanksError,
    MissingStagesError,
    ReportFormatError,
    RolesError,
    SideEvidenceError,
    StageFrontierError,
    StageNamesError,
    TraceFormatError,
)
from .record.recorder import StageTimer

__version__ = "0.1.0"

__all__ = [
    "ALL_LABELS",
    "DEFAULT_STAGES",
    "RESIDUAL_STAGE",
    "CollectConfig",
    "CompareError",
    "ContractViolation",
    "DeadlineExceeded",
    "DemoError",
    "DurationsError",
    "EmptyWindowError",
    "FaultSpecError",
    "Gates",
    "GlooProtocolError",
    "MisalignedStepsError",
    "MissingDependencyError",
    "MissingExtraError",
    "MissingRanksError",
    "MissingStagesError",
    "ReportFormatError",
    "RolesError",
    "SideEvidence",
    "SideEvidenceError",
    "StageFrontierError",
    "StageLocalization",
    "StageNamesError",
    "StageTimer",
    "TraceFormatError",
    "WindowReport",
    "__version__",
    "advances",
    "analyze",
    "baselines",
    "frontier",
    "prefixes",
    "slack",
]
