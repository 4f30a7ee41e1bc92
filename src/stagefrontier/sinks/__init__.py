"""Where analyzed windows go on rank 0.

- :mod:`.base`: the ``Sink`` protocol and ``start_sinks``/``emit``/``close_sinks``, which the
  collector that owns the sinks calls;
- :mod:`.defaults`: which sinks a collector owns (the default list is chosen there only);
- :mod:`.files`: ``windows.jsonl`` and evidence packets; :mod:`.log`: the log line;
- :mod:`.csv_file`: a CSV row per window (standard library only);
- :mod:`.tensorboard`, :mod:`.prometheus`, :mod:`.wandb`, :mod:`.otel` (OpenTelemetry, OTLP/HTTP):
  one module per optional backend, each
  importing its package when the sink is built and naming the extra to install when it is missing.

The metrics sinks (CSV and the three backends) read ``AnalyzedWindow.metrics``, computed once per
window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from ..analysis.window_metrics import NO_LEADER, WindowMetrics
    from .base import Sink, StartableSink, close_sinks, emit, start_sinks
    from .csv_file import CSV_FIELDS, CsvSink
    from .defaults import collector_sinks, default_sinks
    from .files import JsonlSink, PacketSink
    from .log import LogSink, summary_line
    from .otel import OtelSink
    from .prometheus import DEFAULT_PROMETHEUS_PORT, PrometheusSink
    from .tensorboard import TensorBoardSink
    from .wandb import WandbSink

_MODULES = {
    ".analysis.window_metrics": ("NO_LEADER", "WindowMetrics"),
    "base": ("Sink", "StartableSink", "close_sinks", "emit", "start_sinks"),
    "csv_file": ("CSV_FIELDS", "CsvSink"),
    "defaults": ("collector_sinks", "default_sinks"),
    "files": ("JsonlSink", "PacketSink"),
    "log": ("LogSink", "summary_line"),
    "otel": ("OtelSink",),
    "prometheus": ("DEFAULT_PROMETHEUS_PORT", "PrometheusSink"),
    "tensorboard": ("TensorBoardSink",),
    "wandb": ("WandbSink",),
}
"""Each module and the names it holds, imported when one of them is first read (a collector
imports the defaults; an optional backend's module only where its sink is asked for)."""

__all__ = [
    "CSV_FIELDS",
    "DEFAULT_PROMETHEUS_PORT",
    "NO_LEADER",
    "CsvSink",
    "JsonlSink",
    "LogSink",
    "OtelSink",
    "PacketSink",
    "PrometheusSink",
    "Sink",
    "StartableSink",
    "TensorBoardSink",
    "WandbSink",
    "WindowMetrics",
    "close_sinks",
    "collector_sinks",
    "default_sinks",
    "emit",
    "start_sinks",
    "summary_line",
]

__getattr__, __dir__ = lazy_exports(__name__, _MODULES)
