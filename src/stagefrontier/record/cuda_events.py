"""Sampled forward CUDA-event side channel.

On a deterministic fraction q of steps, two events bracket the forward region. Their readiness is
polled at later step boundaries with ``query()``, never ``synchronize()``; a pair that is not
ready within ``MAX_PENDING_STEPS`` steps, or by the end of its window, is recorded as missing.
A sample that falls on a window's last step moves to the next step (the next window's first)
unless that one is sampled too, so a pair gets at least one step of GPU progress before its
window is handed off.
With q = 0 nothing here touches torch. The event type is injectable so tests can drive it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.side import EVENT_MISSING, EVENT_NOT_SAMPLED, EVENT_READY
from .noop import NOOP

logger = logging.getLogger("stagefrontier")

MAX_PENDING_STEPS = 8


def is_sampled(step: int, fraction: float) -> bool:
    """Deterministic sampling: exactly ``floor(n * q)`` of the first ``n`` steps are sampled,
    evenly spread (with q = 0.05, steps 19, 39, 59, ...)."""
    return int((step + 1) * fraction) > int(step * fraction)


def _torch_event() -> Any:
    import torch  # imported only when sampling is on

    event: Any = torch.cuda.Event
    return event(enable_timing=True)


class _EventContext:
    """Brackets one sampled step's region; one instance, re-aimed at each sampled step."""

    __slots__ = ("_row", "_sampler", "_stage", "_start", "_step")

    def __init__(self, sampler: EventSampler) -> None:
        self._sampler = sampler
        self._start: Any = None
        self._row = 0
        self._step = 0
        self._stage: str | None = None

    def aim(self, row: int, step: int, open_stage: str | None) -> _EventContext:
        self._row, self._step, self._stage = row, step, open_stage
        return self

    def __enter__(self) -> None:
        self._start = self._sampler.record(self._stage)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._start is not None:
            self._sampler.finish(self._start, self._row, self._step)
            self._start = None


class EventSampler:
    """Per-rank event samples for the open window: ``[window]`` milliseconds and states.

    The timer passes what the sampler needs with each call (the open step's row in the window,
    its global index, the ordered stage open around the region) and gives ``on_pending``, called
    whenever a recorded pair waits to be polled at the next step's beginning. ``pending`` holds
    those pairs, as ``(row, step, start, end)``.
    """

    def __init__(
        self,
        fraction: float,
        factory: Callable[[], Any] | None,
        window: int,
        on_pending: Callable[[], None],
    ) -> None:
        self.fraction = fraction
        self.forward_stage: str | None = None
        self.pending: list[tuple[int, int, Any, Any]] = []
        self._factory = factory or _torch_event
        self._window = window
        self._on_pending = on_pending
        self._ms = np.full(window, np.nan)
        self._state = np.zeros(window, dtype=np.int8)
        self._broken = False
        self._deferred_to = -1
        self._context = _EventContext(self)

    def context(self, row: int, step: int, open_stage: str | None) -> Any:
        """The context bracketing the region of step ``step`` (row ``row`` of the window), or a
        no-op one when this step is not sampled. Call it inside a step only."""
        if self.fraction == 0.0 or self._broken:
            return NOOP
        if not is_sampled(step, self.fraction) and step != self._deferred_to:
            return NOOP
        last_row = row == self._window - 1 and self._window > 1
        if last_row and not is_sampled(step + 1, self.fraction):
            # A pair from a window's last step would get a single poll, at the hand-off right
            # after it, and often count as missing: sample the next window's first step. (When
            # that step is sampled anyway, as at q = 1, moving would lose a sample: keep it.)
            self._deferred_to = step + 1
            return NOOP
        return self._context.aim(row, step, open_stage)

    def record(self, open_stage: str | None) -> Any:
        try:
            start = self._factory()
            start.record()
        except Exception as exc:  # no CUDA, or a broken event type: sample nothing from now on
            self._broken = True
            logger.warning("stagefrontier: CUDA-event sampling disabled: %s", exc)
            return None
        if open_stage is not None:
            self.forward_stage = open_stage
        return start

    def finish(self, start: Any, row: int, step: int) -> None:
        try:
            end = self._factory()
            end.record()
        except Exception as exc:
            self._broken = True
            logger.warning("stagefrontier: CUDA-event sampling disabled: %s", exc)
            return
        self._state[row] = EVENT_MISSING  # until a poll finds it ready
        self.pending.append((row, step, start, end))
        self._on_pending()

    def poll(self, step_index: int) -> None:
        """Resolve pending pairs whose end event has completed; age out the others
        (``step_index``: the step about to begin)."""
        if not self.pending:
            return
        still = []
        for row, step, start, end in self.pending:
            try:
                if end.query():
                    self._ms[row] = float(start.elapsed_time(end))
                    self._state[row] = EVENT_READY
                    continue
            except Exception as exc:
                logger.warning("stagefrontier: CUDA-event query failed: %s", exc)
                continue  # stays missing
            if step_index - step < MAX_PENDING_STEPS:
                still.append((row, step, start, end))
        self.pending[:] = still

    def drain(
        self, n: int, step_index: int, carry_row: int | None = None
    ) -> tuple[npt.NDArray[np.float64] | None, npt.NDArray[np.int8] | None]:
        """The window's first ``n`` rows of samples (None when sampling is off); pairs still
        unresolved count as missing. ``carry_row``: a row that becomes row 0 of the next window
        (its sample and pending pair move with it)."""
        if self.fraction == 0.0:
            return None, None
        self.poll(step_index)
        ms, state = self._ms[:n].copy(), self._state[:n].copy()
        carried = [] if carry_row is None else [p for p in self.pending if p[0] == carry_row]
        kept_ms = np.nan if carry_row is None else float(self._ms[carry_row])
        kept_state = EVENT_NOT_SAMPLED if carry_row is None else int(self._state[carry_row])
        self._ms.fill(np.nan)
        self._state.fill(EVENT_NOT_SAMPLED)
        self._ms[0], self._state[0] = kept_ms, kept_state
        self.pending[:] = [(0, step, start, end) for _, step, start, end in carried]
        return ms, state
