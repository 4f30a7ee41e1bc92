"""Building a StageTimer with extra sinks, and driving it from a framework's hooks.

Frameworks call a callback at points *between* the stages a loop would wrap in ``with`` blocks,
so the integrations do not use context managers: :class:`HookClock` closes the open stage and
opens the next one at each hook boundary, and charges the data wait measured between two hooks
(the end of one step and the start of the next) to the next step, like ``timer.iter`` does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..analysis.schema import DEFAULT_STAGES
from ..errors import StageFrontierError
from ..failures import say_failed
from ..record.config import TimerConfig, config_from_keywords
from ..record.loader_workers import restart_persistent_workers
from ..record.recorder import StageTimer
from ..route.router import ProfilerRouter
from ..sinks import Sink
from ._fetches import FetchTimes

logger = logging.getLogger("stagefrontier")
_now = time.perf_counter_ns


def make_timer(
    stages: Sequence[str] | None = None,
    *,
    sinks: Sequence[Sink] = (),
    router: ProfilerRouter | None = None,
    **timer_kwargs: Any,
) -> StageTimer:
    """A StageTimer over ``stages`` whose rank-0 analysis also writes to ``sinks``, its
    :class:`~stagefrontier.TimerConfig` built here from ``timer_kwargs``: either
    ``config=TimerConfig(...)`` or the timer's flat settings (``window``, ``out_dir``,
    ``collect``, ...; see ``record.config.DEPRECATED``), plus ``collector=`` if any.

    The default sinks stay: ``windows.jsonl`` and the log line (plus evidence packets under
    distributed collection); ``sinks`` are added after the config's own, and rank 0's collector
    starts and closes them. ``router``: the profiler router (the config's when None). With
    ``collector=...`` given, ``sinks`` must be empty: pass them to that collector instead.
    """
    kwargs = dict(timer_kwargs)
    collector = kwargs.pop("collector", None)
    config = kwargs.pop("config", None)
    if sinks and collector is not None:
        raise StageFrontierError("give sinks to the collector you pass, not to make_timer")
    if config is None:
        config = config_from_keywords(kwargs)
    elif kwargs or not isinstance(config, TimerConfig):
        raise StageFrontierError(
            "give the timer's settings as config=TimerConfig(...) or as keywords, not both"
        )
    collection = replace(config.collection, sinks=(*config.collection.sinks, *sinks))
    config = replace(
        config,
        stages=DEFAULT_STAGES if stages is None else tuple(stages),
        collection=collection,
        router=config.router if router is None else router,
    )
    return StageTimer(config=config, collector=collector)


class TimerArguments:
    """What a framework callback is given for the timer it builds once training starts.

    ``sinks``: extra sinks for rank 0's analyzed windows (TensorBoard, Prometheus, W&B, CSV), in
    addition to ``windows.jsonl``, the log line and the evidence packets. ``router``: a
    :class:`stagefrontier.ProfilerRouter`: an actionable window captures a profiler trace of the
    suspect rank and a reference rank (off when None). ``timer_kwargs``: the timer's settings,
    as ``config=TimerConfig(...)`` or as its flat fields (``window``, ``out_dir``, ``collect``,
    ``collect_timeout_s``, ``gates``, ``log``, ``enabled``, ``role``, ...), all but ``stages``,
    which the callback's hooks fix (``whose``: whose stages they are, for the error saying so).
    """

    def __init__(
        self,
        whose: str,
        sinks: Sequence[Sink],
        router: ProfilerRouter | None,
        timer_kwargs: dict[str, Any],
    ) -> None:
        if "stages" in timer_kwargs:
            raise StageFrontierError(
                f"StageFrontierCallback times {whose} own stages; 'stages' cannot be given"
            )
        self.sinks = list(sinks)
        self.router = router
        self.timer_kwargs = timer_kwargs

    def make_timer(self, stages: Sequence[str]) -> StageTimer:
        """The callback's timer over ``stages`` (see :func:`make_timer`)."""
        return make_timer(stages, sinks=self.sinks, router=self.router, **self.timer_kwargs)


def charge_data_wait(timer: StageTimer, wait_ns: int) -> None:
    """Charge a data wait measured between steps to the next step to begin: it becomes that
    step's first ordered stage and the step's start moves back over it (``timer.iter``'s
    mechanism, through ``StageTimer.charge_data_wait``)."""
    if wait_ns > 0:
        timer.charge_data_wait(wait_ns)


def train_loader(data: Any) -> Any:
    """The DataLoader in what a framework hands its callbacks: a ``DataLoader``, the one an
    Accelerate wrapper holds (``base_dataloader``: its workers are that loader's), or the first
    DataLoader in a list, tuple or mapping of them (Lightning's ``trainer.train_dataloader`` with
    several loaders). Anything else is returned as it is (the timer notes what it is)."""
    base = getattr(data, "base_dataloader", None)
    if base is not None:
        return base
    if isinstance(data, Mapping):
        items: list[Any] = list(data.values())
    elif isinstance(data, list | tuple):
        items = list(data)
    else:
        return data
    found = [train_loader(item) for item in items]
    return next((f for f in found if hasattr(f, "num_workers")), found[0] if found else None)


class HookClock:
    """Opens and closes a StageTimer's step, microsteps and stages at hook boundaries.

    ``mark()`` records the earliest moment the next step's data wait may start (the end of the
    previous step, or the end of validation or of an epoch boundary); ``begin_step()`` charges
    the time since the mark to the data stage and opens the step. Every method is cheap and
    never raises: a failure is logged once and the clock stops driving the timer.
    """

    __slots__ = (
        "_broken",
        "_fetches",
        "_loader",
        "_mark",
        "_micro",
        "_stage",
        "_step",
        "_timer",
        "microstep_index",
    )

    def __init__(self, timer: StageTimer) -> None:
        self._timer = timer
        self._step: Any = None  # the open step context, or None
        self._micro: Any = None  # the open microstep context, or None
        self._stage: Any = None  # the open stage context, or None
        self._mark: int | None = None
        self._broken = False
        self._loader: Any = None  # the watched DataLoader's counters, or None
        self._fetches: FetchTimes | None = None  # see time_fetches
        self.microstep_index = -1

    @property
    def timer(self) -> StageTimer:
        return self._timer

    @property
    def step_open(self) -> bool:
        return self._step is not None

    def watch(self, data: Any, restart_persistent: bool = False) -> bool:
        """Time the workers of the DataLoader in ``data`` (what the framework hands its
        callbacks, see ``train_loader``); True when they are watched. Call it before the
        workers start: workers already running are not timed, except persistent ones when
        ``restart_persistent`` is set by a caller that restarts the epoch right after (they
        are shut down here, and the epoch's new workers are timed)."""
        if self._broken or data is None:
            return False
        try:
            loader = train_loader(data)
            if restart_persistent and self._timer.enabled:
                restart_persistent_workers(loader)
            self._loader = self._timer.watch_dataloader(loader)
        except Exception as exc:  # the loop runs on without worker figures
            say_failed(logger, "watching the training DataLoader", exc, "no worker figures")
            self._loader = None
        return self._loader is not None

    def time_fetches(self, data: Any) -> bool:
        """Charge as the data wait only the time inside the fetches of the DataLoader in
        ``data`` (see ``_fetches``), not all the time between two steps: for a framework that
        does more there than fetch, such as a collective every rank waits in for the slowest.
        True when its fetches are timed; otherwise the whole gap is charged, as before."""
        if self._broken or data is None or not self._timer.enabled:
            return False
        fetches = FetchTimes(self._timer.instrumentation)
        try:
            timed = fetches.watch(train_loader(data))
        except Exception as exc:
            doing = "timing the training DataLoader's fetches"
            say_failed(logger, doing, exc, "all the time between steps is the data wait")
            timed = False
        self._fetches = fetches if timed else None
        return timed

    def took(self, batches: int) -> None:
        """The loop took ``batches`` batches from the watched loader."""
        if self._loader is not None:
            self._loader.consumed += batches

    def mark(self) -> None:
        """The next step's data wait starts now (unless a step is open)."""
        if self._step is None:
            self._mark = _now()
            if self._fetches is not None:
                self._fetches.take()  # count this wait's fetches only (each its own range)
                return
            try:  # while the router captures, the wait is a profiler range too
                self._timer.instrumentation.open_wait_gap()
            except Exception as exc:
                self._fail(exc)

    def begin_step(self, stage: str | None = None, *, microsteps: bool = False) -> None:
        """Open a step whose data wait ran from the last mark to now; then ``stage``."""
        if self._broken:
            return
        try:
            if self._step is not None:
                self.end_step()
            mark, self._mark = self._mark, None
            if mark is not None:
                fetches = self._fetches
                wait = _now() - mark if fetches is None else fetches.take()
                charge_data_wait(self._timer, wait)
            self._timer.instrumentation.close_wait_gap()
            step = self._timer.step()
            step.__enter__()
            self._step = step
            self.microstep_index = -1
            if microsteps:
                self.microstep(0)
            if stage is not None:
                self.switch(stage)
        except Exception as exc:
            self._fail(exc)

    def switch(self, stage: str) -> None:
        """Close the open stage and open ``stage`` (inside a step only)."""
        if self._broken or self._step is None:
            return
        try:
            self._close_stage()
            ctx = self._timer.stage(stage)
            ctx.__enter__()
            self._stage = ctx
        except Exception as exc:
            self._fail(exc)

    def microstep(self, index: int, stage: str | None = None) -> None:
        """Close the open stage and microstep, open microstep ``index``, then ``stage``."""
        if self._broken or self._step is None:
            return
        try:
            self._close_stage()
            self._close_micro()
            ctx = self._timer.microstep(index)
            ctx.__enter__()
            self._micro = ctx
            self.microstep_index = index
            if stage is not None:
                self.switch(stage)
        except Exception as exc:
            self._fail(exc)

    def end_step(self) -> None:
        """Close everything open and mark the start of the next data wait."""
        if self._broken:
            return
        try:
            self._close_stage()
            self._close_micro()
            step, self._step = self._step, None
            if step is not None:
                step.__exit__(None, None, None)
            self.microstep_index = -1
            self.mark()
        except Exception as exc:
            self._fail(exc)

    def _close_stage(self) -> None:
        ctx, self._stage = self._stage, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def _close_micro(self) -> None:
        ctx, self._micro = self._micro, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def _fail(self, exc: BaseException) -> None:
        self._broken = True
        say_failed(logger, "driving the timer from hooks", exc, "timing stops here")
