"""The TensorBoard, Prometheus, W&B and CSV sinks, at the import path they first had.

They live in :mod:`stagefrontier.sinks` (one module per backend); this module re-exports them so
``from stagefrontier.integrations.sinks import CsvSink`` keeps working.
"""

from __future__ import annotations

from ..analysis.window_metrics import NO_LEADER, WindowMetrics
from ..sinks import (
    CSV_FIELDS,
    DEFAULT_PROMETHEUS_PORT,
    CsvSink,
    PrometheusSink,
    TensorBoardSink,
    WandbSink,
)
from ..window.merged import AnalyzedWindow


def window_metrics(window: AnalyzedWindow) -> WindowMetrics:
    """The window's metrics record (``window.metrics``), kept under its earlier name."""
    return window.metrics


__all__ = [
    "CSV_FIELDS",
    "DEFAULT_PROMETHEUS_PORT",
    "NO_LEADER",
    "CsvSink",
    "PrometheusSink",
    "TensorBoardSink",
    "WandbSink",
    "WindowMetrics",
    "window_metrics",
]
