"""The contexts a StageTimer hands out: one reusable instance per stage, per step and per
microstep, so entering one allocates nothing.

They read and write the timer's fields (``record.timer_state``) directly; every rare case sits
behind one truth test and goes to a slow-path method there.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..analysis.schema import range_name
from .annotate import ProfilerRanges, step_range_name
from .noop import NOOP, NoopContext
from .timer_state import NOT_RECORDING, OUTSIDE, PAUSED, PAUSED_STEP, OpenSpan, TimerState

_now = time.perf_counter_ns


class StageContext(OpenSpan):
    """Context for one ordered stage; one instance per stage name, reused every step.

    ``__enter__`` and ``__exit__`` are slots holding the context's own bound ``_enter`` and
    ``_exit``, bound once here: the ``with`` statement looks both up on every use, and a slot
    hands back the bound method it holds where a method defined on the class would be bound
    anew, an allocation per lookup. A subclass overrides ``_enter`` and ``_exit``.
    """

    __slots__ = ("__enter__", "__exit__", "_column", "_reentered", "_reentry", "_start", "_timer")
    if TYPE_CHECKING:  # the slots' signatures

        def __enter__(self) -> None: ...
        def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

    def __init__(self, timer: TimerState, column: int, name: str) -> None:
        super().__init__(name)
        self.__enter__ = self._enter  # type: ignore[method-assign]
        self.__exit__ = self._exit  # type: ignore[method-assign]
        self._timer = timer
        self._column = column  # 1 + position in the schema: its column in a plain step's row
        self._start = 0
        self._reentry = OpenSpan(name)  # ``_active`` while this stage is re-entered (rejected)
        self._reentered = 0

    def _enter(self) -> None:
        t = self._timer
        if t._active is not None:  # outside a step, or another ordered stage is open
            self._reject(t._active)
            return
        t._active = self
        self._start = _now()

    def _exit(self, exc_type: object, exc: object, tb: object) -> None:
        end = _now()
        t = self._timer
        if t._active is not self:  # the exit of a rejected entry: nothing was recorded
            if t._active is self._reentry:
                self._reentered -= 1
                if not self._reentered:
                    t._active = self
            return
        t._active = None
        i = t._base + self._column
        if i > t._last:  # a column after the last one recorded: still zero in this row
            t._last = i
            t._buf[i] = end - self._start
        else:  # repeated or out of order: counted, and the span is added to the column
            t._order_violation(self._name)
            t._buf[i] += end - self._start

    def _reject(self, active: OpenSpan) -> None:
        """An entry outside a step or while an ordered stage is open: counted, not recorded
        (the enclosing span already covers its time)."""
        t = self._timer
        if active is OUTSIDE:
            t._violation(f"stage {self._name!r} entered outside step()")
            return
        if active is PAUSED or active is PAUSED_STEP:  # paused: nothing is recorded or checked
            return
        t._violation(f"stage {self._name!r} nested inside ordered stage {active._name!r}")
        if active is self or active is self._reentry:
            # The same stage again (a recursive hook): its exits come first and must not end
            # the outer span, so the outer one is parked until they are all done.
            self._reentered += 1
            t._active = self._reentry


class StageTable(dict[str, StageContext]):
    """Stage name -> its context. ``timer.stage`` is this table's ``__getitem__``: the lookup
    is then a C call with no Python frame, which is a measurable share of a stage's cost. An
    unknown name reaches ``__missing__``: a contract violation, answered with the no-op context.
    """

    __slots__ = ("_timer",)

    def __init__(self, timer: TimerState) -> None:
        super().__init__()
        self._timer = timer

    def __missing__(self, name: str) -> NoopContext:
        self._timer._unknown_stage(name)
        return NOOP


class StepContext:
    """Context for one step; one instance per timer, reused every step. ``__enter__`` and
    ``__exit__`` are slots holding its bound ``_enter`` and ``_exit`` (see StageContext)."""

    __slots__ = ("__enter__", "__exit__", "_nested", "_stages", "_start", "_timer")
    if TYPE_CHECKING:  # the slots' signatures

        def __enter__(self) -> None: ...
        def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

    def __init__(self, timer: TimerState, stages: StageTable) -> None:
        self._timer = timer
        self._stages = stages
        self._start = 0
        self._nested = 0
        self.__enter__ = self._enter  # type: ignore[method-assign]
        self.__exit__ = self._exit  # type: ignore[method-assign]

    def _enter(self) -> None:
        t = self._timer
        if t._active is not OUTSIDE:
            if t._active is PAUSED:
                t._begin_paused_step()
            elif t._active is not PAUSED_STEP:
                t._violation("step() entered inside another step")  # raises when strict
            self._nested += 1
            return
        if t._capture:  # the profiler router captures this step (rare)
            t._router.on_step(t._step_index)
        row = t._n * t._width
        t._active = None
        # The step's row is ``_base`` until a microstep moves it (``_accumulating`` is then
        # set); ``_last`` needs no reset: rows grow within a window.
        t._base = row
        self._start = _now()
        if t._capture:  # the router's step range opens once the live clock runs (rare)
            t._router.on_step_started()
        if t._step_hooks:  # a prefetched data wait to import, or CUDA events to poll
            self._start -= t._begin_hooks(row)

    def _exit(self, exc_type: object, exc: object, tb: object) -> None:
        end = _now()
        if self._nested:  # a nested step's exit, or a paused step's
            self._nested -= 1
            if not self._nested and self._timer._active is PAUSED_STEP:
                self._timer._end_paused_step()
            return
        t = self._timer
        if t._active is not None:
            self._close_left_open()
        if t._accumulating:
            row = t._n * t._width
            t._buf[row] = end - self._start
            t._active = OUTSIDE
            t._end_accumulation_step(row)
        else:
            t._buf[t._base] = end - self._start
            t._active = OUTSIDE
        if t._capture:  # the router's step range closes once the live clock stopped (rare)
            t._router.on_step_end()
        n = t._n + 1
        t._n = n
        if n == t._window_end:
            t._hand_off(n)

    def _close_left_open(self) -> None:
        """The step ends while an ordered stage is open (its exit never ran)."""
        t = self._timer
        active = t._active
        t._active = None
        for stage in self._stages.values():
            stage._reentered = 0
        if active is PAUSED:  # a pause() from another thread passed its between-steps test
            t._pause_landed_inside_step()
        elif active is not None:
            t._violation(f"stage {active._name!r} still open at the end of the step")


class AnnotatedStageContext(StageContext):
    """An ordered stage that is also a profiler (and NVTX) range named for it
    (``schema.range_name``: the stage's name, encoded where a trace could not carry it)."""

    __slots__ = ("_range", "_ranges", "_scope")

    def __init__(self, timer: TimerState, column: int, name: str, ranges: ProfilerRanges) -> None:
        super().__init__(timer, column, name)
        self._range = range_name(name)
        self._ranges = ranges
        self._scope: Any = None

    # The range opens after the stage's clock starts and closes after it stops: the profiler
    # stamps a range's end as it enters its C call, which gives the GIL away, and the wait to
    # take it back (long on a busy machine) then falls outside both records, not in the live
    # one alone. Only the Python work before the profiler stamps the start stays in one.
    def _enter(self) -> None:
        StageContext._enter(self)
        self._scope = self._ranges.open(self._range)

    def _exit(self, exc_type: object, exc: object, tb: object) -> None:
        StageContext._exit(self, exc_type, exc, tb)
        self._ranges.close(self._scope)


class AnnotatedStepContext(StepContext):
    """A step that is also a ``stagefrontier.step#<n>`` profiler (and NVTX) range."""

    __slots__ = ("_ranges", "_scope")

    def __init__(self, timer: TimerState, stages: StageTable, ranges: ProfilerRanges) -> None:
        super().__init__(timer, stages)
        self._ranges = ranges
        self._scope: Any = None

    def _enter(self) -> None:
        self._scope = self._ranges.open(step_range_name(self._timer._step_index))
        StepContext._enter(self)

    def _exit(self, exc_type: object, exc: object, tb: object) -> None:
        StepContext._exit(self, exc_type, exc, tb)
        self._ranges.close(self._scope)


class MicrostepContext:
    """Context for gradient-accumulation microstep ``index`` inside a step."""

    __slots__ = ("_index", "_timer")

    def __init__(self, timer: TimerState, index: int) -> None:
        self._timer = timer
        self._index = index

    def __enter__(self) -> None:
        t = self._timer
        index = self._index
        if t._active in NOT_RECORDING:
            if t._active is OUTSIDE:
                t._violation(f"microstep({index}) entered outside step()")
            return
        if index != t._last_micro + 1 or (t._last_micro >= 0 and t._last != t._micro_exit_last):
            t._step_mixed = True  # skipped or repeated index, or a stage between microsteps
        t._last_micro = index
        t._micro_open = True
        t._accumulating = True
        if index >= t._capacity:
            t._grow(index + 1)
        if index + 1 > t._step_factor:
            t._step_factor = index + 1
        t._base = t._n * t._width + index * t._n_timed

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._timer._micro_exit_last = self._timer._last
        self._timer._micro_open = False
