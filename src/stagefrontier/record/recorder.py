"""StageTimer: the per-rank recorder that runs inside the training loop.

Hot-path rules: integer nanoseconds from ``time.perf_counter_ns``, writes into a preallocated
``array('q')`` buffer, no I/O, no locks, no torch call (unless CUDA-event sampling is on), and
one non-blocking hand-off per window. Contract violations are counted and reported with the
window; they never raise into training unless ``strict=True``.

The common path is kept to a few attribute reads and writes per context: ``timer.stage`` is a
dict lookup with no Python frame, every buffer index is absolute (the open step's row offset is
folded into ``_base`` and ``_last``), rows are zeroed once per window rather than once per step,
and the rare cases (accumulation, prefetched data waits, pending CUDA events, violations) each
sit behind one truth test. ``benchmarks/hotpath.py`` measures it against a bare context manager.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import numpy as np

from ..analysis.schema import DATA_STAGE, DEFAULT_STAGES, RESIDUAL_STAGE, check_stage_names
from ..collect import Collector, make_collector
from ..errors import StageFrontierError
from ..sinks.core import Sink
from .annotate import ProfilerRanges, step_range_name
from .cuda_events import EventSampler
from .noop import NOOP as _NULL
from .noop import NoopContext as _NullContext
from .window import WindowSnapshot

logger = logging.getLogger("stagefrontier")
_now = time.perf_counter_ns
T = TypeVar("T")

MAX_REASONS = 8
"""Distinct violation messages kept per window (the count is always exact)."""


class ContractViolation(StageFrontierError):
    """Raised instead of counted when the timer is strict."""


class _Marker:
    """Stands in ``StageTimer._active`` for "no step is open" or "a stage is re-entered"."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name


_OUTSIDE = _Marker("<outside step>")
"""``_active`` between steps: a stage entered now is rejected by the same test as nesting."""


class _Stage:
    """Context for one ordered stage; one instance per stage name, reused every step."""

    __slots__ = ("_column", "_name", "_reentered", "_reentry", "_start", "_timer")

    def __init__(self, timer: StageTimer, column: int, name: str) -> None:
        self._timer = timer
        self._column = column  # 1 + position in the schema: its column in a plain step's row
        self._name = name
        self._start = 0
        self._reentry = _Marker(name)  # ``_active`` while this stage is re-entered (rejected)
        self._reentered = 0

    def __enter__(self) -> None:
        t = self._timer
        if t._active is not None:  # outside a step, or another ordered stage is open
            t._rejected_entry(self)
            return
        t._active = self
        self._start = _now()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
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


class _StageTable(dict[str, "_Stage"]):
    """Stage name -> its context. ``timer.stage`` is this table's ``__getitem__``: the lookup
    is then a C call with no Python frame, which is a measurable share of a stage's cost. An
    unknown name reaches ``__missing__``: a contract violation, answered with the no-op context.
    """

    __slots__ = ("_timer",)

    def __init__(self, timer: StageTimer) -> None:
        super().__init__()
        self._timer = timer

    def __missing__(self, name: str) -> _NullContext:
        return self._timer._unknown_stage(name)


class _Step:
    """Context for one step; one instance per timer, reused every step."""

    __slots__ = ("_nested", "_start", "_timer")

    def __init__(self, timer: StageTimer) -> None:
        self._timer = timer
        self._start = 0
        self._nested = 0

    def __enter__(self) -> None:
        t = self._timer
        if t._active is not _OUTSIDE:
            t._violation("step() entered inside another step")  # raises when strict
            self._nested += 1
            return
        row = t._n * t._width
        t._row = row
        t._active = None
        t._base = row  # (``_last`` needs no reset: rows grow within a window)
        self._start = _now()
        if t._step_hooks:  # a prefetched data wait to import, or CUDA events to poll
            self._start -= t._begin_hooks(row)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        end = _now()
        if self._nested:
            self._nested -= 1
            return
        t = self._timer
        if t._active is not None:
            t._stage_left_open()
        row = t._row
        t._buf[row] = end - self._start
        t._active = _OUTSIDE
        if t._accumulating:
            t._end_accumulation_step(row)
        n = t._n + 1
        t._n = n
        if n == t.window:
            t._hand_off(n)


class _AnnotatedStage(_Stage):
    """An ordered stage that is also a profiler (and NVTX) range of the same name."""

    __slots__ = ("_ranges", "_scope")

    def __init__(self, timer: StageTimer, column: int, name: str, ranges: ProfilerRanges) -> None:
        super().__init__(timer, column, name)
        self._ranges = ranges
        self._scope: Any = None

    def __enter__(self) -> None:
        self._scope = self._ranges.open(self._name)
        _Stage.__enter__(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        _Stage.__exit__(self, exc_type, exc, tb)
        self._ranges.close(self._scope)


class _AnnotatedStep(_Step):
    """A step that is also a ``stagefrontier.step#<n>`` profiler (and NVTX) range."""

    __slots__ = ("_ranges", "_scope")

    def __init__(self, timer: StageTimer, ranges: ProfilerRanges) -> None:
        super().__init__(timer)
        self._ranges = ranges
        self._scope: Any = None

    def __enter__(self) -> None:
        self._scope = self._ranges.open(step_range_name(self._timer._step_index))
        _Step.__enter__(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        _Step.__exit__(self, exc_type, exc, tb)
        self._ranges.close(self._scope)


class _Microstep:
    __slots__ = ("_index", "_timer")

    def __init__(self, timer: StageTimer, index: int) -> None:
        self._timer = timer
        self._index = index

    def __enter__(self) -> None:
        t = self._timer
        index = self._index
        if t._active is _OUTSIDE:
            t._violation(f"microstep({index}) entered outside step()")
            return
        if index != t._last_micro + 1 or (t._last_micro >= 0 and t._last != t._micro_exit_last):
            t._step_mixed = True  # skipped or repeated index, or a stage between microsteps
        t._last_micro = index
        t._accumulating = True
        if index >= t._capacity:
            t._grow(index + 1)
        if index + 1 > t._step_factor:
            t._step_factor = index + 1
        t._base = t._row + index * t._n_timed

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._timer._micro_exit_last = self._timer._last


class _Probe:
    """Side-channel span: may nest anywhere, never enters the prefix vector."""

    __slots__ = ("_start", "count", "max_ns", "total_ns")

    def __init__(self) -> None:
        self._start = 0
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    def __enter__(self) -> None:
        self._start = _now()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        elapsed = _now() - self._start
        self.count += 1
        self.total_ns += elapsed
        if elapsed > self.max_ns:
            self.max_ns = elapsed

    def drain(self) -> dict[str, float]:
        out = {
            "count": float(self.count),
            "total_s": self.total_ns * 1e-9,
            "max_s": self.max_ns * 1e-9,
        }
        self.count = self.total_ns = self.max_ns = 0
        return out


class StageTimer:
    """Times ordered training stages on every rank and hands each window to the analyzer.

    Args:
        stages: ordered stage names; None means the six defaults. The residual
            ``step.other_cpu_wall`` is always last and computed, never timed.
        window: steps per window.
        out_dir: where rank 0 writes ``windows.jsonl`` (and packets, with collection).
        collect: ``"auto"``, ``"local"`` (this process only), or a distributed path.
        collect_timeout_s: how long rank 0 waits for other ranks' windows.
        cuda_event_fraction: fraction q of steps whose forward region is bracketed by CUDA events.
        enabled: False gives a timer whose contexts do nothing.
        strict: raise ContractViolation instead of counting (for tests and development).
        event_factory: callable returning a CUDA-event-like object (``record``, ``query``,
            ``elapsed_time``); defaults to ``torch.cuda.Event(enable_timing=True)``.
        role: this rank's role (e.g. pipeline stage) for role-aware analysis.
        queue_size: completed windows that may wait for analysis before new ones are dropped.
        collector: a ready collector, replacing ``collect`` (for tests and custom transports).
        sinks: extra destinations for rank 0's analyzed windows (TensorBoard, Prometheus, W&B,
            CSV, see ``stagefrontier.integrations.sinks``), after ``windows.jsonl`` and the log.
        annotate: also emit every step and ordered stage as a ``torch.profiler.record_function``
            range (and an NVTX range when CUDA is available) named like the stage, so a trace
            taken while the timer runs carries the stage boundaries. Off by default: it costs a
            few microseconds per context.
    """

    def __init__(
        self,
        stages: Sequence[str] | None = None,
        *,
        window: int = 100,
        out_dir: str | os.PathLike[str] = "stagefrontier",
        collect: str = "auto",
        collect_timeout_s: float = 10.0,
        cuda_event_fraction: float = 0.0,
        enabled: bool = True,
        strict: bool = False,
        event_factory: Callable[[], Any] | None = None,
        role: str | None = None,
        queue_size: int = 4,
        collector: Collector | None = None,
        sinks: Sequence[Sink] = (),
        annotate: bool = False,
    ) -> None:
        names = check_stage_names(DEFAULT_STAGES if stages is None else stages)
        self.stages: tuple[str, ...] = tuple(s for s in names if s != RESIDUAL_STAGE)
        if not self.stages:
            raise StageFrontierError("at least one timed stage is needed besides the residual")
        if window < 1:
            raise StageFrontierError(f"window must be >= 1 step, got {window}")
        if not 0.0 <= cuda_event_fraction <= 1.0:
            raise StageFrontierError(
                f"cuda_event_fraction must be in [0, 1], got {cuda_event_fraction}"
            )
        self.window = window
        self.enabled = enabled
        self.strict = strict
        self.out_dir = os.fspath(out_dir)
        self._n_timed = len(self.stages)
        self._closed = False
        if not enabled:
            self._disable()
            return

        if sinks and collector is not None:
            raise StageFrontierError("give sinks to the collector you pass, not to StageTimer")
        self._collector = collector or make_collector(
            collect,
            out_dir=self.out_dir,
            timeout_s=collect_timeout_s,
            queue_size=queue_size,
            sinks=sinks,
        )
        self.rank = self._collector.rank
        self.world_size = self._collector.world_size
        if self.rank == 0:
            _start_sinks(sinks)
        self._hostname = socket.gethostname()
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self._pid = os.getpid()
        self._role = role
        self._stage_ctx = _StageTable(self)
        ranges = ProfilerRanges() if annotate else None
        self._stage_ctx.update(
            (
                name,
                _Stage(self, 1 + i, name)
                if ranges is None
                else _AnnotatedStage(self, 1 + i, name, ranges),
            )
            for i, name in enumerate(self.stages)
        )
        self.stage = self._stage_ctx.__getitem__  # type: ignore[method-assign,assignment]
        self._probes: dict[str, _Probe] = {}
        self._step_ctx = _Step(self) if ranges is None else _AnnotatedStep(self, ranges)
        self._micro_ctx: dict[int, _Microstep] = {}
        self._events = EventSampler(cuda_event_fraction, event_factory, window)
        if cuda_event_fraction == 0.0:
            self.cuda_event_sample = _null_event_sample  # type: ignore[method-assign]

        # Buffer layout per step: column 0 is the step wall time, then one column per timed
        # stage and accumulation microstep (column 1 + i * K + k), for up to ``_capacity``
        # microsteps. ``_factor`` is the accumulation factor of the open window. Rows are zero
        # when a window starts; each step writes only its own row.
        self._capacity = 1
        self._factor = 1
        self._alloc(self._capacity)
        self._first_step = 0  # global index of the open window's first step
        self._n = 0  # completed steps in the open window
        self._window_index = 0
        self._row = 0  # buffer offset of the open (or the last) step
        # The open ordered stage: None when none is, _OUTSIDE when no step is open.
        self._active: _Stage | _Marker | None = _OUTSIDE
        self._base = 0  # buffer index a stage's column is added to: row + microstep offset
        # Buffer index of the last stage column recorded: any column of the open step is
        # larger than every column of the steps before it in the window, so the schema-order
        # check needs ``_last`` reset only when a window starts.
        self._last = 0
        # Gradient accumulation state of the open step (reset at its end when it was used).
        # ``_accumulating``: this step entered a microstep, or the window's factor is not 1.
        self._accumulating = False
        self._last_micro = -1
        self._micro_exit_last = 0
        self._step_factor = 1
        self._step_mixed = False
        self._window_mixed = False
        self._violations = 0
        self._reasons: list[str] = []
        self._dropped = 0
        # Prefetch-aware data wait (timer.iter): each fetch is charged to the next step to
        # begin (its start is moved back by the wait); a fetch made inside a step is taken out
        # of that step's wall time (its start is moved forward).
        self._pending_data_ns = 0
        # Work for the next step's beginning: a data wait to import, or event pairs to poll.
        self._step_hooks = False

    # ------------------------------------------------------------------ public contexts
    def step(self) -> _Step | _NullContext:
        """Context around one logical optimizer step."""
        return self._step_ctx

    def stage(self, name: str) -> _Stage | _NullContext:
        """Context for one ordered stage. Stages must not nest and must follow schema order;
        an unknown name is a contract violation. (Each timer binds this to its stage table's
        lookup, so ``name`` must be a str, or at least hashable.)"""
        return self._stage_ctx[name]

    def probe(self, name: str) -> _Probe | _NullContext:
        """Side-channel span that may nest anywhere; reported per window, never in the frontier."""
        ctx = self._probes.get(name)
        if ctx is None:
            ctx = self._probes[name] = _Probe()
        return ctx

    def microstep(self, index: int) -> _Microstep | _NullContext:
        """Context for gradient-accumulation microstep ``index`` (0, 1, ... in order) inside a
        step: ordered stages in it are recorded as substages ``name[index]``. Stages timed
        outside microsteps belong to the microstep before them (the optimizer after the last)."""
        ctx = self._micro_ctx.get(index)
        if ctx is None:
            if not isinstance(index, int) or index < 0:
                self._violation(f"microstep index must be an int >= 0, got {index!r}")
                return _NULL
            ctx = self._micro_ctx[index] = _Microstep(self, index)
        return ctx

    def cuda_event_sample(self, name: str = "model.fwd_loss_cuda_event_ms") -> Any:
        """Bracket a region (the forward) with two CUDA events on a deterministic fraction of
        steps. Readiness is polled at later step boundaries, never synchronized; the value is
        side evidence and never enters the prefix vector."""
        return self._events.context(self)

    def iter(self, iterable: Iterable[T], stage: str = DATA_STAGE) -> Iterator[T]:
        """Wrap a data iterator so that each ``next()`` wait is charged to the step that consumes
        the batch: the next step to begin after the fetch. This covers ``for batch in
        timer.iter(loader): with timer.step(): ...`` and loops that prefetch batch t+1 at the
        end of step t (a fetch made inside a step is also taken out of that step's wall time).
        So fetch before the step that uses the batch, or at the end of the step before it:
        a fetch inside a step always counts for the next one. ``stage`` must be the first
        ordered stage; do not also time it."""
        if not self.enabled:
            yield from iterable
            return
        if self.stages[0] != stage:
            self._violation(f"timer.iter stage {stage!r} must be the first ordered stage")
        iterator = iter(iterable)
        while True:
            start = _now()
            try:
                item = next(iterator)
            except StopIteration:
                return
            elapsed = _now() - start
            self._pending_data_ns += elapsed
            self._step_hooks = True
            if self._active is not _OUTSIDE:
                self._step_ctx._start += elapsed
            yield item

    def charge_data_wait(self, wait_ns: int) -> None:
        """Charge a data wait measured outside the timer (by a framework hook, say) to the next
        step to begin, as ``timer.iter`` does for its fetches: it becomes that step's first
        ordered stage and the step's wall time is extended over it. Only the charge is made
        here; the wait must not also be inside a timed step (``timer.iter`` takes a fetch made
        inside a step out of that step's wall time itself)."""
        if not self.enabled or wait_ns <= 0:
            return
        self._pending_data_ns += int(wait_ns)
        self._step_hooks = True

    def close(self) -> None:
        """Flush the last partial window and stop background work. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        try:
            if self._n:
                self._hand_off(self._n)
        except Exception:  # telemetry never fails the caller
            logger.exception("stagefrontier: flushing the last window failed")
        self._collector.close()

    def __enter__(self) -> StageTimer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    @property
    def _in_step(self) -> bool:
        """Whether a step is open (for the slow paths; the hot path tests ``_active``)."""
        return self._active is not _OUTSIDE

    @property
    def _step_index(self) -> int:
        """Global index of the open step (of the next one between steps)."""
        return self._first_step + self._n

    @property
    def violations(self) -> int:
        """Contract violations counted in the open window."""
        return self._violations if self.enabled else 0

    # ------------------------------------------------------------------ step lifecycle
    def _disable(self) -> None:
        null = _NULL
        self.step = lambda: null  # type: ignore[method-assign]
        self.stage = lambda name: null  # type: ignore[method-assign]
        self.probe = lambda name: null  # type: ignore[method-assign]
        self.microstep = lambda index: null  # type: ignore[method-assign]
        self.cuda_event_sample = _null_event_sample  # type: ignore[method-assign]

    def _alloc(self, capacity: int) -> None:
        self._width = 1 + self._n_timed * capacity
        self._buf = array("q", bytes(8 * self._width * self.window))
        self._buf_view = np.frombuffer(self._buf, dtype=np.int64)  # for zeroing and snapshots

    def _grow(self, capacity: int) -> None:
        """Widen the buffer for more microsteps (rare: the first step with a larger factor)."""
        old, old_width, old_row = self._buf, self._width, self._row
        self._capacity = capacity
        self._alloc(capacity)
        for i in range(self._n + 1):
            self._buf[i * self._width : i * self._width + old_width] = old[
                i * old_width : (i + 1) * old_width
            ]
        self._row = self._n * self._width
        shift = self._row - old_row  # a column keeps its offset within the row
        self._base += shift
        self._last += shift
        self._micro_exit_last += shift

    def _begin_hooks(self, row: int) -> int:
        """The rare work at the beginning of a step. A data wait fetched through ``timer.iter``
        is charged to this step, as the first stage of microstep 0; it is returned, to extend
        the step's wall time over it. Pending CUDA-event pairs are polled."""
        pending = self._pending_data_ns
        if pending:
            self._pending_data_ns = 0
            self._buf[row + 1] = pending
            self._last = row + 1
        if self._events.pending:
            self._events.poll(self)
        self._step_hooks = bool(self._events.pending)
        return pending

    def _stage_left_open(self) -> None:
        """The step ends while an ordered stage is open (its exit never ran)."""
        active = self._active
        self._active = None
        for stage in self._stage_ctx.values():
            stage._reentered = 0
        if active is not None:
            self._violation(f"stage {active._name!r} still open at the end of the step")

    def _end_accumulation_step(self, row: int) -> None:
        """Accumulation bookkeeping at the end of a step that used microsteps, or that follows
        steps that did: a change of factor closes the window before this step."""
        factor = self._step_factor
        if self._n and factor != self._factor:
            self._note(f"accumulation factor changed from {self._factor} to {factor}")
            saved = self._buf[row : row + self._width]
            self._hand_off(self._n, carry_row=self._n)
            self._buf[0 : self._width] = saved
        if self._step_mixed:
            self._window_mixed = True
        self._factor = factor
        self._accumulating = factor != 1
        self._last_micro = -1
        self._step_factor = 1
        self._step_mixed = False

    def _hand_off(self, n: int, carry_row: int | None = None) -> None:
        """Copy ``n`` steps out of the buffer and pass them on without blocking.

        ``carry_row``: the row of a completed step that starts the next window (a change of
        accumulation factor); its CUDA-event sample moves with it.
        """
        first = self._first_step
        try:
            rank_window = self._snapshot(n, first, carry_row)
        except Exception:  # never let a telemetry bug reach the training loop
            logger.exception("stagefrontier: building window %d failed", self._window_index)
            rank_window = None
        self._first_step = first + n
        self._buf_view.fill(0)
        self._last = 0
        self._window_index += 1
        self._n = 0
        self._window_mixed = False
        self._violations = 0
        self._reasons = []
        try:
            queued = rank_window is not None and self._collector.submit(rank_window)
        except Exception:
            logger.exception("stagefrontier: handing off window %d failed", self._window_index - 1)
            queued = False
        if queued:
            self._dropped = 0
        else:
            self._dropped += 1

    def _snapshot(self, n: int, first: int, carry_row: int | None) -> WindowSnapshot:
        """Copy the window's rows and bookkeeping; the collector builds the RankWindow."""
        event_ms, event_state = self._events.drain(self, n, carry_row)
        fields = {
            "window": self._window_index,
            "first_step": first,
            "last_step": first + n - 1,
            "rank": self.rank,
            "event_ms": event_ms,
            "event_state": event_state,
            "forward_stage": self._events.forward_stage,
            "accumulation_factor": self._factor,
            "accumulation_mixed": self._window_mixed,
            "contract_violations": self._violations,
            "violation_reasons": tuple(self._reasons),
            "probes": {name: p.drain() for name, p in self._probes.items() if p.count},
            "dropped_windows": self._dropped,
            "hostname": self._hostname,
            "local_rank": self._local_rank,
            "pid": self._pid,
            "role": self._role,
        }
        raw = self._buf_view[: n * self._width].reshape(n, self._width).copy()
        return WindowSnapshot(raw, self.stages, fields)

    # ------------------------------------------------------------------ contract violations
    def _violation(self, reason: str) -> None:
        if self.strict:
            raise ContractViolation(reason)
        self._violations += 1
        self._note(reason)

    def _note(self, reason: str) -> None:
        if len(self._reasons) < MAX_REASONS and reason not in self._reasons:
            self._reasons.append(reason)

    def _rejected_entry(self, stage: _Stage) -> None:
        """A stage entered outside a step or while an ordered stage is open: counted, not
        recorded (the enclosing span already covers its time)."""
        active = self._active
        if active is _OUTSIDE:
            self._violation(f"stage {stage._name!r} entered outside step()")
            return
        assert active is not None
        self._violation(f"stage {stage._name!r} nested inside ordered stage {active._name!r}")
        if active is stage or active is stage._reentry:
            # The same stage again (a recursive hook): its exits come first and must not end
            # the outer span, so the outer one is parked until they are all done.
            stage._reentered += 1
            self._active = stage._reentry

    def _order_violation(self, name: str) -> None:
        self._violation(f"stage {name!r} repeated or out of schema order within a step")

    def _unknown_stage(self, name: str) -> _NullContext:
        self._violation(f"unknown stage {name!r} (schema: {', '.join(self.stages)})")
        return _NULL


def _null_event_sample(name: str = "") -> _NullContext:
    """``cuda_event_sample`` when sampling is off: no torch, no sampler call."""
    return _NULL


def _start_sinks(sinks: Sequence[Sink]) -> None:
    """Start rank 0's sinks that serve or open something up front (the Prometheus endpoint, the
    TensorBoard event file) instead of at the first window; a failure is logged, never raised."""
    for sink in sinks:
        start = getattr(sink, "start", None)
        if callable(start):
            try:
                start()
            except Exception:
                logger.exception("stagefrontier: starting sink %s failed", type(sink).__name__)
