"""Side evidence: what the analyzer may know besides the ordered duration matrix.

None of it enters the prefix vector. It only feeds the labels that need it: forward CUDA-event
samples, gradient-accumulation state, closure/overlap errors, contract violations and the ranks
that did not arrive at the window boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import SideEvidenceError
from .schema import FORWARD_STAGE

EVENT_NOT_SAMPLED = 0
EVENT_READY = 1
EVENT_MISSING = 2
"""States of a sampled forward CUDA-event pair: not sampled, completed, or not ready in time."""


@dataclass(frozen=True)
class SideEvidence:
    """Optional evidence handed to ``analyze`` alongside the duration matrix.

    Attributes:
        event_ms: ``[N, R]`` sampled forward CUDA-event elapsed time in milliseconds (NaN where
            there is no value).
        event_state: ``[N, R]`` one of EVENT_NOT_SAMPLED, EVENT_READY, EVENT_MISSING.
        event_scope_limited: the trainer runs work on streams the event markers do not cover.
        forward_stage: name of the ordered stage the events bracket.
        accumulation_factor: microsteps per optimizer step, when gradient accumulation is on.
        accumulation_collapsed: microsteps were collapsed into broad stages or mixed, so data and
            backward displacement cannot be separated.
        overlap_error_s: total overlap error in the window (timed spans exceeding the step wall).
        missing_ranks: ranks of the diagnosis group whose window did not arrive.
        mismatched_ranks: ranks whose schema or step count differed, so they were not merged.
        gather_ok: whether collection of the window completed.
        contract_violations: ordered-stage contract violations counted by the recorder.
        no_stall_reference_s: a caller-given per-stage (``[S]``) or per-rank-stage (``[R, S]``)
            reference duration, used as the direct-gain baseline when the gates ask for it.
        notes: extra telemetry-quality reasons from the collector, reported verbatim.
    """

    event_ms: npt.NDArray[np.float64] | None = None
    event_state: npt.NDArray[np.int8] | None = None
    event_scope_limited: bool = False
    forward_stage: str = FORWARD_STAGE
    accumulation_factor: int | None = None
    accumulation_collapsed: bool = False
    overlap_error_s: float = 0.0
    missing_ranks: tuple[int, ...] = ()
    mismatched_ranks: tuple[int, ...] = ()
    gather_ok: bool = True
    contract_violations: int = 0
    no_stall_reference_s: npt.NDArray[np.float64] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def checked(self, n_steps: int, n_ranks: int, n_stages: int) -> SideEvidence:
        """Validate against a window's shape; raises SideEvidenceError naming the bad field."""
        if (self.event_ms is None) != (self.event_state is None):
            raise SideEvidenceError("event_ms and event_state must be given together")
        if self.event_ms is not None and self.event_state is not None:
            ms = np.asarray(self.event_ms, dtype=np.float64)
            state = np.asarray(self.event_state, dtype=np.int8)
            for name, arr in (("event_ms", ms), ("event_state", state)):
                if arr.shape != (n_steps, n_ranks):
                    raise SideEvidenceError(
                        f"{name} must have shape [steps, ranks] = {(n_steps, n_ranks)}, "
                        f"got {arr.shape}"
                    )
            if not np.isin(state, (EVENT_NOT_SAMPLED, EVENT_READY, EVENT_MISSING)).all():
                raise SideEvidenceError("event_state values must be 0 (not sampled), 1, or 2")
            ready = state == EVENT_READY
            if not (np.isfinite(ms[ready]).all() and (ms[ready] >= 0).all()):
                raise SideEvidenceError("event_ms must be finite and >= 0 where the state is ready")
        if self.accumulation_factor is not None and self.accumulation_factor < 1:
            raise SideEvidenceError(
                f"accumulation_factor must be >= 1, got {self.accumulation_factor}"
            )
        if not (np.isfinite(self.overlap_error_s) and self.overlap_error_s >= 0):
            raise SideEvidenceError(f"overlap_error_s must be >= 0, got {self.overlap_error_s}")
        if self.contract_violations < 0:
            raise SideEvidenceError("contract_violations must be >= 0")
        if self.no_stall_reference_s is not None:
            ref = np.asarray(self.no_stall_reference_s, dtype=np.float64)
            if ref.shape not in ((n_stages,), (n_ranks, n_stages)):
                raise SideEvidenceError(
                    f"no_stall_reference_s must have shape [S]={(n_stages,)} or "
                    f"[R, S]={(n_ranks, n_stages)}, got {ref.shape}"
                )
            if not (np.isfinite(ref).all() and (ref >= 0).all()):
                raise SideEvidenceError("no_stall_reference_s must be finite and >= 0")
        return self

    def to_dict(self) -> dict[str, Any]:
        def arr(x: Any) -> Any:
            # NaN (an event sample with no value) becomes null: strict JSON has no NaN.
            if x is None:
                return None
            values = np.asarray(x)
            if values.dtype.kind == "f":
                boxed = values.astype(object)
                boxed[np.isnan(values)] = None
                return boxed.tolist()
            return values.tolist()

        return {
            "event_ms": arr(self.event_ms),
            "event_state": arr(self.event_state),
            "event_scope_limited": self.event_scope_limited,
            "forward_stage": self.forward_stage,
            "accumulation_factor": self.accumulation_factor,
            "accumulation_collapsed": self.accumulation_collapsed,
            "overlap_error_s": self.overlap_error_s,
            "missing_ranks": list(self.missing_ranks),
            "mismatched_ranks": list(self.mismatched_ranks),
            "gather_ok": self.gather_ok,
            "contract_violations": self.contract_violations,
            "no_stall_reference_s": arr(self.no_stall_reference_s),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SideEvidence:
        try:
            ms, state, ref = (
                data.get("event_ms"),
                data.get("event_state"),
                data.get("no_stall_reference_s"),
            )
            return cls(
                event_ms=None if ms is None else np.array(ms, dtype=np.float64),
                event_state=None if state is None else np.array(state, dtype=np.int8),
                event_scope_limited=bool(data.get("event_scope_limited", False)),
                forward_stage=str(data.get("forward_stage", FORWARD_STAGE)),
                accumulation_factor=data.get("accumulation_factor"),
                accumulation_collapsed=bool(data.get("accumulation_collapsed", False)),
                overlap_error_s=float(data.get("overlap_error_s", 0.0)),
                missing_ranks=tuple(int(r) for r in data.get("missing_ranks", ())),
                mismatched_ranks=tuple(int(r) for r in data.get("mismatched_ranks", ())),
                gather_ok=bool(data.get("gather_ok", True)),
                contract_violations=int(data.get("contract_violations", 0)),
                no_stall_reference_s=None if ref is None else np.array(ref, dtype=np.float64),
                notes=tuple(str(n) for n in data.get("notes", ())),
            )
        except (TypeError, ValueError) as exc:
            raise SideEvidenceError(f"malformed side evidence: {exc}") from None
