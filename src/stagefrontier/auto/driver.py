"""``AutoDriver``: drives a StageTimer from PyTorch's hooks, for a training script left as it is.

The driver watches the first optimizer step without timing it, to learn the loop's shape: which
optimizer steps, how many backward calls run per step (more than one: gradient accumulation,
timed as microsteps), and which module is the model: of the modules called in training mode with
gradients on while no other module runs (the DDP or FSDP wrapper, or the plain model, and maybe
an augmentation module before it), the first that holds a parameter the optimizer steps.
From the second step on it times, entering and leaving the timer's public contexts
(``timer.step()``, ``timer.microstep(i)``, ``timer.stage(name)``, ``timer.fetch``) at each hook:

- ``data.next_wait``: each ``next()`` of a DataLoader iterator, timed in its ``__next__`` (through
  ``timer.fetch`` while a capture records profiler ranges; charged to the step that consumes the
  batch; with accumulation, a fetch after a backward opens the next microstep and is its own);
- ``model.fwd_loss_cpu_wall``: the model's forward (``auto.model.ModelForward``) -> the backward;
- ``model.backward_cpu_wall``: the backward call, start to return;
- ``optim.step_cpu_wall``: the optimizer's step pre-hook -> its post-hook, which ends the step;
- ``step.other_cpu_wall``: the rest of the step (device transfer, clipping, logging).

A loop that does not fit is said in one line on rank 0 and left untimed, or timed with what
the line names as lumped: two optimizers, no optimizer step, no backward call seen. Every method
here runs in the training loop: it never raises (a failure is said once and timing stops).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ..analysis.schema import (
    BACKWARD_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
)
from ..failures import say_failed
from ..integrations._timer import TimerArguments
from ..record.instrumentation import Instrumentation
from ..record.recorder import StageTimer
from .fetch import timed_fetch
from .model import ForwardPatch, module_state, stepped_module, watch_collectives
from .patches import Patches

logger = logging.getLogger("stagefrontier")

AUTO_STAGES = (DATA_STAGE, FORWARD_STAGE, BACKWARD_STAGE, OPTIMIZER_STAGE, RESIDUAL_STAGE)
"""The ordered schema of the automatic hooks."""

LEARN, TIME, OFF = "learn", "time", "off"
MAX_CANDIDATES = 8
"""Distinct outermost modules kept while learning, as candidates for the model."""
LEARN_CALLS = 1000
"""Outermost module calls with no optimizer step after which the hooks stop waiting for one
(no real loop accumulates that many micro-batches into its first step)."""


def say(message: str) -> None:
    """One line on rank 0 (every rank finds the same, so one says it)."""
    if os.environ.get("RANK", "0") == "0":
        logger.warning("stagefrontier: %s", message)


class AutoDriver:
    """The state of the automatic hooks in one worker process (see the module doc). Its fields
    are slots: the hooks read and write a dozen of them every step."""

    __slots__ = (  # noqa: SIM905 (a list of 33 names, one a line, would be as long again)
        "_after_backward _arguments _called _calls _charge_fetch _counters _depth _fetched_from "
        "_forwards _grad_on _handles _in_backward _in_optimizer _instrumentation "
        "_learn_backwards _learn_handles _loader _micro _micro_index _new_step _open _open_name "
        "_optimizer _patches _stage_of _step _stepped _torch accumulate framework model phase "
        "timer"
    ).split()

    def __init__(self, arguments: TimerArguments) -> None:
        import torch

        self._arguments = arguments
        self._grad_on: Callable[[], bool] = torch.is_grad_enabled
        self._torch = torch
        self.phase = LEARN
        self.framework: str | None = None  # a framework whose callback took over
        self.timer: StageTimer | None = None
        # the timer's, kept when it is built (read in the hooks with no property in between)
        self._instrumentation: Instrumentation
        self._charge_fetch: Callable[[int], None]
        self._new_step: Callable[[], Any]  # its ``step`` and ``stage``
        self._stage_of: Callable[[str], Any]
        self._patches = Patches(self)
        self._handles: list[Any] = []
        self._learn_handles: list[Any] = []
        # what the first step shows
        self._depth = 0
        self.model: Any = None
        self._called: list[Any] = []  # the outermost modules called in training mode
        self._stepped: list[Any] = []  # the optimizers that stepped, in order
        self._learn_backwards = 0
        self._forwards = 0
        self._calls = 0  # outermost module calls while learning, in any mode
        # while timing
        self._optimizer: Any = None
        self.accumulate = False
        self._in_optimizer: Any = None  # the optimizer whose step is running
        self._in_backward = False
        self._after_backward = False
        self._step: Any = None  # the open step context, or None
        self._micro: Any = None  # the open microstep context, or None
        self._micro_index = -1
        self._open: Any = None  # the open stage context, or None
        self._open_name = ""
        self._loader: Any = None  # the training DataLoader, once known
        self._counters: Any = None  # its worker counters, when watched
        self._fetched_from: Any = None  # the loader of the last batch fetched

    # ------------------------------------------------------------------ set up and tear down
    def install(self) -> None:
        from torch.nn.modules import module
        from torch.optim import optimizer

        self._patches.install()
        self._handles += [
            optimizer.register_optimizer_step_pre_hook(self._optimizer_begins),
            optimizer.register_optimizer_step_post_hook(self._optimizer_ends),
        ]
        self._learn_handles += [
            module.register_module_forward_pre_hook(self._learn_forward),
            module.register_module_forward_hook(self._learn_forward_done, always_call=True),
        ]

    def hand_over(self, framework: str) -> None:
        """A framework's own callback times the run instead: stop, keep nothing open."""
        if self.framework is None:
            self.framework = framework
            say(f"{framework} Trainer found: its StageFrontierCallback times the run")
        self.stop()

    def stop(self) -> None:
        """Remove every hook and close the timer (its last window is written)."""
        self.phase = OFF
        for handle in self._handles + self._learn_handles:
            handle.remove()
        self._handles, self._learn_handles = [], []
        self._patches.remove()
        self.close()

    def close(self) -> None:
        """End the open step and close the timer; safe to call twice."""
        if self.phase == LEARN and self._forwards and not self._stepped:
            say(
                f"{self._forwards} training forward call(s) and no optimizer step: nothing was "
                "timed (a loop that updates its parameters without optimizer.step() needs "
                "timer.step() and timer.stage() by hand)"
            )
        if self._step is not None:
            self._end_step()
        timer, self.timer = self.timer, None
        if timer is not None:
            try:
                timer.close()
            except Exception as exc:
                say_failed(logger, "closing the automatic timer", exc, "its last window is lost")

    def closing(self) -> None:
        """The process group is about to go: close the timer while its store still works (the
        hooks go too: nothing is timed without the store)."""
        self.stop()

    # ------------------------------------------------------------------ the first step
    def _learn_forward(self, module: Any, args: Any) -> None:
        depth, self._depth = self._depth, self._depth + 1
        if depth:
            return
        self._calls += 1
        if self._calls > LEARN_CALLS and not self._stepped:
            self._give_up_learning()
            return
        if not module.training or not self._grad_on():
            return
        self._forwards += 1
        if self._stepped:
            self._start_timing()
            if self.phase == TIME and module is self.model:
                self._forward()  # its timed forward starts with its next call
        elif len(self._called) < MAX_CANDIDATES and all(m is not module for m in self._called):
            self._called.append(module)

    def _give_up_learning(self) -> None:
        """No optimizer step after ``LEARN_CALLS`` outermost module calls: say so, and take the
        global module hooks away (they slow every module call while they are installed)."""
        if self._forwards:
            self.close()  # says what was seen
        else:
            say(
                f"{LEARN_CALLS} calls of the outermost module and no training step (an "
                "evaluation-only script?): nothing was timed"
            )
        self.stop()

    def _learn_forward_done(self, module: Any, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def _start_timing(self) -> None:
        """The second step begins: judge what the first showed, build the timer, time."""
        for handle in self._learn_handles:
            handle.remove()
        self._learn_handles = []
        optimizers = list({id(o): o for o in self._stepped}.values())
        if len(optimizers) > 1:
            self._not_one_optimizer(optimizers)
            return
        self._optimizer = optimizers[0]
        if self._learn_backwards == 0:
            say(
                "no backward call seen in the first step (a custom backward?): the forward "
                "stage also holds the backward (wrap it in timer.stage('model.backward_cpu_wall') "
                "by hand to split them)"
            )
        self.model = stepped_module(self._called, self._optimizer)
        self._called = []
        if self.model is None:
            say(
                "no module called in training mode in the first step holds the parameters the "
                "optimizer steps: the forward counts in the residual"
            )
        else:
            self._handles.append(ForwardPatch(self.model, self.timed_forward))
        self.accumulate = self._learn_backwards > 1
        if self._ensure_timer():
            self.phase = TIME
            watch_collectives(self.timer, self.model, self._optimizer)

    def _not_one_optimizer(self, optimizers: list[Any]) -> None:
        names = ", ".join(type(o).__name__ for o in optimizers)
        say(
            f"{len(optimizers)} optimizers step in one training loop ({names}): the automatic "
            f"hooks cannot tell which step each stage belongs to, so timing stops here; time "
            "the loop by hand with timer.step() and timer.stage()"
        )
        self.stop()

    def _ensure_timer(self) -> bool:
        if self.timer is not None:
            return True
        try:
            timer = self.timer = self._arguments.make_timer(AUTO_STAGES)
        except Exception as exc:
            say_failed(logger, "building the automatic timer", exc, "the run is not timed")
            self.stop()
            return False
        if not timer.enabled:  # turned off in its settings: nothing to time
            self.stop()
            return False
        self._instrumentation = timer.instrumentation
        self._charge_fetch = timer.instrumentation.charge_fetch
        self._new_step, self._stage_of = timer.step, timer.stage  # a context sees a pause
        if self._loader is not None:
            self._watch(self._loader)
        return True

    # ------------------------------------------------------------------ the hooks
    # Each runs once a step, the common case first with the fewest tests and calls: contexts
    # entered and left here, not in helpers (each Python call costs); rare cases go to helpers.
    # A context's ``__enter__`` and ``__exit__`` are read into a local and then called: written
    # ``ctx.__enter__()``, the call goes through the interpreter's generic method lookup (a slot
    # is not a method it can cache), about three times the read and the call. The timer's
    # ``step`` and ``stage`` (instance attributes shadowing methods: no read of them is
    # specialized either) are kept in the driver's slots.
    def timed_forward(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """The model's forward while timing (``ModelForward``'s call): ``inner``, the model's own
        forward, after the step's first forward opens the step and the forward stage (the
        common case, inline); any other training forward goes to ``_forward``. A model called
        with one positional argument and no keywords gets it passed on as a plain call."""
        driver, grad_on, state = self, self._grad_on, module_state(self.model)

        def forward(*args: Any, **kwargs: Any) -> Any:
            if (
                driver._step is None
                and driver._fetched_from is driver._loader
                and not driver.accumulate
                and state["training"]
                and grad_on()
            ):
                try:  # _begin_step's common case; no stage is open between steps
                    new_step = driver._new_step
                    step = driver._step = new_step()
                    enter = step.__enter__
                    enter()
                    stage_of = driver._stage_of
                    stage = driver._open = stage_of(FORWARD_STAGE)
                    driver._open_name = FORWARD_STAGE
                    enter = stage.__enter__
                    enter()
                except Exception as exc:
                    driver._fail(exc)
            elif state["training"] and grad_on():
                driver._forward()
            if kwargs or len(args) != 1:
                return inner(*args, **kwargs)
            # the common ``model(batch)``: a plain call, which the interpreter makes without
            # leaving its loop, where ``inner(*args, **kwargs)`` builds a dict and goes through C
            return inner(args[0])

        return forward

    def _forward(self) -> None:
        """A training forward of the model that is not the common case: the step's first with
        another loader or with accumulation, a microstep's, or a second in one stage."""
        try:
            if self._step is None:
                self._begin_step()
            elif self._after_backward:
                self._after_backward = False
                if self.accumulate:
                    self._next_microstep()
            elif self._open_name is FORWARD_STAGE:
                return  # the model called twice in one forward stage
            self._close_open()
            stage = self._open = self._stage_of(FORWARD_STAGE)
            self._open_name = FORWARD_STAGE
            stage.__enter__()
        except Exception as exc:
            self._fail(exc)

    def timed_backward(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.autograd.backward`` while hooked: ``call`` (the original) in the backward
        stage, its parameters spelt out (``patches.BACKWARD_PARAMETERS``)."""
        driver = self

        def backward(
            tensors: Any,
            grad_tensors: Any = None,
            retain_graph: Any = None,
            create_graph: Any = False,
            grad_variables: Any = None,
            inputs: Any = None,
        ) -> Any:
            if driver._step is None or driver._in_backward:
                if driver.phase is LEARN and not driver._in_backward:
                    driver._learn_backwards += 1
                return call(
                    tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs
                )
            driver._in_backward = True
            try:
                opened = driver._open
                if opened is not None:
                    leave = opened.__exit__
                    leave(None, None, None)
                stage_of = driver._stage_of
                stage = driver._open = stage_of(BACKWARD_STAGE)
                driver._open_name = BACKWARD_STAGE
                enter = stage.__enter__
                enter()
            except Exception as exc:
                driver._fail(exc)
            try:
                return call(
                    tensors, grad_tensors, retain_graph, create_graph, grad_variables, inputs
                )
            finally:
                driver._in_backward = False
                if driver._open_name is BACKWARD_STAGE:
                    opened, driver._open = driver._open, None
                    driver._open_name = ""
                    driver._after_backward = True
                    try:
                        leave = opened.__exit__
                        leave(None, None, None)
                    except Exception as exc:
                        driver._fail(exc)

        return backward

    def _optimizer_begins(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._in_optimizer is not None or self.phase is not TIME:
            if self.phase is LEARN and self._in_optimizer is None:
                self._in_optimizer = optimizer  # the first step: what steps is noted at its end
            return
        self._in_optimizer = optimizer
        if optimizer is not self._optimizer:
            self._not_one_optimizer([self._optimizer, optimizer])
            return
        try:
            if self._step is None:
                self._begin_step()  # no forward of the model in this step
            opened = self._open
            if opened is not None:
                leave = opened.__exit__
                leave(None, None, None)
            stage_of = self._stage_of
            stage = self._open = stage_of(OPTIMIZER_STAGE)
            self._open_name = OPTIMIZER_STAGE
            enter = stage.__enter__
            enter()
        except Exception as exc:
            self._fail(exc)

    def _optimizer_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if optimizer is not self._in_optimizer:
            return  # an optimizer stepping inside the one being timed (ZeRO-1's local one)
        self._in_optimizer = None
        step = self._step
        if step is None:
            if self.phase is LEARN and optimizer is not None:
                self._stepped.append(optimizer)
            return
        try:
            opened, self._open = self._open, None
            self._open_name = ""
            if opened is not None:
                leave = opened.__exit__
                leave(None, None, None)
            if self._micro is not None:
                self._end_microstep()
            self._step = None
            self._after_backward = False
            leave = step.__exit__
            leave(None, None, None)
        except Exception as exc:
            self._fail(exc)

    # ------------------------------------------------------------------ the timer's contexts
    def _begin_step(self) -> None:
        """Open the step (and its first microstep); no stage is open after it."""
        fetched = self._fetched_from
        if fetched is not None and fetched is not self._loader:
            self._loader = fetched  # the loop trains on another loader (a new epoch's)
            self._watch(fetched)
        step = self._step = self._new_step()
        step.__enter__()
        self._after_backward = False
        if self.accumulate:
            self._micro_index = -1
            self._next_microstep()

    def _next_microstep(self) -> None:
        """Close the open stage and microstep; open the next microstep, no stage in it."""
        self._close_open()
        self._end_microstep()
        self._micro_index += 1
        micro = self._micro = self.timer.microstep(self._micro_index)  # type: ignore[union-attr]
        micro.__enter__()

    def _end_microstep(self) -> None:
        micro, self._micro = self._micro, None
        if micro is not None:
            micro.__exit__(None, None, None)

    def _end_step(self) -> None:
        self._close_open()
        self._end_microstep()
        step, self._step = self._step, None
        self._after_backward = False
        if step is not None:
            step.__exit__(None, None, None)

    def _close_open(self) -> None:
        opened, self._open = self._open, None
        self._open_name = ""
        if opened is not None:
            opened.__exit__(None, None, None)

    def _fail(self, exc: BaseException) -> None:
        say_failed(logger, "driving the timer from the automatic hooks", exc, "timing stops")
        self._step = self._micro = self._open = None
        self.stop()

    # ------------------------------------------------------------------ the data
    def loader_starts(self, loader: Any) -> None:
        """A DataLoader starts an epoch: watch its workers when it is the training loader."""
        if self.phase == OFF or not self._grad_on():
            return
        if self._loader is None:
            self._loader = loader
        if loader is not self._loader:
            return
        dist, alone = self._torch.distributed, int(os.environ.get("WORLD_SIZE", "1")) <= 1
        if self.timer is None and (alone or (dist.is_available() and dist.is_initialized())):
            self._ensure_timer()
        elif self.timer is not None:
            self._watch(loader)

    def _watch(self, loader: Any) -> None:
        timer = self.timer
        if timer is not None and hasattr(loader, "num_workers"):
            self._counters = timer.watch_dataloader(loader)

    def fetcher(self, next_batch: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """The DataLoader iterators' ``__next__`` while the hooks are installed (``fetch``)."""
        return timed_fetch(self, next_batch, TIME)

    def _timing_starts(self) -> bool:
        """A fetch while not timing: the first fetch after the first optimizer step starts
        the timing; whether it did (the fetch is then timed)."""
        if self.phase == LEARN and self._stepped and self._grad_on():
            self._start_timing()
            return self.phase == TIME
        return False
