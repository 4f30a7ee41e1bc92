"""WindowReport: the analyzer's result for one window, and its exact dict/JSON round trip."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ReportFormatError, StageFrontierError
from .evidence import StageLocalization
from .gates import Gates
from .values import check_document

REPORT_FORMAT = "stagefrontier.window_report"
REPORT_VERSION = 3
"""Version 3 added ``role_reports``."""


@dataclass(frozen=True)
class WindowReport:
    """Frontier accounting, localization evidence and labels for one window.

    Shares, gains and ``residual_share`` are fractions of ``exposed_s``; times are seconds.
    ``stages`` and the per-stage fields follow the window's schema, accumulation substages
    ``name[i]`` included (the detail); ``top1``, ``top2``, ``routing_set``,
    ``co_critical_stages`` and the labels work on the broad stages, whose numbers are the
    ``semantic_*`` fields (equal to the per-stage ones without accumulation).
    """

    stages: list[str]
    n_steps: int
    n_ranks: int
    schema_version: int
    stage_order_hash: str
    exposed_s: float
    """Sum over steps of the exposed step time ``F[t, S]``."""
    shares_defined: bool
    """False when the window's exposed time is below the floor: use ``advances``."""
    shares: dict[str, float]
    advances: dict[str, float]
    direct_gain: dict[str, float]
    top1: str | None
    top2: str | None
    routing_set: list[str]
    labels: list[str]
    reasons: dict[str, list[str]]
    co_critical_stages: list[str]
    leaders: dict[str, int | None]
    localization: dict[str, StageLocalization]
    semantic_shares: dict[str, float]
    """Shares summed by broad stage (accumulation substages ``name[i]`` folded into ``name``)."""
    semantic_gain: dict[str, float]
    """Direct gain per broad stage, all its substages clipped at once."""
    semantic_localization: dict[str, StageLocalization]
    """Per broad stage: the localization of its substage with the largest advance, with the lag
    growth summed over its substages."""
    residual_share: float
    overlap_share: float
    roles: list[str] | None
    role_shares: dict[str, dict[str, float]] | None
    """Per role, its report's ``semantic_shares`` (None unless ranks play several roles)."""
    forward_event: dict[str, float] | None
    gates: Gates
    role_reports: dict[str, WindowReport] | None = None
    """Per role, the full report of that role's ranks analyzed alone, ranks numbered as in the
    whole window (None unless ranks play several roles)."""

    def has(self, label: str) -> bool:
        return label in self.labels

    @property
    def mean_step_s(self) -> float:
        return self.exposed_s / self.n_steps

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": REPORT_FORMAT, "version": REPORT_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("localization", "semantic_localization"):
                value = {k: _loc_to_dict(v) for k, v in value.items()}
            elif f.name == "gates":
                value = value.to_dict()
            elif f.name == "role_reports" and value is not None:
                value = {role: rep.to_dict() for role, rep in value.items()}
            out[f.name] = value
        return out

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=False, **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WindowReport:
        names = [f.name for f in fields(cls)]
        check_document(data, REPORT_FORMAT, REPORT_VERSION, "window report", names)
        values = {n: data[n] for n in names}
        for name, kinds in _FIELD_KINDS.items():
            if not _has_kind(values[name], kinds):
                raise ReportFormatError(
                    f"malformed report: field {name!r} has type {type(values[name]).__name__}"
                )
        try:
            for name in ("localization", "semantic_localization"):
                values[name] = {k: StageLocalization(**v) for k, v in values[name].items()}
            values["gates"] = Gates.from_dict(values["gates"])
        except (TypeError, AttributeError, StageFrontierError) as exc:
            raise ReportFormatError(f"malformed report: {exc}") from None
        if values["role_reports"] is not None:
            values["role_reports"] = {
                str(role): cls.from_dict(rep) for role, rep in values["role_reports"].items()
            }
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> WindowReport:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ReportFormatError(f"report is not valid JSON: {exc}") from None
        return cls.from_dict(data)


_JSON_KINDS: dict[str, tuple[type, ...]] = {
    "list": (list,),
    "dict": (dict,),
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "None": (type(None),),
    "Gates": (dict,),
}
"""A field's declared type (its outer name) -> the JSON types that stand for it."""


def _json_kinds(declared: str) -> tuple[type, ...]:
    """The JSON types a field declared as ``declared`` is read from: ``dict[str, float] | None``
    is an object or null (what the brackets hold is checked where the value is used)."""
    outer = re.sub(r"\[.*\]", "", declared)
    return tuple(kind for name in outer.split(" | ") for kind in _JSON_KINDS[name])


_FIELD_KINDS = {f.name: _json_kinds(str(f.type)) for f in fields(WindowReport)}
"""The JSON types of every serialized field, checked before a report is rebuilt."""


def _has_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    """``isinstance``, except that a JSON ``true`` is no number: only a bool field takes it."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def _loc_to_dict(loc: StageLocalization) -> dict[str, Any]:
    return {f.name: getattr(loc, f.name) for f in fields(loc)}
