"""Is a difference worth acting on? Only when it is material (at least a stated floor, a share
of the step) and stands above the run's own step-to-step noise, judged over the steps rather
than on one mean.

Three tests share that rule. ``median_shift`` compares two samples of steps (a window against
its baseline): the shift of the medians against a robust standard error, each side's spread
estimated as 1.4826 x its median absolute deviation and the larger side's taken (by default), so
that a window noisier than its baseline needs a larger shift; ``window_wander`` adds what the
baseline's windows show of their medians moving together with the machine's load.
``mean_shift`` compares their means (Welch's standard error), for a part of the step whose
growth splits the window's mean increase exactly, judged on ``block_means`` so that a bursty
wait reads as steady.
``mean_excess`` judges one sample of per-step differences (a suspect rank's time minus its
reference's over a few captured steps): their mean against the floor and ``t`` standard errors
of that mean, which a burst of a few large differences can pass where a median of mostly zeros
could not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533
"""Standard error of a sample median, in units of sigma / sqrt(n), for normal noise."""
WANDER_SIGMAS = 3.0
"""Standard deviations of a window's wander (``window_wander``) a shift must clear: a window's
median moves past it about once in 700 windows when its level's moves are normal. Fewer than
the steps' ``noise_factor``: with the steps' standard error the bar would have left a
whole-job slowdown of 120 ms on a busy machine's 300 ms steps unflagged in most runs."""


@dataclass(frozen=True)
class Difference:
    """A difference in seconds and the two bars it must clear."""

    shift_s: float
    floor_s: float
    """The material bar: a stated share of the step."""
    noise_s: float
    """The noise bar: a multiple of the difference's standard error."""

    @property
    def threshold_s(self) -> float:
        return max(self.floor_s, self.noise_s)

    @property
    def stands_out(self) -> bool:
        return bool(self.shift_s > self.threshold_s)

    def shortfall(self) -> str:
        """Which bar it misses, in words (empty when it stands out)."""
        if self.stands_out:
            return ""
        if self.shift_s <= self.floor_s:
            return f"under the material floor of {self.floor_s * 1e3:.1f} ms"
        return f"inside the steps' noise (needs {self.noise_s * 1e3:.1f} ms)"


def _spread(x: npt.NDArray[np.float64]) -> float:
    return MAD_TO_SIGMA * float(np.median(np.abs(x - np.median(x))))


def median_shift(
    before: npt.NDArray[np.float64],
    now: npt.NDArray[np.float64],
    floor_s: float,
    noise_factor: float,
    noisy_now: bool = True,
    wander_s: float = 0.0,
) -> Difference:
    """How far the median of ``now`` lies above that of ``before``. ``noisy_now=False`` takes
    the spread of ``before`` alone (a window that a step change starts inside is bimodal, and
    its own spread would hide the change). ``wander_s``: how far a window's median moves with
    nothing changed beyond what its steps' spread explains (``window_wander``): the noise bar
    is ``noise_factor`` standard errors and ``WANDER_SIGMAS`` of the wander, added in
    quadrature."""
    spread = max(_spread(before), _spread(now) if noisy_now else 0.0)
    error = MEDIAN_SE * spread * float(np.sqrt(1.0 / now.size + 1.0 / before.size))
    shift = float(np.median(now)) - float(np.median(before))
    return Difference(
        shift, floor_s, float(np.hypot(noise_factor * error, WANDER_SIGMAS * wander_s))
    )


WANDER_MIN_WINDOWS = 3
"""The fewest baseline windows whose medians ``window_wander`` reads a wander from."""


def window_wander(windows: Sequence[npt.NDArray[np.float64]]) -> float:
    """The standard deviation of a new window's median about the median of ``windows`` (a
    baseline's windows of per-step times) that comes from the windows' levels moving, not
    from their steps' own spread: on a busy machine other jobs' load comes and goes over
    seconds, so a whole window of short steps runs faster or slower together, and its median
    wanders far more than its steps' spread over the square root of their count says. It is
    the variance of the windows' medians less the part their steps' spread accounts for (a
    random-effects estimate), scaled for a new window against the mean of ``len(windows)``;
    0 from fewer than ``WANDER_MIN_WINDOWS`` windows: the spread of two medians is too
    uncertain a yardstick (three standard deviations of two windows 10% apart would pass a
    one-rank stall of a quarter of the step as the machine's)."""
    k = len(windows)
    if k < WANDER_MIN_WINDOWS:
        return 0.0
    medians = np.array([float(np.median(w)) for w in windows])
    sampling = np.mean([(MEDIAN_SE * _spread(w)) ** 2 / w.size for w in windows])
    levels = max(float(np.var(medians, ddof=1)) - float(sampling), 0.0)
    return float(np.sqrt(levels * (1.0 + 1.0 / k)))


def mean_shift(
    before: npt.NDArray[np.float64],
    now: npt.NDArray[np.float64],
    floor_s: float,
    noise_factor: float,
) -> Difference:
    """How far the mean of ``now`` lies above that of ``before``, against the standard error
    of the difference of the two means (each side's own variance: Welch's)."""
    if before.size < 2 or now.size < 2:
        return Difference(float(now.mean() - before.mean()), floor_s, float("inf"))
    variance = float(np.var(now, ddof=1)) / now.size + float(np.var(before, ddof=1)) / before.size
    return Difference(float(now.mean() - before.mean()), floor_s, noise_factor * variance**0.5)


def block_means(x: npt.NDArray[np.float64], size: int) -> npt.NDArray[np.float64]:
    """The means of consecutive blocks of ``size`` values (a last partial block left out), or
    ``x`` itself when fewer than two blocks fit: a wait that falls on one step in a few (a
    DataLoader's workers hand their batches over together) becomes a steady one."""
    blocks = x.size // size
    if blocks < 2:
        return x
    means: npt.NDArray[np.float64] = x[: blocks * size].reshape(blocks, size).mean(axis=1)
    return means


def mean_excess(diffs: npt.NDArray[np.float64], floor_s: float, t: float) -> Difference:
    """How far the mean of per-step differences lies above zero (one standard error from the
    sample's standard deviation; a single step has no noise estimate and never stands out)."""
    n = diffs.size
    if n < 2:
        return Difference(float(diffs.mean()) if n else 0.0, floor_s, float("inf"))
    error = float(np.std(diffs, ddof=1)) / float(np.sqrt(n))
    return Difference(float(diffs.mean()), floor_s, t * error)
