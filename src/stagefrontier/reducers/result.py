"""ReducedTrace: a profiler trace reduced to the analyzer's ``d [N, R, S]``, and what it lost."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.analyzer import analyze
from ..analysis.gates import Gates
from ..analysis.schema import RESIDUAL_STAGE
from ..analysis.side import SideEvidence
from ..analysis.window_report import WindowReport
from .errors import MisalignedStepsError
from .ranges import id_text

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class ReducedTrace:
    """The ordered stage matrix of a trace, in the same layout and units as a live window.

    Attributes:
        d: ``[N steps, R ranks, S stages]`` float64 seconds; the last stage is the residual
            ``step.other_cpu_wall`` = step wall minus the timed stages, clipped at 0.
        stages: the S stage names, residual last.
        ranks: the rank id of each position on the rank axis (sorted).
        step_ids: the id of each step on the step axis (``ProfilerStep#N``'s N, or ordinals).
        overlap_s: ``[N, R]`` seconds by which the timed stages exceed the step wall (nested or
            overlapping ranges): the negative part the residual clips away.
        source: ``"kineto"``, ``"hta"`` or ``"nsys"``.
        files: the trace files of each rank, in rank-axis order.
        world_size: the job's world size when the trace says so, else None.
        missing_ranks: ranks of the world size that no file covers (when allowed).
        notes: every downgrade or oddity met while reducing, one sentence each.
        meta: further facts (step kind, time base, training threads, dropped steps).
        stages_inferred: True when no stage list was given and ``stages`` were taken from the
            ranges found on the step thread.
    """

    d: FloatArray
    stages: tuple[str, ...]
    ranks: tuple[int, ...]
    step_ids: tuple[int, ...]
    overlap_s: FloatArray
    source: str
    files: tuple[tuple[str, ...], ...]
    world_size: int | None = None
    missing_ranks: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    stages_inferred: bool = False

    @property
    def overlap_error_s(self) -> float:
        """Total overlap error of the window, in seconds."""
        return float(self.overlap_s.sum())

    def side_evidence(self) -> SideEvidence:
        """What the analyzer should know besides ``d``: overlap error, missing ranks, notes."""
        return SideEvidence(
            overlap_error_s=self.overlap_error_s,
            missing_ranks=self.missing_ranks,
            gather_ok=not self.missing_ranks,
            notes=self.notes,
        )

    def analyze(self, gates: Gates | None = None) -> WindowReport:
        """Run the one analyzer on the reduced matrix with this trace's side evidence; leaders
        and reasons name the traces' own rank numbers."""
        return analyze(
            self.d, self.stages, gates=gates, side=self.side_evidence(), rank_ids=self.ranks
        )

    def select_steps(self, step_ids: Iterable[int]) -> ReducedTrace:
        """The same trace restricted to the given step ids (in the order given).

        Raises:
            MisalignedStepsError: a requested step id is not in the trace.
        """
        wanted = list(step_ids)
        index = {step_id: i for i, step_id in enumerate(self.step_ids)}
        absent = [s for s in wanted if s not in index]
        if absent:
            raise MisalignedStepsError(
                f"step id(s) {id_text(absent)} not in the reduced trace "
                f"(it holds {id_text(self.step_ids)})"
            )
        rows = [index[s] for s in wanted]
        return replace(
            self,
            d=self.d[rows],
            step_ids=tuple(wanted),
            overlap_s=self.overlap_s[rows],
        )

    def summary(self) -> dict[str, Any]:
        """A small JSON-friendly description (for the CLI's ``meta:`` line and for logs)."""
        out: dict[str, Any] = {
            "source": self.source,
            "ranks": list(self.ranks),
            "steps": f"{id_text(self.step_ids)} ({len(self.step_ids)})",
            "files": sum(len(f) for f in self.files),
            "overlap_error_s": round(self.overlap_error_s, 9),
        }
        if self.world_size is not None:
            out["world_size"] = self.world_size
        if self.missing_ranks:
            out["missing_ranks"] = list(self.missing_ranks)
        if self.stages_inferred:
            out["stages_inferred"] = ", ".join(s for s in self.stages if s != RESIDUAL_STAGE)
        out.update(self.meta)
        if self.notes:
            out["notes"] = len(self.notes)
        return out
