"""Exact attribution of a change in exposed step time between two sets of windows.

Each window's stage advances add up to its exposed time, step by step. Averaging per step on each
side keeps that identity, so the difference of the per-step means splits exactly into per-stage
differences of mean advances: ``delta_exposed = sum_s delta_advance[s]``. That holds for any two
sides (two runs, or two window ranges of one run), with any step counts.

Stages present on one side only (a schema that changed) can be left out of the per-stage view
by naming the stages to compare; the advances of every other stage are then reported together
as ``other stages``, so the identity still holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CompareError as CompareError  # defined there, importable here
from .accounting import FloatArray, advances, as_window
from .analyzer import analyze
from .window_report import WindowReport

OTHER_STAGES = "other stages"
"""The per-stage key that holds the advances of the stages left out of a comparison."""

MS = 1e3


@dataclass(frozen=True)
class Side:
    """One side of a comparison: the windows' ``[N, R, S]`` seconds stacked over steps, their
    stage names, the labels of each window as analyzed live, and each window's host signals
    (``collect.host_signals``; empty for a window written before they were recorded)."""

    name: str
    d: FloatArray
    stages: tuple[str, ...]
    window_labels: tuple[tuple[str, ...], ...] = ()
    host_signals: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_windows(
        cls,
        name: str,
        matrices: Sequence[FloatArray],
        stages: Sequence[str],
        labels: Sequence[Sequence[str]] = (),
        host_signals: Sequence[dict[str, Any]] = (),
    ) -> Side:
        if not matrices:
            raise CompareError(f"{name}: no windows to compare")
        ranks = {m.shape[1] for m in matrices}
        if len(ranks) != 1:
            raise CompareError(f"{name}: windows with different rank counts {sorted(ranks)}")
        d = as_window(np.concatenate([np.asarray(m, dtype=np.float64) for m in matrices]))
        labelled = tuple(tuple(x) for x in labels)
        return cls(name, d, tuple(stages), labelled, tuple(host_signals))


@dataclass(frozen=True)
class SideMeans:
    """One side's per-step means in milliseconds, its stage advances (the compared stages, and
    ``other stages`` where some are left out) summing to its exposed time, and the report of
    its windows as one."""

    exposed_ms: float
    advance_ms: dict[str, float]
    report: WindowReport


@dataclass(frozen=True)
class Comparison:
    """Per-step means in milliseconds, ``new - base``; see ``to_dict`` for the JSON form."""

    base: Side
    new: Side
    stages: tuple[str, ...]
    base_means: SideMeans
    new_means: SideMeans
    rank_deltas: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def delta_exposed_ms(self) -> float:
        return self.new_means.exposed_ms - self.base_means.exposed_ms

    @property
    def delta_advance_ms(self) -> dict[str, float]:
        base, new = self.base_means.advance_ms, self.new_means.advance_ms
        return {s: new[s] - base[s] for s in base}

    @property
    def top_stage(self) -> str:
        """The stage whose advance grew most (the largest positive or least negative delta)."""
        deltas = self.delta_advance_ms
        return max(deltas, key=lambda s: deltas[s])

    def stage_rank_deltas(self, stage: str) -> list[dict[str, Any]]:
        """Each rank's change of its own time in ``stage`` (ms/step), largest first."""
        if stage not in self.stages:
            return []
        rows = [
            {"rank": row["rank"], "delta_ms": row["delta_ms_per_step"][stage]}
            for row in self.rank_deltas
        ]
        return sorted(rows, key=lambda row: -row["delta_ms"])

    def leaders(self, report: WindowReport) -> dict[str, list[int]]:
        return {
            s: list(report.localization[s].leading_ranks)
            for s in self.stages
            if s in report.localization
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base.name,
            "new": self.new.name,
            "base_steps": int(self.base.d.shape[0]),
            "new_steps": int(self.new.d.shape[0]),
            "world_size": int(self.base.d.shape[1]),
            "stages": list(self.base_means.advance_ms),
            "base_exposed_ms_per_step": self.base_means.exposed_ms,
            "new_exposed_ms_per_step": self.new_means.exposed_ms,
            "delta_exposed_ms_per_step": self.delta_exposed_ms,
            "base_advance_ms_per_step": self.base_means.advance_ms,
            "new_advance_ms_per_step": self.new_means.advance_ms,
            "delta_advance_ms_per_step": self.delta_advance_ms,
            "top_stage": self.top_stage,
            "leaders": {
                "base": self.leaders(self.base_means.report),
                "new": self.leaders(self.new_means.report),
            },
            "labels": {"base": label_counts(self.base), "new": label_counts(self.new)},
            "top_stage_rank_deltas": self.stage_rank_deltas(self.top_stage),
            "rank_deltas": self.rank_deltas,
            "notes": self.notes,
        }


def label_counts(side: Side) -> dict[str, int]:
    """How many of the side's windows carried each label."""
    counts: dict[str, int] = {}
    for labels in side.window_labels:
        for label in labels:
            counts[label] = counts.get(label, 0) + 1
    return counts


def compare(base: Side, new: Side, stages: Sequence[str] | None = None) -> Comparison:
    """Split ``new``'s change in per-step exposed time against ``base`` into stage advances.

    ``stages`` names the stages to compare one by one when the schemas differ (each must exist on
    both sides); without it the two schemas must be equal. Both sides need the same world size,
    since per-rank changes are reported rank by rank.
    """
    if base.d.shape[1] != new.d.shape[1]:
        raise CompareError(
            f"world sizes differ: {base.name} has {base.d.shape[1]} ranks, "
            f"{new.name} has {new.d.shape[1]}; per-rank changes need the same ranks"
        )
    notes: list[str] = []
    if stages is None:
        if base.stages != new.stages:
            raise CompareError(
                f"stage schemas differ ({', '.join(base.stages)} vs {', '.join(new.stages)}); "
                "name the stages to compare with --stages"
            )
        chosen = base.stages
    else:
        chosen = tuple(stages)
        for side in (base, new):
            absent = [s for s in chosen if s not in side.stages]
            if absent:
                raise CompareError(f"{side.name} has no stage {', '.join(absent)}")
        if chosen != base.stages or chosen != new.stages:
            notes.append(f"stages not named are compared together as {OTHER_STAGES!r}")
    result = Comparison(
        base=base,
        new=new,
        stages=chosen,
        base_means=side_means(base, chosen),
        new_means=side_means(new, chosen),
        rank_deltas=_rank_deltas(base, new, chosen),
        notes=notes,
    )
    _check_identity(result)
    return result


def side_means(side: Side, chosen: Sequence[str]) -> SideMeans:
    a = advances(side.d)  # [N, S]: sums to each step's exposed time
    means = a.mean(axis=0) * MS
    out = {s: float(means[side.stages.index(s)]) for s in chosen}
    rest = [j for j, s in enumerate(side.stages) if s not in chosen]
    if rest or len(chosen) != len(side.stages):
        out[OTHER_STAGES] = float(means[rest].sum()) if rest else 0.0
    return SideMeans(float(a.sum(axis=1).mean() * MS), out, analyze(side.d, side.stages))


def _rank_deltas(base: Side, new: Side, chosen: Sequence[str]) -> list[dict[str, Any]]:
    """Per rank, the change of its own mean stage durations (ms/step), largest total first."""
    b = base.d.mean(axis=0) * MS  # [R, S]
    n = new.d.mean(axis=0) * MS
    rows = []
    for r in range(base.d.shape[1]):
        deltas = {s: float(n[r, new.stages.index(s)] - b[r, base.stages.index(s)]) for s in chosen}
        rows.append(
            {"rank": r, "delta_ms_per_step": deltas, "total_ms": float(sum(deltas.values()))}
        )
    return sorted(rows, key=lambda row: -row["total_ms"])


def _check_identity(result: Comparison) -> None:
    total = sum(result.delta_advance_ms.values())
    scale = max(result.base_means.exposed_ms, result.new_means.exposed_ms, 1.0)
    if abs(total - result.delta_exposed_ms) > 1e-9 * scale:
        raise CompareError(
            f"internal error: stage deltas sum to {total!r} ms, exposed delta is "
            f"{result.delta_exposed_ms!r} ms"
        )
