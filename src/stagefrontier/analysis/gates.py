"""The labeler's gates: every threshold that decides a label, in one frozen object."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from ..errors import StageFrontierError

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
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= 0:
                raise StageFrontierError(f"gate {f.name} must be >= 0, got {value!r}")
        if not 0.0 < self.candidate_threshold <= 1.0:
            raise StageFrontierError(
                f"candidate_threshold must be in (0, 1], got {self.candidate_threshold}"
            )
        if self.gain_baseline not in ("rank_median", "cohort_median", "reference"):
            raise StageFrontierError(f"unknown gain_baseline {self.gain_baseline!r}")
        if not isinstance(self.model_fit_stages, frozenset):
            object.__setattr__(self, "model_fit_stages", frozenset(self.model_fit_stages))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["model_fit_stages"] = sorted(self.model_fit_stages)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Gates:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise StageFrontierError(f"unknown gate(s): {sorted(unknown)}")
        values = dict(data)
        if "model_fit_stages" in values:
            values["model_fit_stages"] = frozenset(values["model_fit_stages"])
        return cls(**values)
