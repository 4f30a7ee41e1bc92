"""Baselines that follow a long run: one per phase, started again where the run changed on purpose.

The live regression check (``analysis.regression``) compares a window with the run's recent
healthy windows. A long run changes on purpose (evaluation, checkpoints, a schedule), and a
window of another kind of step is not slower than its baseline, only different. This module
keeps which windows a window is compared with:

- a phase the user names (``StageTimer.set_phase("evaluation")``): each phase keeps its own
  baseline, the others' kept for their return (at most ``MAX_PHASES``, the oldest forgotten);
  a window of a phase not seen before starts one, so it is never a regression. A window the
  phase changed inside is compared with nothing and joins no baseline.
- steps the user paused (``StageTimer.pause()``, around a checkpoint say): the window that holds
  them starts its phase's baseline again, so the steps after a pause are compared with steps
  after it.
- a detected change of the step's make-up: a stage that held at least ``MIX_SHARE`` of the
  baseline's step now takes at most ``GONE_SHARE`` of it (``mix_lost``: an evaluation step runs
  no backward pass and no optimizer). The baseline so far is put aside and the window starts a
  new one. A window that gains such a stage back (``mix_lost`` the other way round) returns to
  the baseline put aside whose make-up it matches; with none, it is checked as any window is
  (a stall in a stage that was empty, a data wait, is a regression). A slowdown never empties
  a stage, so a real regression still counts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import numpy as np

from .accounting import FloatArray

T = TypeVar("T")

MIX_SHARE = 0.10
GONE_SHARE = 0.01
MAX_PHASES = 16
CHANGED_INSIDE = "the phase changed inside the window"

Marks = tuple[str | None, bool, bool] | None
"""A window's phase, whether the phase changed inside it, and whether it holds paused steps
(None: no phase named, none paused)."""


class PhaseBaselines(Generic[T]):
    """The baseline windows (``healthy``) and the windows in a row above it (``above``) of the
    current phase, and those of the other phases the run has had."""

    def __init__(self, size: int) -> None:
        self._size = size
        self.phase: str | None = None
        self.healthy: deque[T] = deque(maxlen=size)
        self.above: list[T] = []
        self._others: dict[str | None, tuple[deque[T], list[T]]] = {}
        self._aside: list[tuple[deque[T], list[T]]] = []
        """The baselines of earlier make-ups of the step (detected phases), oldest first."""

    def enter(self, marks: Marks, window: T, mix: Callable[[T], FloatArray]) -> str | None:
        """Make the current baseline the one ``window`` is compared with, given its
        ``marks``; ``mix`` gives a window's mean advance per stage. Returns why the window
        starts a new baseline or returns to one put aside, ``CHANGED_INSIDE`` for a window
        that is to be compared with nothing (it joins none), or None."""
        phase, changed, paused = marks or (None, False, False)
        if changed:
            return CHANGED_INSIDE
        reason = self.follow(phase, paused)
        if not self.healthy:
            return reason
        now, before = mix(window), _mean_mix(self.healthy, mix)
        if mix_lost(before, now):
            self._put_aside((deque(self.healthy, maxlen=self._size), list(self.above)))
            self.restart()
            return "a stage of the step stopped (a new phase)"
        if mix_lost(now, before):
            for k, (healthy, above) in enumerate(self._aside):
                other = _mean_mix(healthy, mix)
                if not mix_lost(other, now) and not mix_lost(now, other):
                    current = (self.healthy, self.above)
                    self.healthy, self.above = healthy, above
                    self._aside[k] = current
                    return "back to an earlier make-up of the step"
        return reason

    def _put_aside(self, baseline: tuple[deque[T], list[T]]) -> None:
        self._aside.append(baseline)
        del self._aside[:-MAX_PHASES]

    def follow(self, phase: str | None, paused: bool) -> str | None:
        """Switch to ``phase``'s baseline (a new one for a phase not seen before) and start it
        again when the window holds ``paused`` steps. Returns why the window starts a new
        baseline (``"new phase"``, ``"paused steps"``), or None."""
        reason = None
        if phase != self.phase:
            self._others[self.phase] = (self.healthy, self.above)
            kept = self._others.pop(phase, None)
            if kept is None:
                kept, reason = (deque(maxlen=self._size), []), "new phase"
            self.healthy, self.above = kept
            self.phase = phase
            while len(self._others) >= MAX_PHASES:
                del self._others[next(iter(self._others))]
        if paused:
            self.restart()
            reason = "paused steps"
        return reason

    def restart(self) -> None:
        """Forget the current phase's baseline: the next windows make a new one."""
        self.healthy.clear()
        self.above.clear()

    def forget(self) -> None:
        """Forget every phase's baseline (the stages or the ranks changed)."""
        self._others.clear()
        self._aside.clear()
        self.restart()


def mix_lost(before: FloatArray, now: FloatArray) -> bool:
    """Whether a stage stopped: ``before`` and ``now`` are mean frontier advances per stage
    (``[S]`` seconds); True when a stage held at least ``MIX_SHARE`` of ``before``'s step and
    takes at most ``GONE_SHARE`` of that step in ``now``."""
    step = float(before.sum())
    if step <= 0:
        return False
    return bool(np.any((before >= MIX_SHARE * step) & (now <= GONE_SHARE * step)))


def _mean_mix(windows: Iterable[T], mix: Callable[[T], FloatArray]) -> FloatArray:
    return np.asarray(np.mean([mix(w) for w in windows], axis=0), dtype=np.float64)
