"""Profiler ranges for ``StageTimer(annotate=True)``: every step and ordered stage also becomes a
``torch.profiler.record_function`` range, and an NVTX range when CUDA is available, named like
the stage. A trace captured while the timer runs then carries the stage boundaries, and
``stagefrontier analyze --format kineto|nsys`` reduces it on the same terms as the timer."""

from __future__ import annotations

from typing import Any

from ..analysis.schema import STEP_ANNOTATION


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
