"""Side evidence: what the analyzer may know besides the ordered duration matrix.

None of it enters the prefix vector. It only feeds the labels that need it: forward CUDA-event
samples, gradient-accumulation state, closure/overlap errors, contract violations and the ranks
that did not arrive at the window boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ReportFormatError, SideEvidenceError
from .collectives import CollectiveTimes
from .schema import FORWARD_STAGE
from .values import is_int, is_real

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
        event_totals: the same samples as four totals, for a window whose ranks' arrays stayed
            on their nodes: (pairs sampled, pairs completed, event milliseconds summed over the
            completed pairs, forward CPU-wall seconds summed over the same cells); totals of
            node groups add up exactly. Used only without ``event_ms``.
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
        expected_roles: the job's full role set, when known (e.g. from a device mesh): a role
            with no rank in the window is then reported, and a role outside it is an error.
        collectives: the collectives the ranks timed (``analysis.collectives``), when any rank
            watched them; read beside the matrix, never in it.
    """

    event_ms: npt.NDArray[np.float64] | None = None
    event_state: npt.NDArray[np.int8] | None = None
    event_scope_limited: bool = False
    forward_stage: str = FORWARD_STAGE
    event_totals: tuple[float, float, float, float] | None = None
    accumulation_factor: int | None = None
    accumulation_collapsed: bool = False
    overlap_error_s: float = 0.0
    missing_ranks: tuple[int, ...] = ()
    mismatched_ranks: tuple[int, ...] = ()
    gather_ok: bool = True
    contract_violations: int = 0
    no_stall_reference_s: npt.NDArray[np.float64] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    expected_roles: tuple[str, ...] = ()
    collectives: CollectiveTimes | None = None

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
        if self.event_totals is not None:
            totals = np.asarray(self.event_totals, dtype=np.float64)
            if totals.shape != (4,) or not (np.isfinite(totals).all() and (totals >= 0).all()):
                raise SideEvidenceError("event_totals must be four finite numbers >= 0")
            if totals[1] > totals[0]:
                raise SideEvidenceError("event_totals: more completed pairs than sampled")
        if self.collectives is not None and self.collectives.wait_ms.shape[1] != n_ranks:
            raise SideEvidenceError(f"collectives must cover the window's {n_ranks} ranks")
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
            "event_totals": None if self.event_totals is None else list(self.event_totals),
            "accumulation_factor": self.accumulation_factor,
            "accumulation_collapsed": self.accumulation_collapsed,
            "overlap_error_s": self.overlap_error_s,
            "missing_ranks": list(self.missing_ranks),
            "mismatched_ranks": list(self.mismatched_ranks),
            "gather_ok": self.gather_ok,
            "contract_violations": self.contract_violations,
            "no_stall_reference_s": arr(self.no_stall_reference_s),
            "notes": list(self.notes),
            "expected_roles": list(self.expected_roles),
            "collectives": None if self.collectives is None else self.collectives.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SideEvidence:
        """Side evidence from ``to_dict()``'s form (missing keys take their defaults); raises
        SideEvidenceError for a non-object, an unknown key or a value of the wrong type."""
        if not isinstance(data, dict):
            raise SideEvidenceError(f"side evidence must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEY_KINDS))
        if unknown:
            raise SideEvidenceError(f"unknown side-evidence key(s): {unknown}")
        for key, value in data.items():
            is_kind, kind = _KEY_KINDS[key]
            if not is_kind(value):
                raise SideEvidenceError(f"side evidence {key} must be {kind}, got {value!r}")
        values = dict(data)
        try:
            for key in ("event_ms", "event_state", "no_stall_reference_s"):
                if values.get(key) is not None:
                    dtype = np.int8 if key == "event_state" else np.float64
                    values[key] = np.array(values[key], dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SideEvidenceError(f"malformed side evidence: {exc}") from None
        for key in ("missing_ranks", "mismatched_ranks", "notes", "expected_roles"):
            if key in values:
                values[key] = tuple(values[key])
        if values.get("collectives") is not None:
            try:
                values["collectives"] = CollectiveTimes.from_dict(values["collectives"])
            except ReportFormatError as exc:
                raise SideEvidenceError(str(exc)) from None
        if values.get("event_totals") is not None:
            values["event_totals"] = tuple(float(v) for v in values["event_totals"])
        return cls(**values)


def _optional_array(value: Any) -> bool:
    return value is None or isinstance(value, (list, np.ndarray))


def _sequence_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, (list, tuple)) and all(test(x) for x in value)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


_KEY_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "event_ms": (_optional_array, "null or an array"),
    "event_state": (_optional_array, "null or an array"),
    "event_scope_limited": (_is_bool, "true or false"),
    "forward_stage": (_is_name, "a stage name"),
    "event_totals": (
        lambda v: (
            v is None
            or (isinstance(v, list) and len(v) == 4 and all(is_real(x) and x >= 0 for x in v))
        ),
        "null or four numbers >= 0",
    ),
    "accumulation_factor": (lambda v: v is None or is_int(v), "null or an integer"),
    "accumulation_collapsed": (_is_bool, "true or false"),
    "overlap_error_s": (is_real, "a number"),
    "missing_ranks": (_sequence_of(is_int), "a list of ranks"),
    "mismatched_ranks": (_sequence_of(is_int), "a list of ranks"),
    "gather_ok": (_is_bool, "true or false"),
    "contract_violations": (is_int, "an integer"),
    "no_stall_reference_s": (_optional_array, "null or an array"),
    "notes": (_sequence_of(lambda n: isinstance(n, str)), "a list of strings"),
    "expected_roles": (_sequence_of(_is_name), "a list of role names"),
    "collectives": (lambda v: v is None or isinstance(v, dict), "null or an object"),
}
"""Every side-evidence key ``to_dict`` writes, with the JSON type ``from_dict`` accepts."""
