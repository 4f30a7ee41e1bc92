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
    from .analysis import baselines as baselines
    from .analysis.accounting import advances as advances
    from .analysis.accounting import frontier as frontier
    from .analysis.accounting import prefixes as prefixes
    from .analysis.accounting import slack as slack
    from .analysis.analyzer import analyze as analyze
    from .analysis.analyzer import analyze_summary as analyze_summary
    from .analysis.evidence import StageLocalization as StageLocalization
    from .analysis.gates import Gates as Gates
    from .analysis.labels import ALL_LABELS as ALL_LABELS
    from .analysis.regression import RegressionConfig as RegressionConfig
    from .analysis.schema import BACKWARD_STAGE as BACKWARD_STAGE
    from .analysis.schema import CALLBACKS_STAGE as CALLBACKS_STAGE
    from .analysis.schema import DATA_STAGE as DATA_STAGE
    from .analysis.schema import DEFAULT_STAGES as DEFAULT_STAGES
    from .analysis.schema import FORWARD_STAGE as FORWARD_STAGE
    from .analysis.schema import OPTIMIZER_STAGE as OPTIMIZER_STAGE
    from .analysis.schema import RESIDUAL_STAGE as RESIDUAL_STAGE
    from .analysis.schema import STEP_ANNOTATION as STEP_ANNOTATION
    from .analysis.side import SideEvidence as SideEvidence
    from .analysis.summary import WindowSummary as WindowSummary
    from .analysis.summary import combine as combine
    from .analysis.summary import summarize as summarize
    from .analysis.window_report import WindowReport as WindowReport
    from .collect.config import CollectConfig as CollectConfig
    from .formats.packet import Packet as Packet
    from .formats.packet import read_packet as read_packet
    from .formats.packet import write_packet as write_packet
    from .formats.run_folder import RunWindows as RunWindows
    from .formats.run_folder import load_run as load_run
    from .formats.summary_codec import decode_summary as decode_summary
    from .formats.summary_codec import encode_summary as encode_summary
    from .load import LoadedWindow as LoadedWindow
    from .load import load_window as load_window
    from .record.config import SamplingConfig as SamplingConfig
    from .record.config import TimerConfig as TimerConfig
    from .record.recorder import StageTimer as StageTimer
    from .reducers import ReducedTrace as ReducedTrace
    from .reducers import TraceOptions as TraceOptions
    from .reducers import reduce_hta as reduce_hta
    from .reducers import reduce_kineto as reduce_kineto
    from .reducers import reduce_nsys as reduce_nsys
    from .route import ProfilerRouter as ProfilerRouter

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
    "AmbiguousStageOrderError",
    "CompareError",
    "ContractViolation",
    "DeadlineExceeded",
    "DemoError",
    "DemoSettingsError",
    "DurationsError",
    "EmptyWindowError",
    "FaultSpecError",
    "GatesError",
    "GlooProtocolError",
    "MisalignedStepsError",
    "MissingDependencyError",
    "MissingExtraError",
    "MissingRanksError",
    "MissingStagesError",
    "NotJsonError",
    "ReportFormatError",
    "RolesError",
    "SideEvidenceError",
    "SinkSettingError",
    "StageFrontierError",
    "StageNamesError",
    "SummaryError",
    "TimerSettingError",
    "TraceFormatError",
    "__version__",
]
__all__ += [name for names in _MODULES.values() for name in names]


__getattr__, __dir__ = lazy_exports(__name__, _MODULES)
