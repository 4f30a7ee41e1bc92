"""StageTimer: the per-rank recorder that runs inside the training loop.

Hot-path rules: integer nanoseconds from ``time.perf_counter_ns``, writes into a preallocated
``array('q')`` buffer, no I/O, no locks, no torch call (unless CUDA-event sampling is on), and
one non-blocking hand-off per window. Contract violations are counted and reported with the
window; they never raise into training unless ``strict=True``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from .collect import Collector, make_collector
from .cuda_events import EventSampler
from .noop import NOOP as _NULL
from .noop import NoopContext as _NullContext
from .errors import StageFrontierError
from .schema import DATA_STAGE, DEFAULT_STAGES, RESIDUAL_STAGE, check_stage_names, expand_microsteps
from .window import RankWindow

logger = logging.getLogger("stagefrontier")
_now = time.perf_counter_ns
T = TypeVar("T")

MAX_REASONS = 8
"""Distinct violation messages kept per window (the count is always exact)."""


class ContractViolation(StageFrontierError):
    """Raised instead of counted when the timer is strict."""




class _Stage:
    """Context for one ordered stage; one instance per stage name, reused every step."""

    __slots__ = ("_timer", "_column", "_name", "_start")

    def __init__(self, timer: StageTimer, column: int, name: str) -> None:
        self._timer = timer
        self._column = column
        self._name = name
        self._start = 0

    def __enter__(self) -> None:
        t = self._timer
        if t._active is not None or t._row < 0:
            t._entry_violation(self._name)  # not recorded: the enclosing span covers it
            return
        t._active = self
        self._start = _now()

    def __exit__(self, *exc: object) -> None:
        end = _now()
        t = self._timer
        if t._active is not self:
            return
        t._active = None
        column = 1 + t._micro_offset + self._column
        if column <= t._last_column:
            t._order_violation(self._name)
        else:
            t._last_column = column
        if t._micro_used and not t._micro_active:
            t._outside_after_micro = True
        t._buf[t._row + column] += end - self._start


class _Step:
    __slots__ = ("_timer", "_start", "_depth")

    def __init__(self, timer: StageTimer) -> None:
        self._timer = timer
        self._start = 0
        self._depth = 0

    def __enter__(self) -> None:
        self._depth += 1
        if self._depth > 1:
            self._timer._violation("step() entered inside another step")
            return
        self._timer._begin_step()
        self._start = _now()

    def __exit__(self, *exc: object) -> None:
        end = _now()
        self._depth -= 1
        if self._depth == 0:
            self._timer._end_step(end - self._start)


class _Microstep:
    __slots__ = ("_timer", "_index")

    def __init__(self, timer: StageTimer, index: int) -> None:
        self._timer = timer
        self._index = index

    def __enter__(self) -> None:
        t = self._timer
        index = self._index
        if index != t._last_micro + 1 or t._outside_after_micro:
            t._step_mixed = True
        t._last_micro = index
        t._micro_active = True
        t._micro_used = True
        if index >= t._capacity:
            t._grow(index + 1)
        if index + 1 > t._step_factor:
            t._step_factor = index + 1
        t._micro_offset = index * t._n_timed

    def __exit__(self, *exc: object) -> None:
        self._timer._micro_active = False


class _Probe:
    """Side-channel span: may nest anywhere, never enters the prefix vector."""

    __slots__ = ("_start", "count", "total_ns", "max_ns")

    def __init__(self) -> None:
        self._start = 0
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    def __enter__(self) -> None:
        self._start = _now()

    def __exit__(self, *exc: object) -> None:
        elapsed = _now() - self._start
        self.count += 1
        self.total_ns += elapsed
        if elapsed > self.max_ns:
            self.max_ns = elapsed

    def drain(self) -> dict[str, float]:
        out = {"count": float(self.count), "total_s": self.total_ns * 1e-9, "max_s": self.max_ns * 1e-9}
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

        self._collector = collector or make_collector(
            collect, out_dir=self.out_dir, timeout_s=collect_timeout_s, queue_size=queue_size
        )
        self.rank = self._collector.rank
        self.world_size = self._collector.world_size
        self._hostname = socket.gethostname()
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self._role = role
        self._stage_ctx = {name: _Stage(self, i, name) for i, name in enumerate(self.stages)}
        self._probes: dict[str, _Probe] = {}
        self._step_ctx = _Step(self)
        self._micro_ctx: dict[int, _Microstep] = {}
        self._events = EventSampler(cuda_event_fraction, event_factory, window)

        # Buffer layout per step: column 0 is the step wall time, then one column per timed
        # stage and accumulation microstep (column 1 + i * K + k), for up to ``_capacity``
        # microsteps. ``_factor`` is the accumulation factor of the open window.
        self._capacity = 1
        self._factor = 1
        self._alloc(self._capacity)
        self._step = 0  # global index of the next step
        self._n = 0  # completed steps in the open window
        self._window_index = 0
        self._window_first = 0
        self._row = -1  # buffer offset of the open step; -1 outside a step
        self._active: _Stage | None = None
        self._last_column = 0
        self._micro_offset = 0
        self._micro_active = False
        self._micro_used = False
        self._last_micro = -1
        self._outside_after_micro = False
        self._step_factor = 1
        self._step_mixed = False
        self._window_mixed = False
        self._violations = 0
        self._reasons: list[str] = []
        self._dropped = 0
        # Prefetch-aware data wait (timer.iter): each fetch is charged to the next step to start.
        self._pending_data_ns = 0
        self._imported_ns = 0
        self._exported_ns = 0

    # ------------------------------------------------------------------ public contexts
    def step(self) -> _Step | _NullContext:
        """Context around one logical optimizer step."""
        return self._step_ctx

    def stage(self, name: str) -> _Stage | _NullContext:
        """Context for one ordered stage. Stages must not nest and must follow schema order."""
        ctx = self._stage_ctx.get(name)
        if ctx is None:
            return self._unknown_stage(name)
        return ctx

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
        end of step t. ``stage`` must be the first ordered stage; do not also time it."""
        if not self.enabled:
            yield from iterable
            return
        if not self.stages or self.stages[0] != stage:
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
            if self._row >= 0:
                self._exported_ns += elapsed
            yield item

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

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        self.cuda_event_sample = lambda name="": null  # type: ignore[method-assign]

    def _alloc(self, capacity: int) -> None:
        self._width = 1 + self._n_timed * capacity
        self._buf = array("q", bytes(8 * self._width * self.window))
        self._zero_row = array("q", bytes(8 * self._width))

    def _grow(self, capacity: int) -> None:
        """Widen the buffer for more microsteps (rare: the first step with a larger factor)."""
        old, old_width = self._buf, self._width
        self._capacity = capacity
        self._alloc(capacity)
        for i in range(self._n + 1):
            self._buf[i * self._width : i * self._width + old_width] = old[
                i * old_width : (i + 1) * old_width
            ]
        self._row = self._n * self._width

    def _begin_step(self) -> None:
        if self._n == 0:
            self._window_first = self._step
        row = self._n * self._width
        self._buf[row : row + self._width] = self._zero_row
        self._row = row
        self._last_column = 0
        self._micro_offset = 0
        self._micro_used = False
        self._micro_active = False
        self._last_micro = -1
        self._outside_after_micro = False
        self._step_factor = 1
        self._step_mixed = False
        self._imported_ns = self._pending_data_ns
        self._pending_data_ns = 0
        if self._imported_ns:
            self._buf[row + 1] = self._imported_ns  # the data stage of microstep 0: done
            self._last_column = 1
        self._events.poll(self)

    def _end_step(self, elapsed_ns: int) -> None:
        if self._active is not None:
            self._violation(f"stage {self._active._name!r} still open at the end of the step")
            self._active = None
        row = self._row
        # A fetch made during this step belongs to the next one, a fetch made before it started
        # belongs to this one: move both so that the wall time matches the stages.
        self._buf[row] = elapsed_ns - self._exported_ns + self._imported_ns
        self._exported_ns = 0
        self._row = -1
        self._step += 1
        if self._step_mixed:
            self._window_mixed = True
        if self._n and self._step_factor != self._factor:
            self._note(f"accumulation factor changed from {self._factor} to {self._step_factor}")
            self._hand_off(self._n)
            self._buf[0 : self._width] = self._buf[row : row + self._width]
            self._window_first = self._step - 1
        self._factor = self._step_factor
        self._n += 1
        if self._n == self.window:
            self._hand_off(self._n)

    def _hand_off(self, n: int) -> None:
        """Copy ``n`` steps out of the buffer and pass them on without blocking."""
        try:
            rank_window = self._snapshot(n)
        except Exception:  # never let a telemetry bug reach the training loop
            logger.exception("stagefrontier: building window %d failed", self._window_index)
            rank_window = None
        self._window_index += 1
        self._n = 0
        self._window_mixed = False
        self._violations = 0
        self._reasons = []
        if rank_window is not None and self._collector.submit(rank_window):
            self._dropped = 0
        else:
            self._dropped += 1

    def _snapshot(self, n: int) -> RankWindow:
        k = self._n_timed * self._factor
        raw = np.frombuffer(self._buf, dtype=np.int64, count=n * self._width)
        raw = raw.reshape(n, self._width)
        wall = raw[:, 0].copy()
        durations = np.empty((n, k + 1), dtype=np.int64)
        durations[:, :k] = raw[:, 1 : 1 + k]
        durations[:, k] = np.maximum(wall - durations[:, :k].sum(axis=1), 0)
        timed = self.stages if self._factor == 1 else expand_microsteps(self.stages, self._factor)
        event_ms, event_state = self._events.drain(self, n)
        return RankWindow(
            window=self._window_index,
            first_step=self._window_first,
            last_step=self._window_first + n - 1,
            rank=self.rank,
            stages=(*timed, RESIDUAL_STAGE),
            durations_ns=durations,
            wall_ns=wall,
            event_ms=event_ms,
            event_state=event_state,
            forward_stage=self._events.forward_stage,
            accumulation_factor=self._factor,
            accumulation_mixed=self._window_mixed,
            contract_violations=self._violations,
            violation_reasons=tuple(self._reasons),
            probes={name: p.drain() for name, p in self._probes.items() if p.count},
            dropped_windows=self._dropped,
            hostname=self._hostname,
            local_rank=self._local_rank,
            pid=os.getpid(),
            role=self._role,
        )

    # ------------------------------------------------------------------ contract violations
    def _violation(self, reason: str) -> None:
        if self.strict:
            raise ContractViolation(reason)
        self._violations += 1
        self._note(reason)

    def _note(self, reason: str) -> None:
        if len(self._reasons) < MAX_REASONS and reason not in self._reasons:
            self._reasons.append(reason)

    def _entry_violation(self, name: str) -> None:
        if self._row < 0:
            self._violation(f"stage {name!r} entered outside step()")
        elif self._active is not None:
            self._violation(f"stage {name!r} nested inside ordered stage {self._active._name!r}")

    def _order_violation(self, name: str) -> None:
        self._violation(f"stage {name!r} repeated or out of schema order within a step")

    def _unknown_stage(self, name: str) -> _NullContext:
        self._violation(f"unknown stage {name!r} (schema: {', '.join(self.stages)})")
        return _NULL
