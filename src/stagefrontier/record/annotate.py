"""Profiler ranges for ``StageTimer(annotate=True)``: every step and ordered stage also becomes a
``torch.profiler.record_function`` range, and an NVTX range when CUDA is available, named like
the stage. A trace captured while the timer runs then carries the stage boundaries, and
``stagefrontier analyze --format kineto|nsys`` reduces it on the same terms as the timer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..analysis.schema import STEP_ANNOTATION
from ..analysis.wait_rule import consuming_step, wait_range_name

T = TypeVar("T")


class ProfilerRanges:
    """Opens and closes named ranges; torch is imported only when annotation is on.

    A ``record_function`` range costs tens of microseconds even with no profiler running, so
    one is opened only while a PyTorch profiler is active (one C call to check). NVTX ranges,
    which Nsight captures from outside the process, are emitted whenever CUDA is available.
    """

    def __init__(self) -> None:
        import torch

        self._record_function = torch.profiler.record_function
        self._profiling = torch._C._autograd._profiler_enabled
        self._nvtx = torch.cuda.nvtx if torch.cuda.is_available() else None

    def open(self, name: str) -> Any:
        if self._nvtx is not None:
            self._nvtx.range_push(name)
        if not self._profiling():
            return None
        scope = self._record_function(name)
        scope.__enter__()
        return scope

    def close(self, scope: Any) -> None:
        if scope is not None:
            scope.__exit__(None, None, None)
        if self._nvtx is not None:
            self._nvtx.range_pop()


def step_range_name(step: int) -> str:
    """``stagefrontier.step#<global step>``: the step id lines up across ranks' traces."""
    return f"{STEP_ANNOTATION}#{step}"


class WaitRanges:
    """The between-step data waits of a capturing timer as profiler ranges.

    While a rank captures, the router installs one of these: ``timer.iter`` fetches through
    ``next_item``, ``timer.fetch`` through ``fetch``, and a framework callback's hook clock
    opens a range at the end of a step (``open_gap``) that the next step's beginning closes
    (``close_gap``). Each range is named for the step that consumes the batch
    (``analysis.wait_rule``), the step the live record charges the wait to. Nothing of this
    runs outside a capture.
    """

    def __init__(self, timer: Any, ranges: ProfilerRanges) -> None:
        self._timer = timer
        self._ranges = ranges
        self._stage = str(timer.stages[0])
        self._gap: Any = None

    def _open(self) -> Any:
        from .timer_state import OUTSIDE, PAUSED

        t = self._timer
        inside = t._active is not OUTSIDE and t._active is not PAUSED
        step = consuming_step(t._step_index, inside, t._in_microstep())
        return self._ranges.open(wait_range_name(self._stage, step))

    def next_item(self, iterator: Iterator[T]) -> T:
        scope = self._open()
        try:
            return next(iterator)
        finally:
            self._ranges.close(scope)

    def fetch(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        scope = self._open()
        try:
            return type(self._timer).fetch(self._timer, fn, *args, **kwargs)  # type: ignore[no-any-return]
        finally:
            self._ranges.close(scope)

    def open_gap(self) -> None:
        self.close_gap()
        self._gap = self._open()

    def close_gap(self) -> None:
        scope, self._gap = self._gap, None
        if scope is not None:
            self._ranges.close(scope)
