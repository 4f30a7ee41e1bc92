"""Live regression check on rank 0: is this window slower than the run's recent healthy windows,
and which stage's exposed time grew?

Rule (docs/regressions.md): the baseline is the last ``baseline_windows`` healthy windows.
Once it holds ``min_baseline`` windows, a new window regresses when the median of its per-step
exposed times exceeds the baseline's median by more than both ``min_increase`` of that median
and ``noise_factor`` standard errors of the difference of the two medians (each step's spread
estimated robustly as 1.4826 x the baseline's median absolute deviation; the standard error of
a median of n steps is about 1.2533 x spread / sqrt(n)). Medians make a few slow steps (a
checkpoint, a GC pause) harmless; the relative floor keeps a very steady run from alarming on
small shifts. An increase above the threshold is flagged at once when it is more than twice the
threshold, else only when the window before was above the threshold too: one slow window on a
busy machine is noise, two in a row or a large jump is news. Only windows at or below the
threshold join the baseline, so a window that a slowdown starts inside does not soften it for
the next ones; after ``baseline_windows`` windows in a row above it, those windows become the
baseline (a lasting change is reported for that long, then taken as the new normal). A
regression is split exactly into stage advance changes with ``analysis.compare``.

While the baseline fills (fewer than ``min_baseline`` windows), its first windows may be a
warm-up (compilation, cold caches: two to ten times slower). A new window that the baseline so
far would count as slower than itself, by the same rule with the two sides swapped, shows that
those windows were a warm-up: they leave the baseline, which starts again from the new window.
A window above the threshold of a baseline still filling is held out of it and flagged when
the window after it is above too (never on a first jump), so that a slowdown right after a
warm-up is caught.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StageFrontierError
from .accounting import FloatArray, frontier
from .compare import Side, compare

MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533
"""Standard error of a sample median, in units of sigma / sqrt(n), for normal noise."""
RANKS_NAMED = 3


@dataclass(frozen=True)
class RegressionConfig:
    """When a window counts as slower than the run's recent healthy windows."""

    baseline_windows: int = 5
    min_baseline: int = 2
    min_increase: float = 0.15
    noise_factor: float = 4.0

    def __post_init__(self) -> None:
        if self.baseline_windows < 1 or not 1 <= self.min_baseline <= self.baseline_windows:
            raise StageFrontierError(
                "RegressionConfig needs baseline_windows >= 1 and "
                "1 <= min_baseline <= baseline_windows"
            )
        if self.min_increase < 0 or self.noise_factor < 0:
            raise StageFrontierError("RegressionConfig thresholds must be >= 0")


DEFAULT_REGRESSION = RegressionConfig()
"""What collectors use unless told otherwise (``regression=None`` turns the check off)."""


@dataclass(frozen=True)
class _Healthy:
    window: int
    d: FloatArray
    exposed: FloatArray


class RegressionCheck:
    """Keeps the baseline and checks each window against it; one per run, on rank 0."""

    def __init__(self, config: RegressionConfig | None = None) -> None:
        self.config = config or RegressionConfig()
        self._healthy: deque[_Healthy] = deque(maxlen=self.config.baseline_windows)
        self._stages: tuple[str, ...] | None = None
        self._above: list[_Healthy] = []  # the windows in a row above the threshold, latest last

    def check(self, window: int, d: FloatArray, stages: Sequence[str]) -> dict[str, Any] | None:
        """The ``regression`` object for this window, or None; the window joins the baseline
        when it is not a regression. A change of schema or rank count restarts the baseline."""
        names = tuple(stages)
        if self._stages != names or (self._healthy and self._healthy[0].d.shape[1] != d.shape[1]):
            self._healthy.clear()
            self._stages = names
            self._above = []
        entry = _Healthy(window, d, exposed=frontier(d)[:, -1])
        found, above = self._regression(window, d, names, entry.exposed)
        if not above:
            self._healthy.append(entry)
            self._above = []
            return found
        self._above.append(entry)
        if len(self._above) == self.config.baseline_windows:
            # A level that held for a whole baseline's worth of windows is the run's new normal:
            # later windows are compared with it (this window still reports its regression).
            self._healthy.clear()
            self._healthy.extend(self._above)
            self._above = []
        return found

    def reference(self, stages: Sequence[str], n_ranks: int) -> tuple[FloatArray, list[int]] | None:
        """Each rank's median stage durations over the healthy windows (``[R, S]`` seconds) and
        the windows (first, last) they come from, as a no-stall reference for the direct gains;
        None until the baseline holds ``min_baseline`` windows of this schema and rank count."""
        healthy = list(self._healthy)
        if (
            len(healthy) < self.config.min_baseline
            or self._stages != tuple(stages)
            or healthy[0].d.shape[1] != n_ranks
        ):
            return None
        d = np.concatenate([h.d for h in healthy])
        return np.median(d, axis=0), [healthy[0].window, healthy[-1].window]

    def _regression(
        self, window: int, d: FloatArray, stages: tuple[str, ...], exposed: FloatArray
    ) -> tuple[dict[str, Any] | None, bool]:
        """The regression (or None) and whether the window is above the threshold."""
        if not self._healthy:
            return None, False
        base = np.concatenate([h.exposed for h in self._healthy])
        filling = len(self._healthy) < self.config.min_baseline
        if filling:
            back, back_threshold = self._shift(exposed, base)
            if back > back_threshold:  # the baseline so far is slower: it was a warm-up
                self._healthy.clear()
                self._above = []
                return None, False
        increase, threshold = self._shift(base, exposed)
        if increase <= threshold:
            return None, False
        if not self._above and (filling or increase <= 2 * threshold):
            return None, True
        result = compare(
            Side.from_windows("baseline", [h.d for h in self._healthy], stages),
            Side.from_windows(f"window {window}", [d], stages),
        )
        top = result.top_stage
        grew = result.stage_rank_deltas(top)
        stage_delta = result.delta_advance_ms[top]
        grown = [row["rank"] for row in grew if row["delta_ms"] >= 0.5 * stage_delta]
        found = {
            "baseline_windows": [self._healthy[0].window, self._healthy[-1].window],
            "median_increase_ms_per_step": increase * 1e3,
            "delta_exposed_ms_per_step": result.delta_exposed_ms,
            "delta_advance_ms_per_step": result.delta_advance_ms,
            "top_stage": top,
            # The ranks whose own time in the stage grew by at least half the stage's delta;
            # all of them means a slowdown of the whole job (a slower mount, a new augmentation).
            "ranks": grown or [row["rank"] for row in grew[:1]],
            "all_ranks": len(grown) == len(grew) > 1,
            "rank_delta_ms_per_step": {str(row["rank"]): row["delta_ms"] for row in grew},
        }
        return found, True

    def _shift(self, base: FloatArray, exposed: FloatArray) -> tuple[float, float]:
        """How much the median of ``exposed`` exceeds that of ``base``, and the threshold past
        which that is a slowdown (see the module doc)."""
        cfg = self.config
        base_median = float(np.median(base))
        spread = MAD_TO_SIGMA * float(np.median(np.abs(base - base_median)))
        error = MEDIAN_SE * spread * float(np.sqrt(1.0 / exposed.size + 1.0 / base.size))
        threshold = max(cfg.min_increase * base_median, cfg.noise_factor * error)
        return float(np.median(exposed)) - base_median, threshold


def regression_text(regression: dict[str, Any]) -> str:
    """A few words for the window line: ``+38 ms/step vs windows 4-8: data.next_wait +35 ms,
    all ranks``."""
    first, last = regression["baseline_windows"]
    top = regression["top_stage"]
    delta = regression["delta_advance_ms_per_step"][top]
    ranks = regression["ranks"]
    if regression["all_ranks"]:
        who = "all ranks"
    else:
        shown = ",".join(str(r) for r in ranks[:RANKS_NAMED])
        who = (
            ("rank " if len(ranks) == 1 else "ranks ") + shown + (",..." if len(ranks) > 3 else "")
        )
    span = f"window {first}" if first == last else f"windows {first}-{last}"
    return (
        f"{regression['delta_exposed_ms_per_step']:+.0f} ms/step vs {span}: "
        f"{top} {delta:+.0f} ms, {who}"
    )
