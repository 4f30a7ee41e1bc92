"""What StageFrontier itself costs a rank, per window (rank 0 sums it: ``window.rank``).

Three parts, each measured where it is cheap to measure:

- hot path: the contexts a window entered (its steps plus the stage columns they recorded,
  counted off the training thread from the copied rows) times the cost of one context,
  calibrated once per process on the thread that first builds a window (a collector thread): a
  short loop over a private timer, timed in that thread's CPU time so that waiting for the GIL
  does not count;
- hand-off: the training thread's time in the window boundary, measured directly (the boundary
  that opened a window is reported with it: the one that closes it is still running when the
  window is copied);
- profiler capture: the training thread's time in the profiler router's capture (starting and
  stepping the profiler, the step ranges), measured directly, only while a capture runs;
- background threads: the CPU time (``CLOCK_THREAD_CPUTIME_ID`` of every live thread named
  ``stagefrontier-*`` in the process) since the previous window was built, in two parts: the
  collection threads (collector, sender), which run every window, and the profiler router's
  thread, which is nearly idle until it exports a capture or reduces traces for an incident
  (then it can take seconds, and the line says where they went). Where a thread's clock cannot
  be read, the building thread's own ``time.thread_time_ns`` stands in for it.

Rank 0 reports, per component, the maximum and the median over the merged ranks, and the
fraction of each rank's summed step wall time that the parts add up to.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

THREAD_PREFIX = "stagefrontier"
"""Every background thread the library starts is named ``stagefrontier-<job>``."""
ROUTER_THREAD = "stagefrontier-router"
"""The profiler router's thread, counted apart (``router_cpu_ns``)."""
CALIBRATION_STEPS = 200
"""Steps (one stage each: two contexts) per calibration loop; a loop takes ~0.2 ms."""
CALIBRATION_LOOPS = 5
"""Loops per calibration; the fastest one counts (the others met interruptions)."""

_calibrated: dict[bool, int] = {}

TimerType = Callable[[bool, int, Any], Any]
"""What builds the calibration timer, passed in by the recorder (``calibration_timer``): a
StageTimer of one stage ``calibration``, annotated or not, of the given window, handing its
windows to the given collector. This module sits below the recorder (the window and the
collectors use it), so it times the recorder's contexts without importing it."""


def context_cost_ns(annotated: bool, timer_type: TimerType) -> int:
    """The CPU nanoseconds one step or stage context of ``timer_type`` costs on this machine
    (enter and exit), measured once per process and kind (``annotate=True`` timers cost
    more)."""
    cost = _calibrated.get(annotated)
    if cost is None:
        cost = _calibrated[annotated] = _calibrate(annotated, timer_type)
    return cost


class _Discard:
    """The calibration timer's collector: it never receives a window (the loop stays inside
    one window), and closing it does nothing."""

    rank = 0
    world_size = 1

    def submit(self, window: object) -> bool:
        return True

    def close(self) -> None:
        return None


def _calibrate(annotated: bool, timer_type: TimerType) -> int:
    clock = time.thread_time_ns
    timer = timer_type(annotated, CALIBRATION_STEPS * CALIBRATION_LOOPS + 1, _Discard())
    step, stage = timer.step, timer.stage
    best = None
    for _ in range(CALIBRATION_LOOPS):
        start = clock()
        for _ in range(CALIBRATION_STEPS):
            with step(), stage("calibration"):
                pass
        spent = clock() - start
        best = spent if best is None else min(best, spent)
    timer.close()
    return max(1, round((best or 0) / (2 * CALIBRATION_STEPS)))


def contexts_entered(raw: npt.NDArray[np.int64]) -> int:
    """Step contexts plus the stage columns they recorded, from a window's raw rows (column 0
    the step wall time). A stage entered twice in one step (a contract violation) counts once."""
    return int(raw.shape[0] + np.count_nonzero(raw[:, 1:]))


class ThreadClock:
    """The summed CPU time of the library's background threads, read as deltas per window."""

    def __init__(self) -> None:
        self._last: dict[int, int] = {}

    def delta_ns(self) -> tuple[int, int]:
        """CPU nanoseconds the library's collection threads and its router thread spent since
        the previous call."""
        spent = [0, 0]
        seen: dict[int, int] = {}
        for thread in threading.enumerate():
            if not thread.name.startswith(THREAD_PREFIX) or thread.ident is None:
                continue
            now = _thread_cpu_ns(thread)
            if now is None:
                continue
            seen[thread.ident] = now
            spent[thread.name == ROUTER_THREAD] += max(0, now - self._last.get(thread.ident, 0))
        self._last = seen
        return spent[0], spent[1]


def _thread_cpu_ns(thread: threading.Thread) -> int | None:
    """The thread's CPU clock; the calling thread's own where other threads' are unreadable."""
    if thread is threading.current_thread():
        return time.thread_time_ns()
    try:
        clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[arg-type]
        return time.clock_gettime_ns(clock)
    except (AttributeError, OSError, ValueError):  # no such clock here, or the thread ended
        return None


class CostMeter:
    """One timer's self-cost bookkeeping. The training thread writes ``handoff_ns`` at each
    boundary; ``window_fields`` runs on the thread that builds the window."""

    def __init__(self, annotated: bool, timer_type: TimerType) -> None:
        self.annotated = annotated
        self._timer_type = timer_type
        self.handoff_ns = 0
        """The training thread's time in the last completed hand-off."""
        self.capture_ns = 0
        """The training thread's time in profiler captures so far (it only grows)."""
        self._capture_seen = 0
        self._threads = ThreadClock()

    def window_fields(self, raw: npt.NDArray[np.int64]) -> dict[str, int]:
        collection, router = self._threads.delta_ns()
        capture = self.capture_ns - self._capture_seen
        self._capture_seen += capture
        return {
            "contexts_entered": contexts_entered(raw),
            "context_cost_ns": context_cost_ns(self.annotated, self._timer_type),
            "thread_cpu_ns": collection,
            "router_cpu_ns": router,
            "capture_ns": capture,
        }
