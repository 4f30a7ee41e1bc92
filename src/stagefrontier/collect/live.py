"""What rank 0 remembers between windows: the run's recent healthy windows.

They serve twice. A new window is checked against them for a regression (``analysis.regression``:
how much slower, and which stage's exposed time grew), and their per-rank medians are the
no-stall reference for the direct gains. Clipping a stage to the rank's own median in a window
that stalls on every step removes nothing (the stall is the median); clipping it to the value
the rank had while healthy measures what the stall costs. The reference is used once the
baseline holds enough windows and only when the gates keep the default ``rank_median``
baseline, so a user's explicit ``Gates(gain_baseline=...)`` always wins and the paper's
window-local gains stay reproducible with ``RegressionConfig`` off (``regression=None``).

Only complete windows (every rank present and merged) are checked or join the baseline. A window
collected as node summaries is checked on its combined summary (``RegressionCheck.check_summary``);
its direct gains keep each rank's own median, since the ranks' columns stay on their nodes.

Every window carries ``host_signals``: rank 0's host signals over it (``host_signals``), which
``compare``'s gate reads to tell a slower machine from slower code. A regression carries
``host``: the window's signals and their median over the healthy windows before it, which name
the likely cause of a slowdown of the whole job.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np

from ..analysis.collective_baseline import CollectiveBaseline
from ..analysis.collectives import CommunicationReading
from ..analysis.gates import DEFAULT_GATES, Gates
from ..analysis.regression import STAGE, RegressionCheck, RegressionConfig
from ..analysis.schema import semantic_stage
from ..window.merged import AnalyzedWindow, MergedWindow, analyze_merged, marks
from . import host_signals


class LiveAnalysis:
    """Rank 0's analysis of each merged window, with the run's healthy baseline."""

    def __init__(self, gates: Gates | None, regression: RegressionConfig | None) -> None:
        self.gates = gates
        self._check = None if regression is None else RegressionCheck(regression)
        self._host = host_signals.snapshot()
        kept = regression.baseline_windows if regression is not None else 1
        self._healthy_hosts: deque[dict[str, Any]] = deque(maxlen=kept)
        self._collectives = CollectiveBaseline()

    def analyze(self, merged: MergedWindow) -> AnalyzedWindow:
        """The window analyzed, with its host signals, regression check and slow collective."""
        signals = self._host_signals()
        analyzed = self._analyze(merged, signals)
        return self._read_collectives(replace(analyzed, host_signals=signals))

    def _read_collectives(self, analyzed: AnalyzedWindow) -> AnalyzedWindow:
        """The window with its slow collective, and its regression naming the late rank."""
        reading = analyzed.communication
        window = analyzed.merged.reference.window
        slow = self._collectives.check(window, reading, analyzed.step_ms)
        late = _late_into(analyzed.regression, reading)
        return analyzed.changed(slow_collective=slow, regression=late)

    def _analyze(self, merged: MergedWindow, signals: dict[str, Any]) -> AnalyzedWindow:
        check = self._check
        complete = not merged.missing_ranks and not merged.mismatched_ranks
        if check is None or not complete:
            return analyze_merged(merged, self.gates)
        stages = merged.reference.stages
        reference = None
        if (self.gates or DEFAULT_GATES).gain_baseline == "rank_median":
            reference = check.reference(stages, len(merged.ranks))
        analyzed = analyze_merged(merged, self.gates, reference[0] if reference else None)
        ref = merged.reference
        found = check.check(ref.window, analyzed.d, stages, marks(ref))
        regression = self._with_host(found, signals)
        return replace(
            analyzed,
            regression=regression,
            gain_reference=reference[1] if reference else None,
        )

    def check_summary(self, analyzed: AnalyzedWindow) -> AnalyzedWindow:
        """A window analyzed from node summaries, with its host signals, regression check and
        slow collective."""
        analyzed = replace(analyzed, host_signals=self._host_signals())
        check, summary = self._check, analyzed.summary
        side = analyzed.side
        if check is None or summary is None or side.missing_ranks or side.mismatched_ranks:
            return self._read_collectives(analyzed)
        ref = analyzed.merged.reference
        regression = check.check_summary(ref.window, summary, marks(ref))
        regression = self._with_host(regression, analyzed.host_signals)
        return self._read_collectives(replace(analyzed, regression=regression))

    def _host_signals(self) -> dict[str, Any]:
        """Rank 0's host signals since the window before (since the collector started for the
        first)."""
        now = host_signals.snapshot()
        signals = host_signals.between(self._host, now)
        self._host = now
        return signals

    def _with_host(
        self, regression: dict[str, Any] | None, signals: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The regression with the host's signals over this window and the healthy ones; a
        healthy window's signals join the typical ones."""
        signals = signals or {}
        if regression is None:
            self._healthy_hosts.append(signals)
            return None
        before = {
            name: float(np.median([h[name] for h in self._healthy_hosts if name in h]))
            for name in {n for h in self._healthy_hosts for n in h}
        }
        return {**regression, "host": {"now": signals, "before": before}}


def _late_into(
    regression: dict[str, Any] | None, reading: CommunicationReading | None
) -> dict[str, Any] | None:
    """The regression with ``late``: the rank the timed collectives name late in its stage. A
    slowdown read as the whole job's (every rank's backward grew, as the others wait inside it)
    is then that stage's: the late rank holds the others back."""
    late = None if reading is None else reading.late
    if not regression or late is None or late.stage is None:
        return regression
    if semantic_stage(late.stage) != semantic_stage(regression["top_stage"]):
        return regression
    into = {"stage": late.stage, "bucket": late.bucket, "last_bucket": late.last_bucket}
    into["family"] = late.family
    return {**regression, "kind": STAGE, "late": {"rank": late.late_rank, **into}}
