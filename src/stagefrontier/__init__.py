"""StageFrontier: synchronization-aware stage accounting for distributed training."""

import logging

from .analysis import baselines
from .analysis.accounting import advances, frontier, prefixes, slack
from .analysis.analyzer import analyze, analyze_summary
from .analysis.evidence import StageLocalization
from .analysis.gates import Gates
from .analysis.labels import ALL_LABELS
from .analysis.regression import RegressionConfig
from .analysis.schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    DEFAULT_STAGES,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
    STEP_ANNOTATION,
)
from .analysis.side import SideEvidence
from .analysis.summary import WindowSummary, combine, summarize
from .analysis.window_report import WindowReport
from .collect.config import CollectConfig
from .errors import (
    AmbiguousStageOrderError,
    CompareError,
    ContractViolation,
    DeadlineExceeded,
    DemoError,
    DemoSettingsError,
    DurationsError,
    EmptyWindowError,
    FaultSpecError,
    GatesError,
    GlooProtocolError,
    MisalignedStepsError,
    MissingDependencyError,
    MissingExtraError,
    MissingRanksError,
    MissingStagesError,
    NotJsonError,
    ReportFormatError,
    RolesError,
    SideEvidenceError,
    SinkSettingError,
    StageFrontierError,
    StageNamesError,
    SummaryError,
    TimerSettingError,
    TraceFormatError,
)
from .formats.packet import Packet, read_packet, write_packet
from .formats.run_folder import RunWindows, load_run
from .formats.summary_codec import decode_summary, encode_summary
from .load import LoadedWindow, load_window
from .record.config import SamplingConfig, TimerConfig
from .record.recorder import StageTimer
from .reducers import ReducedTrace, TraceOptions, reduce_hta, reduce_kineto, reduce_nsys
from .route import ProfilerRouter

__version__ = "0.1.0"

# The library shows nothing by itself: the application's logging configuration decides.
logging.getLogger("stagefrontier").addHandler(logging.NullHandler())

__all__ = [
    "ALL_LABELS",
    "BACKWARD_STAGE",
    "CALLBACKS_STAGE",
    "DATA_STAGE",
    "DEFAULT_STAGES",
    "FORWARD_STAGE",
    "OPTIMIZER_STAGE",
    "RESIDUAL_STAGE",
    "STEP_ANNOTATION",
    "AmbiguousStageOrderError",
    "CollectConfig",
    "CompareError",
    "ContractViolation",
    "DeadlineExceeded",
    "DemoError",
    "DemoSettingsError",
    "DurationsError",
    "EmptyWindowError",
    "FaultSpecError",
    "Gates",
    "GatesError",
    "GlooProtocolError",
    "LoadedWindow",
    "MisalignedStepsError",
    "MissingDependencyError",
    "MissingExtraError",
    "MissingRanksError",
    "MissingStagesError",
    "NotJsonError",
    "Packet",
    "ProfilerRouter",
    "ReducedTrace",
    "RegressionConfig",
    "ReportFormatError",
    "RolesError",
    "RunWindows",
    "SamplingConfig",
    "SideEvidence",
    "SideEvidenceError",
    "SinkSettingError",
    "StageFrontierError",
    "StageLocalization",
    "StageNamesError",
    "StageTimer",
    "SummaryError",
    "TimerConfig",
    "TimerSettingError",
    "TraceFormatError",
    "TraceOptions",
    "WindowReport",
    "WindowSummary",
    "__version__",
    "advances",
    "analyze",
    "analyze_summary",
    "baselines",
    "combine",
    "decode_summary",
    "encode_summary",
    "frontier",
    "load_run",
    "load_window",
    "prefixes",
    "read_packet",
    "reduce_hta",
    "reduce_kineto",
    "reduce_nsys",
    "slack",
    "summarize",
    "write_packet",
]
