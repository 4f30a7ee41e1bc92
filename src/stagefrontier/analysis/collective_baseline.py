"""The slow collective: rank 0's memory of each collective's usual transfer time, against which
a window's transfers are judged where no rank is late (``analysis.collectives`` reads them).
The transfer is the last rank's wait, so how far apart the ranks arrived does not enter it."""

from __future__ import annotations

from typing import Any

import numpy as np

from .collectives import CommunicationReading, Key, rounded_reading

BASELINE_WINDOWS = 3
"""Windows whose transfer times stand for a collective's usual speed: its first ones with no
late rank..."""
MIN_BASELINE = 2
"""...of which a window is judged against as few as this many."""
SLOW_FACTOR = 2.0
"""A collective is slow when, in three quarters of the window's steps (its transfer's lower
quartile), its transfer takes at least this many times its baseline (the median of the baseline
windows' transfers)..."""
SLOW_MIN_MS = 10.0
"""...and at least this many milliseconds more than the slowest quarter of the baseline's steps
(the highest of the baseline windows' upper quartiles), with no late rank named. On a loaded
host a collective's transfer wavers from step to step with the scheduler: a window whose steps
scatter as the baseline's did has its fast quarter below the baseline's slow quarter, however
its median fell, while a collective slowed in every step clears the baseline's own wavering.
The transfer is the last rank's wait, so how far apart the ranks arrived does not enter it."""
SLOW_STEP_FRACTION = 0.1
"""...and its transfer at least this part of the window's step longer than its baseline: a
collective a few milliseconds slower in a long step is not what the step is waiting on."""

Memory = list[tuple[int, float, float]]
"""A collective's baseline windows: (window, transfer, its upper quartile over steps)."""


class CollectiveBaseline:
    """Rank 0's memory of each collective's usual transfer time (its first
    ``BASELINE_WINDOWS`` windows with no late rank), against which a window's transfers are
    judged: the slow collective (``check``)."""

    def __init__(self) -> None:
        self._seen: dict[Key, Memory] = {}

    def check(
        self, window: int, reading: CommunicationReading | None, step_ms: float
    ) -> dict[str, Any] | None:
        """The window's slowest collective against its baseline, when it is slow and no rank
        is late (``step_ms``: the window's typical step); otherwise None (and a window with no
        late rank joins the baselines)."""
        if reading is None or reading.late is not None:
            return None
        slow: dict[str, Any] | None = None
        for c in reading.collectives:
            before = self._seen.setdefault((c.family, c.bucket, c.stage, c.call), [])
            if len(before) < MIN_BASELINE:
                before.append((window, c.transfer_ms, c.transfer_high_ms))
                continue
            usual = float(np.median([t for _, t, _ in before]))
            wavering = max(high for _, _, high in before)
            if (
                c.transfer_low_ms >= SLOW_FACTOR * usual
                and c.transfer_low_ms - wavering >= SLOW_MIN_MS
                and c.transfer_ms - usual >= SLOW_STEP_FRACTION * step_ms
                and (slow is None or c.transfer_ms - usual > slow["slower_ms"])
            ):
                slow = {
                    **rounded_reading(c),
                    "baseline_ms": round(usual, 3),
                    "baseline_windows": [before[0][0], before[-1][0]],
                    "slower_ms": round(c.transfer_ms - usual, 3),
                }
        if slow is None:
            for c in reading.collectives:
                before = self._seen[(c.family, c.bucket, c.stage, c.call)]
                if len(before) < BASELINE_WINDOWS and before[-1][0] != window:
                    before.append((window, c.transfer_ms, c.transfer_high_ms))
        return slow
