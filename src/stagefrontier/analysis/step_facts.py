"""What the late-rank rule (``analysis.collectives``) reads of one collective over a window's
steps: the ``StepFacts`` of every rank's waits, exactly, or of node summaries
(``analysis.collective_summary``), within a bound."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class StepFacts:
    """What the late-rank rule reads of one collective: over the window's steps in which every
    rank timed it (``[T]`` each), the shortest wait (the transfer), the ranks' mean and longest
    wait, the rank that waited least (the last to arrive) and the ranks' mean arrival; and of
    the rank with the shortest typical wait (its median over the steps it timed), how far
    behind the other ranks' median it arrived in each step (``behind``; its lateness is their
    median), the ``gap`` from its typical wait to the next shortest, and the window's ``noise``
    (the median over steps of the other ranks' waits' median absolute deviation). Read exactly
    from every rank's waits (``of_waits``), or from node summaries
    (``analysis.collective_summary``), ``behind`` and ``noise`` within ``bound_ms``."""

    shortest: npt.NDArray[np.float64]
    mean: npt.NDArray[np.float64]
    longest: npt.NDArray[np.float64]
    last: npt.NDArray[np.int64]
    reached: npt.NDArray[np.float64]
    late: int
    gap: float
    noise: float
    behind: npt.NDArray[np.float64]
    bound_ms: float = 0.0
    cpu_wait_ms: float | None = None
    """How much longer per step the candidate waited for a CPU than the other ranks' median
    (``record.run_queue``: step by step before the collective where every rank read it, else
    over the window); None where a rank's wait is unknown."""

    @classmethod
    def of_waits(
        cls,
        wait: npt.NDArray[np.float64],
        ranks: npt.NDArray[np.int64],
        reached: npt.NDArray[np.float64],
        run_queue_ms: Sequence[float | None] = (),
        queued: npt.NDArray[np.float64] | None = None,
    ) -> StepFacts:
        """From every rank's wait ``[T, R]`` (ranks ``ranks``; NaN where a rank did not time it),
        arrival offsets ``[T, R]``, run-queue waits per step (one a rank, or none) and, where
        read, each rank's run-queue wait before the collective ``queued`` ``[T, R]``."""
        typical = typical_waits(wait)
        late = int(np.argmin(typical))
        cpu_wait = _extra_cpu_wait(late, len(ranks), run_queue_ms, queued)
        every = np.isfinite(wait).all(axis=1)
        full = wait[every]
        others = np.delete(full, late, axis=1)
        middle = np.median(others, axis=1)
        return cls(
            shortest=full.min(axis=1),
            mean=full.mean(axis=1),
            longest=full.max(axis=1),
            last=ranks[full.argmin(axis=1)],
            reached=reached[every].mean(axis=1),
            late=int(ranks[late]),
            gap=float(np.min(np.delete(typical, late)) - typical[late]),
            noise=float(np.median(np.median(np.abs(others - middle[:, None]), axis=1))),
            behind=middle - full[:, late],
            cpu_wait_ms=cpu_wait,
        )

    @classmethod
    def of_own_waits(
        cls,
        wait: npt.NDArray[np.float64],
        queued: npt.NDArray[np.float64],
        ranks: npt.NDArray[np.int64],
        reached: npt.NDArray[np.float64],
    ) -> StepFacts | None:
        """The facts of the ranks' waits with each one's run-queue wait before the collective
        added back, over the steps in which every rank read both: the wait each rank would
        have had had the scheduler given every rank a CPU when it asked (None without such a
        step)."""
        own = wait + queued
        if not np.isfinite(own).all(axis=1).any():
            return None
        return cls.of_waits(own, ranks, reached)


def typical_waits(wait: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each rank's median wait over the steps it timed (``[T, R, ...]``, NaN where untimed):
    numpy's NaN-aware median costs about thirty plain ones, so it runs only where a wait is
    missing."""
    timed = np.isfinite(wait)
    if timed.all():
        return np.median(wait, axis=0)
    with warnings.catch_warnings():  # a rank that timed the collective in no step: NaN, kept
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(wait, axis=0)


def _extra_cpu_wait(
    late: int,
    n_ranks: int,
    run_queue_ms: Sequence[float | None],
    queued: npt.NDArray[np.float64] | None,
) -> float | None:
    """How much longer per step the rank ``late`` (an index) waited for a CPU than the others'
    median: step by step before the collective where every rank read it in some step, else
    over the window (``run_queue_ms``); None where unknown."""
    if queued is not None and np.isfinite(queued).all(axis=1).any():
        rows = queued[np.isfinite(queued).all(axis=1)]
        return float(np.median(rows[:, late] - np.median(np.delete(rows, late, axis=1), axis=1)))
    if len(run_queue_ms) == n_ranks and all(q is not None for q in run_queue_ms):
        said = np.array(run_queue_ms, dtype=np.float64)
        return float(said[late] - np.median(np.delete(said, late)))
    return None
