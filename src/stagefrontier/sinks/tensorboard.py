"""TensorBoard scalars through ``torch.utils.tensorboard`` (extra ``tensorboard``)."""

from __future__ import annotations

import os
from typing import Any

from ..extras import require
from ..window.merged import AnalyzedWindow


class TensorBoardSink:
    """Scalars through ``torch.utils.tensorboard.SummaryWriter``, at ``global_step`` = the
    window's last step:

    - ``stagefrontier/share/<stage>``
    - ``stagefrontier/exposed_ms_per_step``
    - ``stagefrontier/top1_share``, ``stagefrontier/top1_leader_rank`` (-1: no single leader)
    - ``stagefrontier/label/<label>`` (0 or 1)

    Args:
        log_dir: event file folder (TensorBoard's ``--logdir``); ignored when ``writer`` is given.
        writer: an existing ``SummaryWriter`` (e.g. ``TensorBoardLogger.experiment`` in Lightning)
            to add the scalars to; it is flushed but not closed by this sink.
        prefix: the tag prefix.

    Needs ``pip install 'stagefrontier[tensorboard]'``.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        writer: Any = None,
        prefix: str = "stagefrontier",
    ) -> None:
        require("tensorboard", "tensorboard", "TensorBoardSink")
        # Imported here, on the caller's thread: importing it later on the analysis thread would
        # hold the GIL for a noticeable time in the middle of training.
        from torch.utils.tensorboard import SummaryWriter

        self._writer_class = SummaryWriter
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.prefix = prefix
        self._writer = writer
        self._owned = writer is None

    @property
    def writer(self) -> Any:
        """The SummaryWriter (created on rank 0 only, so other ranks make no event files)."""
        if self._writer is None:
            self._writer = self._writer_class(log_dir=self.log_dir)
        return self._writer

    def start(self) -> None:
        """Open the event file now (rank 0, when the collector is built) rather than at the
        first window."""
        _ = self.writer

    def write(self, window: AnalyzedWindow) -> None:
        m = window.metrics
        w = self.writer
        p = self.prefix
        step = m.last_step
        for stage, share in m.shares.items():
            w.add_scalar(f"{p}/share/{stage}", share, global_step=step)
        w.add_scalar(f"{p}/exposed_ms_per_step", m.exposed_ms_per_step, global_step=step)
        if m.top1_share is not None:
            w.add_scalar(f"{p}/top1_share", m.top1_share, global_step=step)
        w.add_scalar(f"{p}/top1_leader_rank", m.leader_rank, global_step=step)
        for label, flag in m.label_flags.items():
            w.add_scalar(f"{p}/label/{label}", flag, global_step=step)
        w.add_scalar(f"{p}/regression_ms_per_step", m.regression_ms_per_step, global_step=step)
        w.add_scalar(f"{p}/self_cost_fraction", m.self_cost_fraction, global_step=step)
        for stage, delta in m.regression_stage_ms.items():
            w.add_scalar(f"{p}/regression/{stage}", delta, global_step=step)
        w.flush()

    def close(self) -> None:
        if self._writer is not None:
            if self._owned:
                self._writer.close()
                self._writer = None
            else:
                self._writer.flush()
