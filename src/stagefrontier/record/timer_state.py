"""The recorder's state between its contexts: the window buffer, the open step's bookkeeping,
contract violations and the hand-off of a completed window.

``StageTimer`` derives from :class:`TimerState`; the contexts of ``record.contexts`` read and
write these fields directly (an attribute access is the cheapest thing the hot path can do; the
fields they touch every step are slots) and call the slow-path methods here only for the rare
cases.

Buffer layout per step: column 0 is the step wall time, then one column per timed stage and
accumulation microstep (column ``1 + i * K + k``), for up to ``_capacity`` microsteps, in one
flat list of ints. Rows are zero when a window starts (the hand-off gives the filled list to the
snapshot and starts a fresh one); each step writes only its own row.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ..collect import Collector, make_collector
from ..collect.config import CollectConfig
from ..collect.launcher import (
    distributed_initialized,
    launched_rank,
    launched_world_size,
    warn_once,
)
from ..failures import say_failed
from ..window.rank import WindowSnapshot
from .cuda_events import EventSampler
from .loader_workers import WorkerCounters
from .probe import Probe
from .self_cost import CostMeter
from .violations import ContractWarnings

logger = logging.getLogger("stagefrontier")

MAX_REASONS = 8
"""Distinct violation messages kept per window (the count is always exact)."""


class OpenSpan:
    """What ``TimerState._active`` holds: an open ordered stage (a subclass) or a marker."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name


OUTSIDE = OpenSpan("<outside step>")
"""``_active`` between steps: a stage entered now is rejected by the same test as nesting."""
PAUSED = OpenSpan("<paused>")
"""``_active`` between steps while the timer is paused: the next step is not recorded."""
PAUSED_STEP = OpenSpan("<paused step>")
"""``_active`` inside a step that runs while the timer is paused."""
NOT_RECORDING = (OUTSIDE, PAUSED, PAUSED_STEP)
"""The markers under which no step is being recorded."""

_now = time.perf_counter_ns


class TimerState:
    """Fields and slow paths shared by StageTimer and its contexts (see the module doc)."""

    # The fields the contexts read and write on every step are slots. The rest live in the
    # instance dict; a timer has more attributes than an instance dict shares its keys for, so
    # each access there is a hashed lookup, where a slot is a read at a fixed offset.
    __slots__ = (
        "__dict__",
        "_accumulating",
        "_active",
        "_base",
        "_buf",
        "_capacity",
        "_capture",
        "_last",
        "_last_micro",
        "_micro_exit_last",
        "_micro_open",
        "_n",
        "_n_timed",
        "_step_factor",
        "_step_hooks",
        "_step_mixed",
        "_width",
        "_window_end",
    )

    def __init__(
        self,
        stages: tuple[str, ...],
        window: int,
        strict: bool,
        collect_config: CollectConfig,
        cuda_event_fraction: float,
        event_factory: Callable[[], Any] | None,
    ) -> None:
        self.stages = stages
        self.window = window
        self.strict = strict
        self.collect_config = collect_config
        self.rank = launched_rank()  # the collector's, once there is one
        self.world_size = launched_world_size()
        self._n_timed = len(stages)
        self._collector: Collector | None = None  # None until the process group exists
        self._hostname = socket.gethostname()
        self._local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        self._pid = os.getpid()
        self._role: str | None = None
        self._role_set: tuple[str, ...] = ()
        self._phase: str | None = None  # set_phase; the window's phase is the one at its end
        self._phase_changed = False  # the phase changed while the open window held steps
        # What every window of this rank says of the rank (built at the first hand-off, and
        # again if the rank changes when the collector is built then).
        self._static_fields: dict[str, Any] = {}
        self._probes: dict[str, Probe] = {}
        self._events = EventSampler(
            cuda_event_fraction, event_factory, window, self._poll_at_next_step
        )
        self._capacity = 1
        self._factor = 1  # the accumulation factor of the open window
        self._alloc(self._capacity)
        self._first_step = 0  # global index of the open window's first step
        self._n = 0  # completed steps in the open window
        # Paused steps count in the step index and the window's span, never in its rows: a
        # window ends when recorded plus paused steps reach ``window``, i.e. when ``_n`` reaches
        # ``_window_end``, so ranks that pause different steps keep the same window boundaries.
        self._paused = 0
        self._paused_ranges: list[list[int]] = []
        self._paused_through: list[list[int]] = []  # steps of windows not handed off: all paused
        self._handed_windows = 0
        # Set through a hand-off: a close on another thread (SIGTERM's) must not read it half done.
        self._handing_off = False
        self._window_end = window
        self._window_index = 0
        # The open ordered stage: None when none is, OUTSIDE when no step is open.
        self._active: OpenSpan | None = OUTSIDE
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
        self._micro_open = False  # inside a recorded microstep's context
        self._step_factor = 1
        self._step_mixed = False
        self._window_mixed = False
        self._violations = 0
        self._reasons: list[str] = []
        self._contract = ContractWarnings(stages, strict, lambda: self.rank)
        self._dropped = 0
        # Prefetch-aware data wait (timer.iter, timer.fetch): each fetch is charged to the next
        # step to begin (its start is moved back by the wait); a fetch made inside a step is
        # taken out of that step's wall time (its start is moved forward).
        self._pending_data_ns = 0
        # Work for the next step's beginning: a data wait to import, event pairs to poll, or
        # the wall clock of the run's first step to read.
        self._step_hooks = True
        # The wall clock (ns since the epoch) at the open window's first step: read as the
        # run's first step begins, then at each hand-off (the next window begins there).
        self._window_started_ns = 0
        # The DataLoader ``timer.iter`` was last given: its workers' counters, or why none.
        self._loader_workers: WorkerCounters | None = None
        self._loader_note = ""
        self._capture = False  # set by the router's thread while a capture is armed or runs
        # What ``timer.iter`` fetches through, and the hook clocks' wait ranges: swapped for
        # ``annotate.WaitRanges`` while the router captures (the builtin ``next`` otherwise).
        self._next_item: Callable[[Any], Any] = next
        self._wait_ranges: Any = None
        self._router: Any = None  # a StageTimer's router runtime (record.recorder)
        self._cost = CostMeter(False, type(self))  # StageTimer sets its own calibration
        self._collectives: Any = None  # a record.collectives.CollectiveLog once watch_ddp ran

    @property
    def _step_index(self) -> int:
        """Global index of the open step (of the next one between steps), paused ones counted."""
        return self._first_step + self._n + self._paused

    # ------------------------------------------------------------------ the buffer
    def _alloc(self, capacity: int) -> None:
        self._width = 1 + self._n_timed * capacity
        self._buf = [0] * (self._width * self.window)

    def _grow(self, capacity: int) -> None:
        """Widen the buffer for more microsteps (rare: the first step with a larger factor)."""
        old, old_width = self._buf, self._width
        self._capacity = capacity
        self._alloc(capacity)
        for i in range(self._n + 1):
            self._buf[i * self._width : i * self._width + old_width] = old[
                i * old_width : (i + 1) * old_width
            ]
        shift = self._n * (self._width - old_width)  # a column keeps its offset within the row
        self._base += shift
        self._last += shift
        self._micro_exit_last += shift

    # ------------------------------------------------------------------ step boundaries
    def _poll_at_next_step(self) -> None:
        """The event sampler has a pair to poll at the next step's beginning."""
        self._step_hooks = True

    def _begin_hooks(self, row: int) -> int:
        """The rare work at the beginning of a step. A data wait fetched through ``timer.iter``
        is charged to this step, as the first stage of microstep 0; it is returned, to extend
        the step's wall time over it. Pending CUDA-event pairs are polled. The run's first step
        reads the wall clock its first window starts at. The collectives' run-queue count
        starts here: at a window's first step, and at the first step recorded after a pause."""
        pending = self._pending_data_ns
        if not self._window_started_ns:  # the run's first step: its data wait included
            self._window_started_ns = time.time_ns() - pending
        if pending:
            self._pending_data_ns = 0
            self._buf[row + 1] = pending
            self._last = row + 1
        if self._events.pending:
            self._events.poll(self._step_index)
        if self._collectives is not None:
            self._collectives.run_queue.start()
        self._step_hooks = bool(self._events.pending)
        return pending

    def _in_microstep(self) -> bool:
        """A data wait made now is the open microstep's own (``analysis.wait_rule``): a batch
        fetched inside a microstep's context with no ordered stage open, as accumulation loops
        fetch the next microstep's batch between its forward and backward."""
        return self._micro_open and self._active is None

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

    # ------------------------------------------------------------------ pause
    def _begin_paused_step(self) -> None:
        """A step begins while paused: nothing of it is recorded, and the data wait charged to
        it (a batch fetched for it) is dropped with it."""
        self._active = PAUSED_STEP
        self._pending_data_ns = 0
        if self._collectives is not None:  # a paused stretch is not the window's CPU wait
            self._collectives.run_queue.pause()
            self._step_hooks = True  # the count starts again at the next recorded step
        if self._capture:  # a capture armed or running ends at a pause
            self._router.on_pause(self._step_index)

    def _pause_landed_inside_step(self) -> None:
        """A ``pause()`` from another thread found the timer between steps, and the training
        thread began a step before it took effect: it is undone (the stages record again) and
        counted, so it does not leave later steps recorded without their stages."""
        self._resume_stages()
        self._violation("pause() landed inside a step (from another thread?): ignored")

    def _resume_stages(self) -> None:
        """Recorded stages again after a pause (StageTimer swaps its stage lookup)."""

    def _end_paused_step(self) -> None:
        """A paused step ended: it counts in the window's span (and may end the window)."""
        self._active = PAUSED
        step = self._step_index
        ranges = self._paused_ranges
        if ranges and ranges[-1][1] == step - 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
        self._paused += 1
        self._window_end -= 1
        if self._n == self._window_end:
            self._hand_off(self._n)

    # ------------------------------------------------------------------ hand-off
    def _open_collector(self) -> Collector:
        """Build the collector deferred by a timer made before ``init_process_group``: at the
        first window boundary, with the process group if it exists by now, else one folder per
        rank (see ``collect.launcher``)."""
        if not distributed_initialized():
            warn_once(
                "no-process-group",
                "stagefrontier: torch.distributed is still not initialized at the first window "
                "boundary: each rank analyzes its own windows alone, under %s",
                os.path.join(os.fspath(self.collect_config.out_dir), "rank-<rank>"),
            )
        collector = self._collector = make_collector(self.collect_config)
        self.rank, self.world_size = collector.rank, collector.world_size
        return collector

    def _hand_off(self, n: int, carry_row: int | None = None) -> None:
        """Copy ``n`` steps out of the buffer and pass them on without blocking.

        ``carry_row``: the row of a completed step that starts the next window (a change of
        accumulation factor); its CUDA-event sample moves with it.

        A window whose steps were all paused (``n == 0``) is not handed off; its index is
        skipped, so that the next window keeps the index of the other ranks' next window.
        """
        self._handing_off = True
        try:
            self._hand_off_steps(n, carry_row)
        finally:
            self._handing_off = False

    def _hand_off_steps(self, n: int, carry_row: int | None) -> None:
        """``_hand_off``'s work, under its flag."""
        start = _now()
        ended_ns = time.time_ns()
        first = self._first_step
        collector = self._collector
        rank_window = None
        if n:
            try:
                if collector is None:
                    collector = self._open_collector()
                rank_window = self._snapshot(n, first, carry_row, ended_ns)
            except Exception as exc:  # never let a telemetry bug reach the training loop
                say_failed(
                    logger, f"building window {self._window_index}", exc, "that window is lost"
                )
        if not n and self._paused:
            self._note_paused_through(first, first + self._paused - 1)
        elif n:
            self._handed_windows += 1
        self._first_step = first + n + self._paused
        self._window_started_ns = ended_ns
        self._buf = [0] * len(self._buf)  # the snapshot took the old one
        self._last = 0
        self._window_index += 1
        self._n = 0
        self._paused = 0
        self._paused_ranges = []
        self._phase_changed = False
        self._window_end = self.window
        self._window_mixed = False
        self._violations = 0
        self._reasons = []
        if self._collectives is not None:  # the run-queue count starts at the next step
            self._step_hooks = True
        if n:
            try:
                queued = (
                    rank_window is not None
                    and collector is not None
                    and collector.submit(rank_window)
                )
            except Exception as exc:
                index = self._window_index - 1
                say_failed(logger, f"handing off window {index}", exc, "that window is lost")
                queued = False
            if queued:
                self._dropped = 0
            else:
                self._dropped += 1
        self._cost.handoff_ns = _now() - start

    def _snapshot(self, n: int, first: int, carry_row: int | None, ended_ns: int) -> WindowSnapshot:
        """Copy the window's rows and bookkeeping; the collector builds the RankWindow.
        ``ended_ns``: the wall clock as the window's last step ended."""
        events = self._events
        event_ms, event_state = (
            events.drain(n, self._step_index, carry_row) if events.fraction else (None, None)
        )
        static = self._static_fields
        if static.get("rank") != self.rank:  # before the first window, or the rank is known now
            static = self._static_fields = {
                "rank": self.rank,
                "hostname": self._hostname,
                "local_rank": self._local_rank,
                "pid": self._pid,
                "role": self._role,
                "role_set": self._role_set,
            }
        fields = {
            **static,
            "window": self._window_index,
            "first_step": first,
            "last_step": first + n + self._paused - 1,
            "paused_ranges": tuple(map(tuple, self._paused_ranges)),
            "phase": self._phase,
            "phase_changed": self._phase_changed,
            "started_unix_ns": self._window_started_ns,
            "ended_unix_ns": ended_ns,
            "handoff_ns": self._cost.handoff_ns,
            "event_ms": event_ms,
            "event_state": event_state,
            "forward_stage": events.forward_stage,
            "accumulation_factor": self._factor,
            "accumulation_mixed": self._window_mixed,
            "contract_violations": self._violations,
            "violation_reasons": tuple(self._reasons),
            "probes": self._drain_probes() if self._probes else {},
            "dropped_windows": self._dropped,
            "loader": self._loader_counts(),
            "collectives": (
                {} if self._collectives is None else self._collectives.drain(self._step_index - 1)
            ),
        }
        return WindowSnapshot(self._buf, n, self._width, self.stages, fields, self._cost)

    def set_phase(self, name: str | None) -> None:
        """Name the phase of the run the next steps belong to (``"evaluation"``,
        ``"checkpoint"``, ``"seq-4096"``; None: no phase). Each phase keeps its own baseline
        for the live regression check (``analysis.baseline_phases``): a window of another
        phase is never a regression of the phase before. A window carries the phase in force
        at its end (``phase`` in rank 0's record); one the phase changed inside is compared
        with nothing. Cheap; call it between steps, on every rank alike. A name that is not
        printable text is a contract violation, ignored."""
        if name is not None and (not isinstance(name, str) or not name.isprintable()):
            self._violation(f"set_phase({name!r:.40}): not a printable name; ignored")
            return
        if name != self._phase:
            self._phase_changed = self._phase_changed or bool(self._n or self._paused)
            self._phase = name

    def _drain_probes(self) -> dict[str, Any]:
        return {name: p.drain() for name, p in self._probes.items() if p.count}

    def _loader_counts(self) -> dict[str, Any]:
        """The loader's worker counts since the last window (a few shared-memory reads), or
        the note saying why there are none."""
        if self._loader_workers is not None:
            return self._loader_workers.read()
        return {"note": self._loader_note} if self._loader_note else {}

    def _note_paused_through(self, first: int, last: int) -> None:
        through = self._paused_through
        if through and through[-1][1] == first - 1:
            through[-1][1] = last
        else:
            through.append([first, last])

    def _say_paused_through(self) -> None:
        """At close: the steps no window was recorded for because they ran paused from their
        window's first step to its last (or to the end of the run)."""
        if self._paused and not self._n:  # the last window, paused to the end
            self._note_paused_through(self._first_step, self._step_index - 1)
        through = self._paused_through
        if not through:
            return
        if not self._handed_windows:
            steps = sum(b - a + 1 for a, b in through)
            logger.warning(
                "stagefrontier: rank %d recorded no window: all %d of its steps (%s) ran paused "
                "(pause())",
                self.rank,
                steps,
                ", ".join(f"{a}-{b}" for a, b in through),
            )
            return
        logger.warning(
            "stagefrontier: rank %d recorded no window for steps %s: the timer was paused from "
            "their window's first step to its last (pause())",
            self.rank,
            ", ".join(f"{a}-{b}" for a, b in through),
        )

    # ------------------------------------------------------------------ contract violations
    def _violation(self, reason: str) -> None:
        """Count a violation in the open window (raised instead when strict; its kind logged
        once on the rank: ``record.violations``)."""
        self._contract.say(reason)
        self._violations += 1
        self._note(reason)

    def _note(self, reason: str) -> None:
        if len(self._reasons) < MAX_REASONS and reason not in self._reasons:
            self._reasons.append(reason)

    def _order_violation(self, name: str) -> None:
        self._violation(f"stage {name!r} repeated or out of schema order within a step")

    def _unknown_stage(self, name: str) -> None:
        """A stage name outside the schema: counted with every use (said once)."""
        self._violation(self._contract.unknown_stage(name))
