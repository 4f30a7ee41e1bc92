"""StageTimer: the per-rank recorder that runs inside the training loop.

Hot-path rules: integer nanoseconds from ``time.perf_counter_ns``, writes into a preallocated
list of ints (a list store is a pointer store; an ``array('q')`` store converts to a C integer
first and costs about 20 ns more per context), no I/O, no locks, no torch call (unless
CUDA-event sampling is on), and one non-blocking hand-off per window. Contract violations are
counted and reported with the window; they never raise into training unless ``strict=True``.

The common path is kept to a few attribute reads and writes per context: ``timer.stage`` is a
dict lookup with no Python frame, the ``with`` statement finds each context's enter and exit
already bound (``record.contexts``), the timer's fields they touch are slots
(``record.timer_state``), every buffer index is absolute (the open step's row offset is
folded into ``_base`` and ``_last``), a window's buffer is handed over whole and replaced by a
fresh zeroed one (never zeroed step by step),
and the rare cases (accumulation, prefetched data waits, pending CUDA events, violations) each
sit behind one truth test. ``benchmarks/hotpath.py`` measures it against a bare context manager.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from numbers import Integral
from typing import Any, ParamSpec, TypeVar

from ..analysis.schema import DATA_STAGE
from ..collect import Collector, announce_disabled, make_collector
from ..collect.launcher import awaiting_process_group, launched_world_size, warn_once
from ..collect.settings import check_has_methods
from ..deadline import FINISH_S, call_within, close_deadline_s, router_close_s
from ..errors import ContractViolation as ContractViolation  # defined there, importable here
from ..errors import StageFrontierError, TimerSettingError
from ..failures import say_failed
from .annotate import ProfilerRanges
from .collectives import CollectiveLog, OwnCollective, watch_ddp
from .config import TimerConfig, config_from_keywords, warn_deprecated
from .contexts import (
    AnnotatedStageContext,
    AnnotatedStepContext,
    MicrostepContext,
    StageContext,
    StageTable,
    StepContext,
)
from .instrumentation import Instrumentation
from .loader_workers import WorkerCounters, watch_loader
from .mesh_roles import mesh_roles
from .noop import NOOP, NoopContext
from .on_sigterm import close_on_sigterm, closed
from .out_dirs import hold_out_dir, release_out_dir
from .probe import Probe
from .self_cost import CostMeter
from .sharded_collectives import watch_fsdp, watch_zero
from .timer_state import NOT_RECORDING, OUTSIDE, PAUSED, PAUSED_STEP, TimerState

logger = logging.getLogger("stagefrontier")
_now = time.perf_counter_ns
T = TypeVar("T")
P = ParamSpec("P")


class StageTimer(TimerState):
    """Times ordered training stages on every rank and hands each window to the analyzer.

    Args:
        config: every setting, as one :class:`~stagefrontier.TimerConfig` tree (its stages,
            window, collection, router, ...); the defaults when None.
        collector: a ready collector, replacing the one ``config.collection`` describes (for
            tests and custom transports); give its sinks and gates to it.
        stages, keywords: the flat settings of earlier releases (``stages``, ``window``,
            ``out_dir``, ``collect``, ``router``, ...), deprecated: each warns with the
            ``TimerConfig`` field that replaces it (``record.config.DEPRECATED``). Give them or
            ``config``, not both.

    A setting of the wrong type or out of its range raises
    :class:`~stagefrontier.TimerSettingError` naming it.

    Built under a launcher (``WORLD_SIZE`` > 1) before ``init_process_group``, a timer whose
    collection mode is ``"auto"`` warns once and builds its collector at its first window
    boundary, when the process group normally exists; if it still does not, each rank writes
    under ``out_dir/rank-<r>/``.
    """

    def __init__(
        self,
        stages: Sequence[str] | None = None,
        *,
        config: TimerConfig | None = None,
        collector: Collector | None = None,
        **keywords: Any,
    ) -> None:
        if stages is not None:
            keywords = {"stages": stages, **keywords}
        if keywords:
            if config is not None:
                raise StageFrontierError(
                    "give every setting in config=TimerConfig(...), not also as StageTimer "
                    f"keywords ({', '.join(keywords)})"
                )
            config = config_from_keywords(keywords)
            warn_deprecated(list(keywords), stacklevel=2)
        elif config is None:
            config = TimerConfig()
        elif not isinstance(config, TimerConfig):
            raise TimerSettingError(f"config must be a TimerConfig, got {config!r:.60}")
        if collector is not None:
            check_has_methods("collector", collector, "submit", "close")
            if config.collection.sinks or config.collection.gates is not None:
                raise StageFrontierError(
                    "give sinks and gates to the collector you pass, not to StageTimer"
                )
        role: str | None = config.role
        role_set: tuple[str, ...] = ()
        if config.mesh is not None:
            role, role_set = mesh_roles(config.mesh, config.role_dims)
        sampling = config.sampling
        super().__init__(
            config.timed_stages,
            config.window,
            config.strict,
            config.collection,
            sampling.cuda_event_fraction,
            sampling.event_factory,
        )
        self.config = config
        self._cost = CostMeter(config.annotate, calibration_timer)
        self.enabled = enabled = config.enabled
        self.out_dir = os.fspath(config.collection.out_dir)
        self._closed = False
        self._out_dir_held: str | None = None
        if enabled and collector is None:
            self._out_dir_held = hold_out_dir(self)
        self._disabled_scope: int | None = None
        if not enabled:
            self._disable()
            self._disabled_scope = announce_disabled(config.collection)
            return

        if collector is not None:
            self._collector = collector
        elif awaiting_process_group(config.collection.mode):
            warn_once(
                "before-process-group",
                "stagefrontier: StageTimer built before torch.distributed.init_process_group "
                "(WORLD_SIZE=%d): collection waits for the process group until the first window "
                "boundary. Build the timer after init_process_group to silence this.",
                launched_world_size(),
            )
        else:
            self._collector = make_collector(config.collection)
        if self._collector is not None:
            self.rank, self.world_size = self._collector.rank, self._collector.world_size
        self._role, self._role_set = role, role_set
        ranges = ProfilerRanges() if config.annotate else None
        self._stage_ctx = StageTable(self)
        self._stage_ctx.update(
            (
                name,
                StageContext(self, 1 + i, name)
                if ranges is None
                else AnnotatedStageContext(self, 1 + i, name, ranges),
            )
            for i, name in enumerate(self.stages)
        )
        self.stage = self._stage_ctx.__getitem__  # type: ignore[method-assign,assignment]
        self._recording_stage = self.stage
        # While paused, ``timer.stage`` answers the no-op through a C-level lookup, so a paused
        # step costs about what a disabled timer's does (a stage obtained before ``pause()``
        # still sees the pause, through its context's first test).
        self._paused_stage = _noop_table().__getitem__
        self._step_ctx = (
            StepContext(self, self._stage_ctx)
            if ranges is None
            else AnnotatedStepContext(self, self._stage_ctx, ranges)
        )
        # ``timer.step`` answers the one step context through a C-level callable: no Python
        # frame before the context's own enter (``step`` below documents it).
        self.step = itertools.repeat(self._step_ctx).__next__  # type: ignore[method-assign]
        self._micro_ctx: dict[int, MicrostepContext] = {}
        if config.sampling.cuda_event_fraction == 0.0:
            self.cuda_event_sample = _null_event_sample  # type: ignore[method-assign]
        self.instrumentation = Instrumentation(self)
        """What the router (and other recorders alongside the timer) read and drive of it."""
        router = config.router
        self._router = None if router is None else router.attach(self.instrumentation)
        close_on_sigterm(self)

    # ------------------------------------------------------------------ public contexts
    def step(self) -> StepContext | NoopContext:
        """Context around one logical optimizer step. (Each timer binds this to a C-level
        callable that returns its one step context, or the no-op when disabled.)"""
        return self._step_ctx

    def stage(self, name: str) -> StageContext | NoopContext:
        """Context for one ordered stage. Stages must not nest and must follow schema order;
        an unknown name is a contract violation, logged at WARNING the first time. (Each timer
        binds this to its stage table's lookup, so ``name`` must be a str, or at least
        hashable.)"""
        return self._stage_ctx[name]

    def probe(self, name: str) -> Probe | NoopContext:
        """Side-channel span that may nest anywhere; reported per window, never in the frontier."""
        ctx = self._probes.get(name)
        if ctx is None:
            ctx = self._probes[name] = Probe()
        return ctx

    def microstep(self, index: int) -> MicrostepContext | NoopContext:
        """Context for gradient-accumulation microstep ``index`` (0, 1, ... in order) inside a
        step: ordered stages in it are recorded as substages ``name[index]``. Stages timed
        outside microsteps belong to the microstep before them (the optimizer after the last)."""
        ctx = self._micro_ctx.get(index)
        if ctx is None:
            if not isinstance(index, int) or index < 0:
                self._violation(f"microstep index must be an int >= 0, got {index!r}")
                return NOOP
            ctx = self._micro_ctx[index] = MicrostepContext(self, index)
        return ctx

    def cuda_event_sample(self, name: str = "model.fwd_loss_cuda_event_ms") -> Any:
        """Bracket a region (the forward) with two CUDA events on a deterministic fraction of
        steps. Readiness is polled at later step boundaries, never synchronized; the value is
        side evidence and never enters the prefix vector."""
        active = self._active
        if active in NOT_RECORDING:
            return NOOP
        return self._events.context(
            self._n, self._step_index, None if active is None else active._name
        )

    def iter(self, iterable: Iterable[T], stage: str = DATA_STAGE) -> Iterator[T]:
        """Wrap a data iterator so that each ``next()`` wait is charged to the step that consumes
        the batch: the next step to begin after the fetch. This covers ``for batch in
        timer.iter(loader): with timer.step(): ...`` and loops that prefetch batch t+1 at the
        end of step t (a fetch made inside a step is also taken out of that step's wall time).
        So fetch before the step that uses the batch, or at the end of the step before it:
        a fetch inside a step always counts for the next one. ``stage`` must be the first
        ordered stage; do not also time it.

        A ``torch.utils.data.DataLoader`` with worker processes is watched from inside: each
        window then carries how long its workers take per batch and how busy they are
        (``record.loader_workers``; the timer chains a ``worker_init_fn`` before the loader's
        own). Give the loader before its persistent workers start."""
        if not self.enabled:
            yield from iterable
            return
        if self.stages[0] != stage:
            self._violation(f"timer.iter stage {stage!r} must be the first ordered stage")
        workers = self.watch_dataloader(iterable)
        iterator = iter(iterable)
        while True:
            start = _now()
            try:
                item = self._next_item(iterator)
            except StopIteration:
                return
            self._charge_fetch(_now() - start)
            if workers is not None:
                workers.consumed += 1
            yield item

    def watch_dataloader(self, loader: Any) -> WorkerCounters | None:
        """Time the worker processes of ``loader`` from inside, as ``timer.iter`` does for the
        loader it is given, for a loop that iterates the loader itself (the framework
        callbacks call it). Call it before the workers start. Returns the loader's counters,
        whose ``consumed`` the caller adds the batches the loop took to, or None (a loader
        without workers, or not a DataLoader: the window's figures then carry the note)."""
        if not self.enabled:
            return None
        workers, self._loader_note = watch_loader(loader)
        self._loader_workers = workers
        return workers

    def watch_ddp(self, model: Any) -> bool:
        """Time every gradient bucket of ``model`` (a ``DistributedDataParallel``) as it is
        reduced: when each rank reached it and how long it waited, read across ranks into the
        late rank or a slow collective (docs/communication.md). Call it before
        ``register_comm_hook``, whose hook then runs inside the timed one. Returns whether the
        buckets are timed (the window record says why not)."""
        return self.enabled and watch_ddp(self._collective_log(), model)

    def watch_fsdp(self, model: Any) -> bool:
        """Time the all-gathers and reduce-scatters of every FSDP2 (``fully_shard``) module
        of ``model``, as ``watch_ddp`` does DDP's buckets. Returns whether they are timed."""
        return self.enabled and watch_fsdp(self._collective_log(), model)

    def watch_zero(self, optimizer: Any) -> bool:
        """Time the parameter broadcasts of a ``ZeroRedundancyOptimizer`` at each ``step``.
        Returns whether they are timed."""
        return self.enabled and watch_zero(self._collective_log(), optimizer)

    def collective(self, name: str, nbytes: int = 0) -> Any:
        """``with timer.collective("loss_all_reduce"): dist.all_reduce(loss)``: the program's
        own collective timed as ``name`` inside the open stage, read across ranks like DDP's
        buckets. Put the whole collective in the block (an asynchronous one with its
        ``wait``). A ``name`` that is not a str, or an ``nbytes`` that is not an int >= 0, is
        a contract violation: the block then times nothing, or is logged with 0 bytes."""
        if not self.enabled:
            return NOOP
        if not isinstance(name, str):
            self._violation(f"timer.collective name must be a str, got {type(name).__name__}")
            return NOOP
        integral = isinstance(nbytes, Integral) and not isinstance(nbytes, bool)
        if not integral or nbytes < 0:
            kind = "a negative int" if integral else type(nbytes).__name__
            self._violation(f"timer.collective nbytes must be an int >= 0, got {kind}")
            nbytes = 0
        return OwnCollective(self._collective_log(), name, int(nbytes))

    def _collective_log(self) -> CollectiveLog:
        if self._collectives is None:
            self._collectives = CollectiveLog(self.instrumentation)
            self._step_hooks = True  # its run-queue count starts at the next step
        log: CollectiveLog = self._collectives
        return log

    def fetch(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)``, its wait charged like one ``next()`` of ``timer.iter``: to
        the first ordered stage (the data stage) of the next step to begin. For loops that get
        a batch from a function, ``x, y = timer.fetch(get_batch, "train")``, before the step
        or at the end of the step before it. Inside an accumulation microstep
        (``timer.microstep(k)``), with no stage open, the wait is that microstep's own: loops
        that fetch the next microstep's batch between forward and backward see each
        microstep's wait in its own ``name[k]``. An exception from ``fn`` charges nothing."""
        if not self.enabled:
            return fn(*args, **kwargs)
        start = _now()
        item = fn(*args, **kwargs)
        self._charge_fetch(_now() - start)
        return item

    def _charge_fetch(self, elapsed: int) -> None:
        if self._in_microstep():  # this microstep's own wait, inside this step's wall time
            self._buf[self._base + 1] += elapsed
            return
        self._pending_data_ns += elapsed
        self._step_hooks = True
        if self._active is not OUTSIDE:  # fetched inside a step: not that step's time
            self._step_ctx._start += elapsed

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

    def pause(self) -> None:
        """Stop recording from the next step on, until ``resume()``: steps that begin while
        paused run untimed (their contexts do nothing and check nothing), count in the step
        index and in their window's span, and the window reports them as ``paused_ranges``
        (``paused_steps`` in rank 0's record). Windows end at the same step boundaries as if
        nothing was paused, so ranks that pause different steps stay aligned window by window
        (a window whose paused steps differ between ranks merges only the ranks that paused
        what rank 0 paused; see docs/integrations.md); a window paused through is not handed off.

        Call it between steps. Inside a step it is a contract violation (counted with the
        window, raised as ContractViolation when ``strict``) and is ignored. Pausing a paused
        timer does nothing. Use it for an A/B measurement of the timer's cost in one run, or to
        leave out an evaluation loop that uses ``timer.step()``."""
        if not self.enabled:
            return
        active = self._active
        if active is PAUSED or active is PAUSED_STEP:
            return
        if active is not OUTSIDE:
            self._violation("pause() inside a step: ignored (pause between steps)")
            return
        self._active = PAUSED
        self.stage = self._paused_stage  # type: ignore[method-assign,assignment]

    def resume(self) -> None:
        """Record again from the next step on (see ``pause``). Call it between steps; inside a
        paused step it is a contract violation and is ignored. Resuming a timer that is not
        paused does nothing."""
        if not self.enabled:
            return
        if self._active is PAUSED_STEP:
            self._violation("resume() inside a paused step: ignored (resume between steps)")
        elif self._active is PAUSED:
            self._active = OUTSIDE
            self.stage = self._recording_stage  # type: ignore[method-assign]

    def _resume_stages(self) -> None:
        self.stage = self._recording_stage  # type: ignore[method-assign]

    @property
    def paused(self) -> bool:
        """Whether the timer is paused."""
        return self.enabled and (self._active is PAUSED or self._active is PAUSED_STEP)

    def close(self) -> None:
        """Flush the last partial window and stop background work. Safe to call twice."""
        self._close(process_ends=False)

    def _close(self, process_ends: bool) -> None:
        """``close()``; ``process_ends``: the process is about to end by a signal and this runs
        on another thread than the training one (``on_sigterm``): a running capture is dropped
        without touching the profiler."""
        if self._closed:
            return
        self._closed = True
        deadline_s = close_deadline_s(logger)
        ends = time.monotonic() + deadline_s  # the one deadline, counted from the call
        closed(self)
        if self._out_dir_held is not None:
            release_out_dir(self._out_dir_held)
        if not self.enabled:
            if self._disabled_scope is not None:
                from ..collect.store import release_scope  # loaded by announce_disabled

                release_scope(self._disabled_scope)
            return
        try:
            if self._handing_off:  # a SIGTERM's close while the training thread hands off
                logger.warning(
                    "stagefrontier: rank %d's window being handed off as the process ends is "
                    "lost: its copy was half done, and a half copy would be a wrong window",
                    self.rank,
                )
            elif self._n:
                self._hand_off(self._n)
            self._say_paused_through()
        except Exception as exc:  # telemetry never fails the caller
            say_failed(logger, "flushing the last window", exc, "that window is lost")
        if self._dropped:  # no later window was queued to carry the count
            logger.warning(
                "stagefrontier: rank %d dropped its last %d window(s) (hand-off queue full); "
                "no window record reports them",
                self.rank,
                self._dropped,
            )
        if self._collector is not None:  # its last windows and the sinks' close, bounded
            bound = ends - router_close_s(deadline_s) - time.monotonic()
            call_within(self._collector.close, bound, "the collector", logger, deadline_s)
        if self._router is not None:  # its thread gets the rest
            rest = max(ends - FINISH_S - time.monotonic(), 0.0)
            self._router.close(rest, process_ends=process_ends)

    def __enter__(self) -> StageTimer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()

    @property
    def violations(self) -> int:
        """Contract violations counted in the open window."""
        return self._violations if self.enabled else 0

    def _disable(self) -> None:
        """Every context call answers the shared no-op through C-level callables only (a
        ``repeat(NOOP).__next__``, a ``defaultdict`` lookup): no Python frame besides the
        no-op's own enter and exit."""
        self.step = itertools.repeat(NOOP).__next__  # type: ignore[method-assign]
        self.stage = _noop_table().__getitem__  # type: ignore[method-assign,assignment]
        self.probe = _noop_table().__getitem__  # type: ignore[method-assign,assignment]
        self.microstep = _noop_table().__getitem__  # type: ignore[method-assign,assignment]


def calibration_timer(annotate: bool, window: int, collector: Collector) -> StageTimer:
    """The timer whose contexts the self-cost meter times (``record.self_cost``)."""
    config = TimerConfig(stages=("calibration",), window=window, annotate=annotate)
    return StageTimer(config=config, collector=collector)


def _noop_table() -> collections.defaultdict[Any, NoopContext]:
    """Any key -> the shared no-op, looked up in C (the key is stored on first use)."""
    return collections.defaultdict(itertools.repeat(NOOP).__next__)


def _null_event_sample(name: str = "") -> NoopContext:
    """``cuda_event_sample`` when sampling is off: no torch, no sampler call."""
    return NOOP
