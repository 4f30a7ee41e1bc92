"""Single-process collection: the rank's own windows are analyzed on a background thread."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..analysis.gates import Gates
from ..record.window import PendingWindow, analyze_merged, merge_windows
from ..sinks.core import Sink, default_sinks, emit
from .base import BackgroundWorker


class LocalCollector:
    """R = 1: every window is analyzed by itself and written by this process."""

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
    ) -> None:
        self.sinks = list(sinks) if sinks is not None else default_sinks(out_dir)
        self.gates = gates
        self._worker = BackgroundWorker(
            "stagefrontier-analysis", self._process, queue_size, join_timeout_s
        )

    def submit(self, window: PendingWindow) -> bool:
        return self._worker.offer(window)

    def _process(self, window: PendingWindow) -> None:
        merged = merge_windows([window.build()], world_size=1)
        emit(self.sinks, analyze_merged(merged, self.gates))

    def close(self) -> None:
        self._worker.close()
        if self._worker.alive:  # analysis overran its bound: do not close sinks under it
            return
        for sink in self.sinks:
            sink.close()
