"""Single-process collection: the rank's own windows are analyzed on a background thread."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..analysis.gates import Gates
from ..analysis.regression import DEFAULT_REGRESSION, RegressionConfig
from ..sinks import Sink, close_sinks, collector_sinks, start_sinks
from ..window.rank import PendingWindow
from .base import BackgroundWorker, Consumers, analyze_received, merge_received, publish
from .live import LiveAnalysis


class LocalCollector:
    """R = 1: every window is analyzed by itself and written by this process.

    ``sinks`` replaces the default sinks (``windows.jsonl`` and the log line). The collector
    starts its sinks when built and closes them after its last window.
    """

    rank = 0
    world_size = 1

    def __init__(
        self,
        *,
        out_dir: str | os.PathLike[str],
        queue_size: int = 4,
        sinks: Sequence[Sink] | None = None,
        join_timeout_s: float = 10.0,
        gates: Gates | None = None,
        regression: RegressionConfig | None = DEFAULT_REGRESSION,
    ) -> None:
        self.sinks = collector_sinks(self.rank, out_dir, distributed=False, sinks=sinks)
        self.gates = gates
        self.live = LiveAnalysis(gates, regression)
        start_sinks(self.sinks)
        self.consumers = Consumers()
        self._worker = BackgroundWorker(
            "stagefrontier-analysis",
            self._process,
            queue_size,
            join_timeout_s,
            after_last=lambda: close_sinks(self.sinks),
        )

    def submit(self, window: PendingWindow) -> bool:
        return self._worker.offer(window)

    def _process(self, window: PendingWindow) -> None:
        merged = merge_received([window.build()], world_size=1)
        analyzed = analyze_received(merged, self.live.analyze)
        if analyzed is not None:
            publish(self.sinks, self.consumers, analyzed)

    def close(self) -> None:
        """Let queued windows finish (bounded), then close the sinks (on the analysis thread
        instead, once it is done, when the bound ran out)."""
        self._worker.close()
