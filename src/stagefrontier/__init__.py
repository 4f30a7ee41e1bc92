"""StageFrontier: synchronization-aware stage accounting for distributed training.

The public names are imported when first used (``__getattr__``), each from its own module: a
training script that imports ``StageTimer`` loads the recorder and what it runs, not the trace
readers, the reports or the router (``lazy.lazy_exports``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

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
from .lazy import lazy_exports

if TYPE_CHECKING:
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
    from .formats.packet import Packet, read_packet, write_packet
    from .formats.run_folder import RunWindows, load_run
    from .formats.summary_codec import decode_summary, encode_summary
    from .load import LoadedWindow, load_window
    from .record.config import SamplingConfig, TimerConfig
    from .record.recorder import StageTimer
    from .reducers import ReducedTrace, TraceOptions, reduce_hta, reduce_kineto, reduce_nsys
    from .route import ProfilerRouter

_MODULES: dict[str, tuple[str, ...]] = {
    "analysis": ("baselines",),
    "analysis.accounting": ("advances", "frontier", "prefixes", "slack"),
    "analysis.analyzer": ("analyze", "analyze_summary"),
    "analysis.evidence": ("StageLocalization",),
    "analysis.gates": ("Gates",),
    "analysis.labels": ("ALL_LABELS",),
    "analysis.regression": ("RegressionConfig",),
    "analysis.schema": (
        "BACKWARD_STAGE",
        "CALLBACKS_STAGE",
        "DATA_STAGE",
        "DEFAULT_STAGES",
        "FORWARD_STAGE",
        "OPTIMIZER_STAGE",
        "RESIDUAL_STAGE",
        "STEP_ANNOTATION",
    ),
    "analysis.side": ("SideEvidence",),
    "analysis.summary": ("WindowSummary", "combine", "summarize"),
    "analysis.window_report": ("WindowReport",),
    "collect.config": ("CollectConfig",),
    "formats.packet": ("Packet", "read_packet", "write_packet"),
    "formats.run_folder": ("RunWindows", "load_run"),
    "formats.summary_codec": ("decode_summary", "encode_summary"),
    "load": ("LoadedWindow", "load_window"),
    "record.config": ("SamplingConfig", "TimerConfig"),
    "record.recorder": ("StageTimer",),
    "reducers": ("ReducedTrace", "TraceOptions", "reduce_hta", "reduce_kineto", "reduce_nsys"),
    "route": ("ProfilerRouter",),
}
"""Each module (relative to the package) and the public names it holds, imported when one of
them is first read."""
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


__getattr__, __dir__ = lazy_exports(__name__, _MODULES)
