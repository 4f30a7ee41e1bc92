"""Hugging Face ``Trainer`` callback: StageFrontier stage accounting from the Trainer's hooks.

::

    from stagefrontier.integrations.transformers import StageFrontierCallback

    trainer = Trainer(model, args, train_dataset=ds,
                      callbacks=[StageFrontierCallback(window=100, out_dir="stagefrontier")])

The timer is built in ``on_train_begin``, after the Trainer (Accelerate) has set up the process
group, so under ``torchrun`` every rank's window reaches rank 0 through the job's c10d store.

The Trainer has no hook between forward and backward: both run inside ``training_step``. With
``split_forward=True`` (the default) the callback registers a forward hook on the model it is
handed (``register_forward_hook``, no wrapper, removed at ``on_train_end``): the first return of
the model's ``forward`` in each micro-batch closes the forward stage. With ``split_forward=False``
the two are one stage, ``model.fwd_bwd_cpu_wall``.

Ordered stages and their boundaries (``on_*`` are this callback's hooks; the Trainer calls
callbacks in list order: its defaults, the reporting integrations, then yours):

=====================================  ========================================================
stage                                  from -> to
=====================================  ========================================================
``data.next_wait``                     the time inside the training DataLoader's fetches
                                       between the end of the previous step (see the last
                                       row), or ``on_train_begin`` / ``on_epoch_begin`` /
                                       ``on_evaluate`` / ``on_save``, and ``on_step_begin``:
                                       the Trainer fetches every micro-batch of the optimizer
                                       step there (``get_batch_samples``). It then counts the
                                       step's label tokens, a cross-rank gather with
                                       ``average_tokens_across_devices`` where every rank waits
                                       for the slowest fetch: not counted (a loader that is not
                                       a torch ``DataLoader``: the whole time is counted).
``model.fwd_loss_cpu_wall``            ``on_step_begin`` (micro-batch 0) or ``on_substep_end``
                                       (micro-batch i > 0) -> the model's forward returns:
                                       input preparation (device transfer) and the forward,
                                       including a loss the model computes from ``labels``.
``model.backward_cpu_wall``            forward return -> ``on_substep_end`` or
                                       ``on_pre_optimizer_step``: loss post-processing in
                                       ``compute_loss``, ``accelerator.backward`` (DDP's
                                       all-reduce included), loss bookkeeping, and on the last
                                       micro-batch gradient clipping and the gradient norm.
``optim.step_cpu_wall``                ``on_pre_optimizer_step`` -> ``on_optimizer_step``:
                                       ``optimizer.step()`` alone.
``callbacks.step_end_cpu_wall``        ``on_optimizer_step`` -> ``on_step_end``, or ->
                                       ``on_log`` when the step logs: LR scheduler,
                                       ``zero_grad``, the ``on_step_end`` hooks of the callbacks
                                       before this one, and on logging steps the loss gather and
                                       every ``on_log`` before this one (the TensorBoard and
                                       W&B reporting callbacks).
``step.other_cpu_wall`` (residual)     step wall time beyond the stages above (next to nothing).
=====================================  ========================================================

Not counted: the label tokens' count after the fetches (above), evaluation and checkpoint
saving (``_maybe_log_save_evaluate`` after the step's log; the next data wait starts again at
``on_evaluate`` / ``on_save``), and callbacks listed after this one. Add it last to count the
others' hooks.

Gradient accumulation (``gradient_accumulation_steps=k``): one timer step per optimizer step;
micro-batch ``i`` is ``timer.microstep(i)``. The Trainer fetches all k micro-batches before
``on_step_begin``, so the whole data wait is micro-batch 0's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.schema import (
    BACKWARD_STAGE,
    DATA_STAGE,
    FORWARD_STAGE,
    OPTIMIZER_STAGE,
    RESIDUAL_STAGE,
)
from ..extras import require
from ..record.recorder import StageTimer
from ..route.router import ProfilerRouter
from ..sinks import Sink
from ._timer import HookClock, TimerArguments

_transformers: Any = require("transformers", "transformers", "StageFrontierCallback (HF Trainer)")

STEP_END_STAGE = "callbacks.step_end_cpu_wall"
FWD_BWD_STAGE = "model.fwd_bwd_cpu_wall"
_AFTER_MODEL = (OPTIMIZER_STAGE, STEP_END_STAGE, RESIDUAL_STAGE)
TRAINER_STAGES: tuple[str, ...] = (DATA_STAGE, FORWARD_STAGE, BACKWARD_STAGE, *_AFTER_MODEL)
"""The ordered schema with ``split_forward=True``, in the Trainer's execution order."""
TRAINER_STAGES_LUMPED: tuple[str, ...] = (DATA_STAGE, FWD_BWD_STAGE, *_AFTER_MODEL)
"""The ordered schema with ``split_forward=False``: forward and backward as one stage."""


class StageFrontierCallback(_transformers.TrainerCallback):  # type: ignore[misc]
    """Times the HF Trainer's optimizer steps as StageFrontier's ordered stages.

    ``split_forward``: time forward and backward apart with a forward hook on the model.
    ``sinks`` (extra sinks for rank 0's windows), ``router`` (a ``ProfilerRouter``, off when
    None) and ``**timer_kwargs`` (``config=TimerConfig(...)``, or its flat settings ``window``,
    ``out_dir``, ...; not ``stages``) are the timer's, built when training begins (see
    ``integrations._timer.TimerArguments``).
    """

    def __init__(
        self,
        *,
        sinks: Sequence[Sink] = (),
        split_forward: bool = True,
        router: ProfilerRouter | None = None,
        **timer_kwargs: Any,
    ) -> None:
        self.arguments = TimerArguments("the Trainer's", sinks, router, timer_kwargs)
        self.split_forward = split_forward
        self.timer: StageTimer | None = None
        self._clock: HookClock | None = None
        self._hook: Any = None
        self._in_forward = False
        self._close_on_log = False
        self._accumulate = 1
        self._first = FORWARD_STAGE if split_forward else FWD_BWD_STAGE

    # ------------------------------------------------------------------ life cycle
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.timer is None:
            stages = TRAINER_STAGES if self.split_forward else TRAINER_STAGES_LUMPED
            self.timer = self.arguments.make_timer(stages)
            self._clock = HookClock(self.timer)
        self._accumulate = max(1, int(getattr(args, "gradient_accumulation_steps", 1) or 1))
        model = kwargs.get("model")
        if self.split_forward and self.timer.enabled and model is not None and self._hook is None:
            self._hook = model.register_forward_hook(self._forward_returned)
        # The Trainer hands its callbacks the loader before the first epoch starts its workers.
        self._clock.watch(kwargs.get("train_dataloader"))  # type: ignore[union-attr]
        # The data wait is the loader's own fetches: the token count's gather after them waits
        # for the slowest rank's fetch (see the module doc).
        self._clock.time_fetches(kwargs.get("train_dataloader"))  # type: ignore[union-attr]
        self._clock.mark()  # type: ignore[union-attr]

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_step()
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.remove()
        self._clock = None
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.close()

    # ------------------------------------------------------------------ between steps
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remark()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end_step()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remark()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remark()

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._close_on_log:
            self._end_step()

    def _remark(self) -> None:
        self._end_step()
        if self._clock is not None:
            self._clock.mark()

    def _end_step(self) -> None:
        self._close_on_log = False
        self._in_forward = False
        clock = self._clock
        if clock is not None and clock.step_open:
            clock.end_step()

    # ------------------------------------------------------------------ inside a step
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        clock = self._clock
        if clock is None:
            return
        self._close_on_log = False
        self._in_forward = True
        clock.took(self._accumulate)  # the Trainer fetched the step's micro-batches before it
        clock.begin_step(self._first, microsteps=self._accumulate > 1)

    def _forward_returned(self, module: Any, inputs: Any, output: Any) -> None:
        if self._in_forward:  # the first forward of the micro-batch; evaluation is ignored
            self._in_forward = False
            if self._clock is not None:
                self._clock.switch(BACKWARD_STAGE)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        clock = self._clock
        if clock is not None and clock.step_open:
            self._in_forward = True
            clock.microstep(clock.microstep_index + 1, self._first)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._clock is not None:
            self._in_forward = False
            self._clock.switch(OPTIMIZER_STAGE)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._clock is not None:
            self._clock.switch(STEP_END_STAGE)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(control, "should_log", False):
            self._close_on_log = True  # the Trainer logs right after this hook: count it
        else:
            self._end_step()


__all__ = [
    "FWD_BWD_STAGE",
    "STEP_END_STAGE",
    "TRAINER_STAGES",
    "TRAINER_STAGES_LUMPED",
    "StageFrontierCallback",
]
