"""The few numbers per window that dashboards plot (TensorBoard, Prometheus, W&B, CSV).

Built once per analyzed window (``AnalyzedWindow.metrics``) and read by every sink that writes
metrics, so the sinks cannot disagree on a value:

- the share of exposed step time per broad stage (accumulation substages ``name[i]`` folded into
  ``name``, so the set of series does not change with the accumulation factor); only when the
  window's shares are defined (it had exposed time);
- the exposed step time (frontier step time) in milliseconds per step;
- the top stage, its share, and its leader rank (:data:`NO_LEADER` where no single rank leads);
- one 0/1 flag per label of :data:`~stagefrontier.analysis.labels.ALL_LABELS`;
- when the window regressed against the run's healthy windows, how many ms per step it lost and
  how much each stage's exposed time grew (0 and empty otherwise);
- what StageFrontier itself cost, as the largest fraction of a rank's step time (the record's
  ``self_cost``; 0 for a window analyzed offline).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .labels import ALL_LABELS
from .schema import semantic_stage
from .window_report import WindowReport

NO_LEADER = -1
"""Leader rank written where the top stage has no single leading rank."""


@dataclass(frozen=True)
class WindowMetrics:
    """The numbers every metrics sink writes for one window."""

    window: int
    first_step: int
    last_step: int
    n_steps: int
    n_ranks: int
    exposed_ms_per_step: float
    stages: tuple[str, ...]
    """The broad stages of the schema, in order (whether or not shares are defined)."""
    shares: dict[str, float]
    """Per broad stage, in schema order; empty when the window's shares are undefined."""
    top1: str | None
    top1_share: float | None
    leader_rank: int
    labels: tuple[str, ...]
    label_flags: dict[str, int]
    gather_ok: bool
    regression_ms_per_step: float = 0.0
    """Exposed ms per step above the healthy baseline; 0.0 when the window did not regress."""
    regression_stage_ms: dict[str, float] = field(default_factory=dict)
    """Per stage, its exposed ms per step above the baseline (only for a regressed window)."""
    regression_stage: str | None = None
    self_cost_fraction: float = 0.0
    """StageFrontier's own cost over the step time, the largest over ranks (record.self_cost)."""

    @classmethod
    def from_report(
        cls,
        report: WindowReport,
        *,
        window: int,
        first_step: int,
        last_step: int,
        gather_ok: bool,
        regression: Mapping[str, Any] | None = None,
        self_cost_fraction: float = 0.0,
    ) -> WindowMetrics:
        """The metrics of ``report``, for the window ``window`` covering the given steps."""
        defined = report.shares_defined
        top1 = report.top1
        lead = report.semantic_localization[top1].leader_rank if top1 is not None else None
        return cls(
            window=window,
            first_step=first_step,
            last_step=last_step,
            n_steps=report.n_steps,
            n_ranks=report.n_ranks,
            exposed_ms_per_step=report.mean_step_s * 1e3,
            stages=tuple(dict.fromkeys(semantic_stage(s) for s in report.stages)),
            shares=dict(report.semantic_shares) if defined else {},
            top1=top1,
            top1_share=report.semantic_shares[top1] if defined and top1 is not None else None,
            leader_rank=NO_LEADER if lead is None else int(lead),
            labels=tuple(report.labels),
            label_flags={label: int(label in report.labels) for label in ALL_LABELS},
            gather_ok=gather_ok,
            regression_ms_per_step=float(regression["delta_exposed_ms_per_step"])
            if regression
            else 0.0,
            regression_stage_ms=dict(regression["delta_advance_ms_per_step"]) if regression else {},
            regression_stage=regression["top_stage"] if regression else None,
            self_cost_fraction=self_cost_fraction,
        )
