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
"""A collective is slow when its transfer takes this many times its baseline..."""
SLOW_MIN_MS = 10.0
"""...and at least this many milliseconds more, with no late rank named. The transfer is the
last rank's wait, so how far apart the ranks arrived does not enter it."""


class CollectiveBaseline:
    """Rank 0's memory of each collective's usual transfer time (its first
    ``BASELINE_WINDOWS`` windows with no late rank), against which a window's transfers are
    judged: the slow collective (``check``)."""

    def __init__(self) -> None:
        self._seen: dict[Key, list[tuple[int, float]]] = {}

    def check(self, window: int, reading: CommunicationReading | None) -> dict[str, Any] | None:
        """The window's slowest collective against its baseline, when it is slow and no rank
        is late; otherwise None (and a window with no late rank joins the baselines)."""
        if reading is None or reading.late is not None:
            return None
        slow: dict[str, Any] | None = None
        for c in reading.collectives:
            before = self._seen.setdefault((c.family, c.bucket, c.stage, c.call), [])
            if len(before) < MIN_BASELINE:
                before.append((window, c.transfer_ms))
                continue
            usual = float(np.median([t for _, t in before]))
            if (
                c.transfer_ms >= SLOW_FACTOR * usual
                and c.transfer_ms - usual >= SLOW_MIN_MS
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
                    before.append((window, c.transfer_ms))
        return slow
