"""The labeler's gates: every threshold that decides a label, in one frozen object."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from ..errors import GatesError
from .values import is_int, is_real

GainBaseline = Literal["rank_median", "cohort_median", "reference"]


@dataclass(frozen=True)
class Gates:
    """Default labeler gates (paper appendix C), plus the few choices the paper leaves open.

    Shares and gains are fractions of the window's exposed time; ratios are unitless.
    """

    max_residual_share: float = 0.05
    """Frontier share of ``step.other_cpu_wall`` above which strong labels are suppressed."""
    max_overlap_share: float = 0.01
    """Overlap error, as a fraction of rank step wall time, above which strong labels are
    suppressed."""
    max_missing_ranks: int = 0
    """Missing ranks tolerated before distributed labels downgrade to telemetry_limited."""
    min_event_ready_ratio: float = 0.8
    """Completed / sampled forward CUDA-event pairs needed for event-based labels."""
    min_event_samples: int = 5
    """Completed event pairs needed for event-based labels."""
    share_dominance: float = 0.4
    """gamma_A: share the top stage needs for a strong stage label."""
    gain_threshold: float = 0.1
    """gamma_G: direct gain separating direct exposure from wait-dependent share."""
    share_tie: float = 0.05
    """eta_A: shares this close to the top share are near-tied (co-critical)."""
    gain_tie: float = 0.05
    """eta_G: gains this close to the top gain are near-tied."""
    leader_tie: float = 0.02
    """eta_Q: ranks whose prefix is within this fraction of the step's exposed time of the
    frontier are tied for the lead; a confident leader is the only rank in its tie set."""
    leading_rank_fraction: float = 0.1
    """A rank is one of a stage's leading ranks if it led the boundary alone for at least this
    fraction of the uniquely led advance, or shared the lead in at least this fraction of steps
    (several leading ranks on one host of a multi-host job: a node-level problem)."""
    max_switch_rate: float = 0.3
    """gamma_switch: leader changes per confident step above which the lead rank is unstable."""
    min_confident_fraction: float = 0.5
    """gamma_elig: fraction of a stage's steps that need a confident unique leader before its
    leader rank and switch count are trusted."""
    candidate_threshold: float = 0.8
    """tau_C: the routing set is the shortest share-ordered prefix reaching this share."""
    model_fit_stages: frozenset[str] = field(default_factory=frozenset)
    """W_s = 1 for these stages: the caller asserts the synchronization-wait model fits them
    (workload semantics). Empty by default: never infer wait dependence without evidence."""
    gain_baseline: GainBaseline = "rank_median"
    """Baseline for the direct-exposure gain: each rank's window median per stage, the cohort
    (cross-rank) median per step, or the caller's no-stall reference from the side evidence."""
    critical_path_fraction: float = 0.2
    """When no stage has a useful direct gain, a stage joins the co-critical set if it is the
    largest stage of ranks that end the step on the frontier for at least this fraction of the
    window's exposed time."""
    event_high_ratio: float = 0.5
    """Sampled forward event time / CPU-wall forward time at or above which device work is high."""
    event_low_ratio: float = 0.25
    """Below this ratio the forward CPU wall is mostly host overhead."""
    min_exposed_s: float = 1e-9
    """Below this many exposed seconds in a window, shares are undefined (raw advances only)."""

    def __post_init__(self) -> None:
        """Type-check every field (a JSON ``true`` or a string is no threshold) and range-check
        the numbers; raises GatesError naming the field."""
        for f in fields(self):
            value = getattr(self, f.name)
            check = _NUMBER_CHECKS.get(str(f.type))
            if check is None:
                continue
            is_kind, kind = check
            if not is_kind(value):
                raise GatesError(
                    f"gate {f.name} must be {kind}, got {type(value).__name__} {value!r}"
                )
            if not value >= 0:
                raise GatesError(f"gate {f.name} must be >= 0, got {value!r}")
        if not 0.0 < self.candidate_threshold <= 1.0:
            raise GatesError(
                f"candidate_threshold must be in (0, 1], got {self.candidate_threshold}"
            )
        if not isinstance(self.gain_baseline, str) or self.gain_baseline not in GAIN_BASELINES:
            raise GatesError(
                f"unknown gain_baseline {self.gain_baseline!r}; choose one of "
                f"{', '.join(GAIN_BASELINES)}"
            )
        object.__setattr__(self, "model_fit_stages", _stage_set(self.model_fit_stages))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model_fit_stages"] = sorted(self.model_fit_stages)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gates:
        """Gates from ``to_dict()``'s form; raises GatesError for a non-object, an unknown gate
        or a value of the wrong type."""
        if not isinstance(data, dict):
            raise GatesError(f"gates must be an object of gate values, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise GatesError(f"unknown gate(s): {sorted(unknown)}")
        return cls(**data)


GAIN_BASELINES: tuple[GainBaseline, ...] = ("rank_median", "cohort_median", "reference")

_NUMBER_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "float": (is_real, "a number"),
    "int": (is_int, "an integer"),
}
"""The check and its wording for each numeric field type (annotations read as strings)."""


def _stage_set(stages: Any) -> frozenset[str]:
    """``model_fit_stages`` as a frozenset of names: any iterable of non-empty strings, but not
    one string (it would become a set of its characters)."""
    if isinstance(stages, str) or not isinstance(stages, Iterable):
        raise GatesError(
            f"gate model_fit_stages must be a collection of stage names, got {stages!r}"
        )
    names = list(stages)
    bad = [name for name in names if not isinstance(name, str) or not name]
    if bad:
        raise GatesError(f"gate model_fit_stages holds non-names: {bad!r}")
    return frozenset(names)


DEFAULT_GATES = Gates()
"""The gates a window is judged by unless the user gives others (checked once, shared)."""
