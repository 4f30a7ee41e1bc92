"""What a running timer lets other parts of the library drive: its instrumentation.

A timer hands its instrumentation (``StageTimer.instrumentation``) to what records alongside it:
the profiler router's capture (``route.capture``), the timing of collectives
(``record.collectives``, which reads the open step with ``open_step``) and the zero-code hooks
next. Through it they read where the timer stands (its rank, its step, its collector, its
DataLoader's workers, what their work cost so far), ask to be told of each step's
start and end (``tell_steps``), have the timer record its stages, steps and data waits as
profiler ranges while they need them (``record_ranges`` and ``stop_ranges``), and charge their
own time on the training thread to the timer's self-cost (``charge``). Nothing outside
``record/`` touches the timer's private fields: the layering test scans for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .annotate import ProfilerRanges, WaitRanges
from .contexts import AnnotatedStageContext
from .timer_state import NOT_RECORDING

if TYPE_CHECKING:
    from .loader_workers import WorkerCounters
    from .timer_state import TimerState


class Instrumentation:
    """One timer's instrumentation (see the module doc). The ranges and the step calls are
    driven from the training thread; ``tell_steps`` may be called from any thread (one flag)."""

    def __init__(self, timer: TimerState) -> None:
        self._timer = timer
        self._saved: dict[str, Any] | None = None  # the plain stage contexts while ranges record
        self.records_ranges = False
        """Whether a capture records profiler ranges now (``record_ranges`` to ``stop_ranges``):
        a data wait must then go through ``timer.fetch``, which records it as a range. A plain
        attribute: the automatic hooks read it at every DataLoader fetch."""

    # ------------------------------------------------------------------ reading
    @property
    def rank(self) -> int:
        return int(self._timer.rank)

    @property
    def charge_fetch(self) -> Callable[[int], None]:
        """What ``timer.fetch`` does with a wait it timed, for a caller that timed it itself
        (the automatic hooks time a DataLoader fetch inline, and keep this function from the
        moment their timer is built): charge it, in nanoseconds."""
        charge: Callable[[int], None] = self._timer._charge_fetch  # type: ignore[attr-defined]
        return charge

    @property
    def world_size(self) -> int:
        return int(self._timer.world_size)

    @property
    def out_dir(self) -> str:
        return str(self._timer.out_dir)  # type: ignore[attr-defined]

    @property
    def step(self) -> int:
        """Global index of the open step (of the next one between steps), paused ones counted."""
        return int(self._timer._step_index)

    @property
    def collector(self) -> Any:
        """The timer's collector; None until it exists (a timer built before the process group
        builds it at its first window boundary)."""
        return self._timer._collector

    @property
    def closed(self) -> bool:
        return bool(getattr(self._timer, "_closed", False))

    @property
    def loader_workers(self) -> WorkerCounters | None:
        """The counters of the DataLoader workers ``timer.iter`` watches (None when it watches
        none)."""
        return self._timer._loader_workers

    def open_step(self) -> tuple[int, int, str | None] | None:
        """The recorded step open now, from any thread: its global index, its start on
        ``time.perf_counter_ns`` and the ordered stage open in it (None when none is); None
        between steps and while paused."""
        timer = self._timer
        active = timer._active
        if active in NOT_RECORDING:
            return None
        start = int(timer._step_ctx._start)  # type: ignore[attr-defined]
        return timer._step_index, start, None if active is None else active._name

    @property
    def capture_ns(self) -> int:
        """What captures have cost the training thread so far (the self-cost's ``capture``)."""
        return int(self._timer._cost.capture_ns)

    # ------------------------------------------------------------------ steps and cost
    def tell_steps(self, on: bool) -> None:
        """While on, the timer's router is called at each step's start (``on_step``, before the
        step's live clock starts, and ``on_step_started``, once it runs), at its end
        (``on_step_end``, once the clock stopped) and at a pause (``on_pause``)."""
        self._timer._capture = on

    def charge(self, ns: int) -> None:
        """Add ``ns`` of the training thread's time to the timer's self-cost (``capture``)."""
        self._timer._cost.capture_ns += ns

    # ------------------------------------------------------------------ ranges
    def record_ranges(self) -> None:
        """From now on every stage, the step's end and each data wait between steps is a
        profiler range (the stages unless the timer annotates already)."""
        timer = self._timer
        ranges = ProfilerRanges()
        waits = WaitRanges(timer, ranges)
        timer._wait_ranges = waits
        self.records_ranges = True
        timer._next_item = waits.next_item
        timer.fetch = waits.fetch  # type: ignore[attr-defined]
        table = timer._stage_ctx  # type: ignore[attr-defined]
        if any(isinstance(ctx, AnnotatedStageContext) for ctx in table.values()):
            return
        self._saved = dict(table)
        for name, ctx in self._saved.items():
            table[name] = AnnotatedStageContext(timer, ctx._column, name, ranges)

    def stop_ranges(self) -> None:
        """Back to the timer's own contexts (a wait range still open is closed)."""
        timer = self._timer
        waits, timer._wait_ranges = timer._wait_ranges, None
        self.records_ranges = False
        if waits is not None:
            waits.close_gap()
        timer._next_item = next
        vars(timer).pop("fetch", None)
        saved, self._saved = self._saved, None
        if saved is not None:
            timer._stage_ctx.update(saved)  # type: ignore[attr-defined]

    def open_wait_gap(self) -> None:
        """A framework callback's data wait starts now: a range while ranges record."""
        waits = self._timer._wait_ranges
        if waits is not None:
            waits.open_gap()

    def close_wait_gap(self) -> None:
        """The data wait ``open_wait_gap`` began ends now."""
        waits = self._timer._wait_ranges
        if waits is not None:
            waits.close_gap()
