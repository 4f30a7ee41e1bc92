"""Lightning callback: StageFrontier stage accounting with no change to the training code.

::

    from stagefrontier.integrations.lightning import StageFrontierCallback

    trainer = L.Trainer(callbacks=[StageFrontierCallback(window=100, out_dir="stagefrontier")])

Works with ``lightning.pytorch`` (the ``lightning`` package) and falls back to the standalone
``pytorch_lightning`` package. The timer is built in ``setup("fit")``, after Lightning has created
the process group, so under ``strategy="ddp"`` every rank's window reaches rank 0 through the
job's c10d store; rank 0 writes ``out_dir/windows.jsonl`` (plus packets and any extra ``sinks``).

Ordered stages and the hook boundaries that bound them (automatic optimization, one optimizer;
"first"/"last" is this callback's position, which it moves to the front of ``trainer.callbacks``
while a companion callback takes the end, so other callbacks' hooks fall between the two):

==================================  ===========================================================
stage                               from -> to
==================================  ===========================================================
``data.next_wait``                  end of the previous step (last ``on_train_batch_end``), or
                                    ``on_train_epoch_start`` / ``on_validation_end`` -> first
                                    ``on_train_batch_start``. Holds the DataLoader ``next()``,
                                    host->device transfer hooks (``batch_to_device``), and
                                    Lightning's per-batch bookkeeping around them: the
                                    module's ``on_train_batch_end``, logger writes
                                    (``log_metrics`` every ``log_every_n_steps``), plateau
                                    schedulers and, under DDP, Lightning's per-step SIGTERM
                                    broadcast.
``model.fwd_loss_cpu_wall``         first ``on_train_batch_start`` -> first
                                    ``on_before_backward``: other callbacks' and the module's
                                    ``on_train_batch_start``, ``training_step`` (forward + loss),
                                    ``on_before_zero_grad`` and ``zero_grad`` (Lightning zeroes
                                    gradients between the loss and backward), DDP's
                                    pre-backward preparation.
``model.backward_cpu_wall``         first ``on_before_backward`` -> first ``on_after_backward``:
                                    the other ``on_before_backward`` hooks and the autograd
                                    backward, DDP's gradient all-reduce included.
``callbacks.cpu_wall``              first ``on_after_backward`` -> last callback's
                                    ``on_before_optimizer_step``: every ``on_after_backward``
                                    hook, DDP's post-backward, callbacks'
                                    ``on_before_optimizer_step`` (e.g. gradient-norm logging).
``optim.step_cpu_wall``             last callback's ``on_before_optimizer_step`` -> first
                                    ``on_train_batch_end``: the module's
                                    ``on_before_optimizer_step``, gradient clipping,
                                    ``optimizer.step``, step-interval LR schedulers.
``callbacks.batch_end_cpu_wall``    first -> last ``on_train_batch_end``: every callback's
                                    batch-end hook (progress bar, checkpointing, EMA, ...).
``step.other_cpu_wall`` (residual)  whatever the step wall time holds beyond the stages above
                                    (next to nothing: the step closes at the last
                                    ``on_train_batch_end``).
==================================  ===========================================================

Lumped, unavoidably with callback hooks: the module's own ``on_train_batch_end`` and Lightning's
logging after the last callback land in the next step's data wait (there is no hook between them
and the next fetch); gradient clipping sits in the optimizer stage. Validation (between
``on_validation_start`` and ``on_validation_end``) and the time between epochs are not counted at
all, except validation that interrupts an accumulation window (it then sits in the next
micro-batch's data wait).

Gradient accumulation (``accumulate_grad_batches=k``): one timer step per optimizer step, and
micro-batch ``i`` is ``timer.microstep(i)``; its data wait runs from the previous micro-batch's
last ``on_train_batch_end``. Manual optimization works when each batch runs one backward and one
optimizer step; a second backward or optimizer step in a batch is counted as a contract
violation (``telemetry_limited``), never raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..analysis.schema import (
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
)
from ..analysis.schema import RESIDUAL_STAGE as _RESIDUAL
from ..errors import MissingExtraError
from ..extras import require
from ..failures import say_failed
from ..record.recorder import StageTimer
from ..route.router import ProfilerRouter
from ..sinks import Sink
from ._timer import HookClock, TimerArguments

logger = logging.getLogger("stagefrontier")

try:
    _pl: Any = require("lightning.pytorch", "lightning", "StageFrontierCallback (Lightning)")
except MissingExtraError:
    _pl = require("pytorch_lightning", "lightning", "StageFrontierCallback (Lightning)")

BATCH_END_STAGE = "callbacks.batch_end_cpu_wall"
LIGHTNING_STAGES: tuple[str, ...] = (
    DATA_STAGE,
    FORWARD_STAGE,
    BACKWARD_STAGE,
    CALLBACKS_STAGE,
    OPTIMIZER_STAGE,
    BATCH_END_STAGE,
    _RESIDUAL,
)
"""The ordered schema of the Lightning callback, in Lightning's execution order."""


class StageFrontierCallback(_pl.Callback):  # type: ignore[misc]
    """Times Lightning's training steps as StageFrontier's ordered stages (see the module doc).

    ``sinks`` (extra sinks for rank 0's windows), ``router`` (a ``ProfilerRouter``, off when
    None) and ``**timer_kwargs`` (``config=TimerConfig(...)``, or its flat settings ``window``,
    ``out_dir``, ...) are the timer's, built in ``setup("fit")`` (see
    ``integrations._timer.TimerArguments``); ``stages`` is fixed by the hook mapping and cannot
    be given.
    """

    def __init__(
        self,
        *,
        sinks: Sequence[Sink] = (),
        router: ProfilerRouter | None = None,
        **timer_kwargs: Any,
    ) -> None:
        super().__init__()
        self.arguments = TimerArguments("Lightning's", sinks, router, timer_kwargs)
        self.timer: StageTimer | None = None
        self._clock: HookClock | None = None
        self._tail = _BatchEndTail(self)
        self._accumulate = 1
        self._stepped = False

    # ------------------------------------------------------------------ life cycle
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.timer is not None:
            return
        callbacks = trainer.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        if self._tail not in callbacks:
            callbacks.append(self._tail)
        self._accumulate = max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        self.timer = self.arguments.make_timer(LIGHTNING_STAGES)
        self._clock = HookClock(self.timer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        self._close(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close(trainer)

    def _close(self, trainer: Any) -> None:
        clock, self._clock = self._clock, None
        if clock is not None and clock.step_open:
            clock.end_step()
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.close()
        callbacks = getattr(trainer, "callbacks", [])
        if self._tail in callbacks:
            callbacks.remove(self._tail)

    # ------------------------------------------------------------------ between steps
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self._clock is not None:
            fresh = _fresh_fit(trainer)
            if self._clock.watch(getattr(trainer, "train_dataloader", None), fresh) and fresh:
                _restart_first_epoch(trainer)
            self._clock.mark()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._clock is not None:
            self._clock.mark()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._clock is not None:
            self._clock.mark()  # no effect inside an open (accumulating) step

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._clock is not None and self._clock.step_open:
            self._clock.end_step()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.on_train_epoch_end(trainer, pl_module)

    # ------------------------------------------------------------------ inside a step
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        clock = self._clock
        if clock is None:
            return
        clock.took(1)
        if clock.step_open and self._accumulate > 1:
            clock.switch(FORWARD_STAGE)  # micro-batch i > 0: its data wait is closing
        else:
            self._stepped = False
            clock.begin_step(FORWARD_STAGE, microsteps=self._accumulate > 1)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._clock is not None:
            self._clock.switch(BACKWARD_STAGE)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self._clock is not None:
            self._clock.switch(CALLBACKS_STAGE)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._clock is not None:
            self._clock.switch(BATCH_END_STAGE)

    # the tail's hooks (after every other callback's)
    def _tail_before_optimizer_step(self) -> None:
        if self._clock is not None:
            self._stepped = True
            self._clock.switch(OPTIMIZER_STAGE)

    def _tail_batch_end(self) -> None:
        clock = self._clock
        if clock is None:
            return
        if self._accumulate > 1 and not self._stepped and clock.step_open:
            clock.microstep(clock.microstep_index + 1, DATA_STAGE)  # more micro-batches to come
        else:
            clock.end_step()


def _fresh_fit(trainer: Any) -> bool:
    """Whether the fit loop starts its first epoch from the beginning (not resumed from a
    checkpoint, whose iterator holds the restored position) on a Lightning whose fit loop has
    the data fetcher ``_restart_first_epoch`` asks."""
    loop = getattr(trainer, "fit_loop", None)
    return (
        getattr(loop, "_data_fetcher", None) is not None
        and not getattr(loop, "restarting", True)
        and not getattr(loop, "is_resuming", True)
    )


def _restart_first_epoch(trainer: Any) -> None:
    """Lightning's fit loop makes the first epoch's DataLoader iterator, and so starts its
    workers, before any callback hook sees the loader; every later epoch gets a new one. Ask the
    fit loop's data fetcher for that new iterator now (what it does itself at each later epoch),
    so the first epoch's workers run the timer's hook too (persistent workers were shut down
    for it by ``HookClock.watch``). Only for a fresh fit (``_fresh_fit``): otherwise the
    figures start with the next epoch, or, for persistent workers, are not taken."""
    try:
        iter(trainer.fit_loop._data_fetcher)
    except Exception as exc:
        say_failed(
            logger,
            "restarting the first epoch's DataLoader workers",
            exc,
            "worker figures start with the next epoch",
        )


class _BatchEndTail(_pl.Callback):  # type: ignore[misc]
    """Placed last in ``trainer.callbacks`` by StageFrontierCallback: bounds the other callbacks'
    ``on_before_optimizer_step`` and ``on_train_batch_end`` hooks from after."""

    def __init__(self, head: StageFrontierCallback) -> None:
        super().__init__()
        self._head = head

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._head._tail_before_optimizer_step()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._head._tail_batch_end()


__all__ = ["BATCH_END_STAGE", "LIGHTNING_STAGES", "StageFrontierCallback"]
