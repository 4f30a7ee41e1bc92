"""Weights & Biases: one ``run.log`` per window (extra ``wandb``)."""

from __future__ import annotations

from typing import Any

from ..extras import require
from ..window.merged import AnalyzedWindow


class WandbSink:
    """Logs each window to Weights & Biases with ``run.log``.

    Keys are ``<prefix>/share/<stage>``, ``<prefix>/exposed_ms_per_step``,
    ``<prefix>/top1_share``, ``<prefix>/top1_leader_rank``, ``<prefix>/label/<label>``, plotted
    against ``<prefix>/step`` (the window's last step) through ``define_metric``, so the run's own
    step counter and the trainer's logging are left alone.

    The run is chosen at the first window: ``run`` if given, else the active ``wandb.run`` (the
    one a Lightning ``WandbLogger`` or the HF ``WandbCallback`` opened), else a new run started
    with ``wandb.init(project=project, **init_kwargs)``, finished by :meth:`close`. ``wandb``
    reads ``WANDB_MODE`` (``offline`` works with no network: the run is written under
    ``WANDB_DIR`` for a later ``wandb sync``) and ``WANDB_DIR`` as usual.

    Needs ``pip install 'stagefrontier[wandb]'``.
    """

    def __init__(
        self,
        *,
        project: str = "stagefrontier",
        run: Any = None,
        prefix: str = "stagefrontier",
        **init_kwargs: Any,
    ) -> None:
        self._wandb = require("wandb", "wandb", "WandbSink")
        self.project = project
        self.prefix = prefix
        self.init_kwargs = init_kwargs
        self._run = run
        self._owned = False
        self._defined = False

    @property
    def run(self) -> Any:
        """The run written to (None before the first window). Chosen then rather than when the
        timer is built, so that it joins the run a framework logger opens at training start."""
        return self._run

    def _ensure_run(self) -> Any:
        if self._run is None:
            active = getattr(self._wandb, "run", None)
            if active is not None:
                self._run = active
            else:
                self._run = self._wandb.init(project=self.project, **self.init_kwargs)
                self._owned = True
        if not self._defined:
            p = self.prefix
            self._run.define_metric(f"{p}/step")
            self._run.define_metric(f"{p}/*", step_metric=f"{p}/step")
            self._defined = True
        return self._run

    def write(self, window: AnalyzedWindow) -> None:
        m = window.metrics
        p = self.prefix
        data: dict[str, Any] = {
            f"{p}/step": m.last_step,
            f"{p}/window": m.window,
            f"{p}/exposed_ms_per_step": m.exposed_ms_per_step,
            f"{p}/top1_leader_rank": m.leader_rank,
        }
        if m.top1_share is not None:
            data[f"{p}/top1_share"] = m.top1_share
        data.update({f"{p}/share/{stage}": share for stage, share in m.shares.items()})
        data.update({f"{p}/label/{label}": flag for label, flag in m.label_flags.items()})
        data[f"{p}/regression_ms_per_step"] = m.regression_ms_per_step
        data[f"{p}/self_cost_fraction"] = m.self_cost_fraction
        data.update({f"{p}/regression/{s}": delta for s, delta in m.regression_stage_ms.items()})
        self._ensure_run().log(data)

    def close(self) -> None:
        """Finish the run this sink started, with its data on disk (or handed to the server).

        ``run.finish()`` alone is not enough: it hands the last records to W&B's service
        process, which writes the run file (``WANDB_MODE=offline``) a moment later, after
        ``finish`` has returned. When no other run is left in the process, this sink tears the
        service down too, which waits for it to write and exit; a later ``wandb.init`` starts a
        new one. A run the sink joined (``run=``, or the active one) is left to its owner.
        """
        if self._run is not None and self._owned:
            self._run.finish()
            self._owned = False
            if self._wandb.run is None:
                self._wandb.teardown()
        self._run = None
        self._defined = False
