"""A stored report (a ``windows.jsonl`` record's, a packet's) and the window facts stored
beside it, checked value by value.

``WindowReport.from_dict`` checks each field's container type; the report and plot commands then
format what is inside (shares as percentages, leaders as ranks, reasons as lines, the window's
steps, hosts and lead scope). Stored data is input like any other, so every value a renderer
reads is checked here first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..analysis.evidence import StageLocalization
from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError
from .wall_clock import wall_clock_problem

Check = Callable[[Any], bool]


_INT_BOUND = 1 << 63
"""JSON integers beyond int64 are corrupt here (and overflow a float when divided)."""


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < _INT_BOUND


def _number(value: Any) -> bool:
    return isinstance(value, float) or _int(value)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _list_of(check: Check) -> Check:
    return lambda value: isinstance(value, list) and all(check(x) for x in value)


def _dict_of(check: Check) -> Check:
    return lambda value: (
        isinstance(value, dict) and all(isinstance(k, str) and check(v) for k, v in value.items())
    )


_LOCALIZATION: dict[str, Check] = {
    "leader_rank": _optional(_int),
    "leader_fraction": _number,
    "confident_steps": _int,
    "leader_switches": _int,
    "tied_ranks": _list_of(_int),
    "lag_mean_s": _number,
    "delta_lag_mean_s": _number,
    "gap_mean_s": _optional(_number),
    "leading_ranks": _list_of(_int),
    "lag_error_bound_s": _number,
    "tie_truncated_steps": _int,
}


def _localization(value: Any) -> bool:
    return isinstance(value, StageLocalization) and all(
        check(getattr(value, name)) for name, check in _LOCALIZATION.items()
    )


_FIELDS: dict[str, Check] = {
    "stages": _list_of(_str),
    "n_steps": _int,
    "n_ranks": _int,
    "exposed_s": _number,
    "shares": _dict_of(_number),
    "advances": _dict_of(_number),
    "direct_gain": _dict_of(_number),
    "routing_set": _list_of(_str),
    "labels": _list_of(_str),
    "reasons": _dict_of(_list_of(_str)),
    "co_critical_stages": _list_of(_str),
    "leaders": _dict_of(_optional(_int)),
    "localization": _dict_of(_localization),
    "semantic_shares": _dict_of(_number),
    "semantic_gain": _dict_of(_number),
    "semantic_localization": _dict_of(_localization),
    "residual_share": _number,
    "overlap_share": _number,
    "roles": _optional(_list_of(_str)),
    "role_shares": _optional(_dict_of(lambda v: bool(v) and _dict_of(_number)(v))),
    "forward_event": _optional(_dict_of(_number)),
}
_PER_STAGE = ("shares", "advances", "direct_gain", "leaders", "localization")
_PER_SEMANTIC_STAGE = ("semantic_gain", "semantic_localization")


def check_stored_report(report: WindowReport) -> WindowReport:
    """``report`` when every value has its type, it covers at least one step and rank, and its
    per-stage tables hold one value per stage (the semantic ones one per semantic stage), and its
    top stages are among its semantic shares.

    Raises:
        ReportFormatError: the first field that does not, by name.
    """
    for name, check in _FIELDS.items():
        if not check(getattr(report, name)):
            raise ReportFormatError(
                f"malformed report: field {name!r} holds a value of a wrong type"
            )
    if report.n_steps < 1 or report.n_ranks < 1:
        raise ReportFormatError(
            f"a report of {report.n_steps} step(s) and {report.n_ranks} rank(s)"
        )
    for names, keys in (
        (_PER_STAGE, set(report.stages)),
        (_PER_SEMANTIC_STAGE, set(report.semantic_shares)),
    ):
        for name in names:
            if set(getattr(report, name)) != keys:
                raise ReportFormatError(
                    f"malformed report: field {name!r} does not hold one value per stage"
                )
    for name in ("top1", "top2"):
        top = getattr(report, name)
        if top is not None and top not in report.semantic_shares:
            raise ReportFormatError(f"malformed report: {name} {top!r} has no share")
    for role, own in (report.role_reports or {}).items():
        try:
            check_stored_report(own)
        except ReportFormatError as exc:
            raise ReportFormatError(f"role {role}'s report: {exc}") from None
    return report


_LEAD: dict[str, Check] = {"scope": _str, "ranks": _list_of(_int), "hosts": _list_of(_str)}
_META: dict[str, Check] = {
    "window": lambda v: _int(v) and v >= 0,
    "attempt": lambda v: _int(v) and v >= 0,
    "first_step": _int,
    "last_step": _int,
    "world_size": _int,
    "ranks_present": _list_of(_int),
    "missing_ranks": _list_of(_int),
    "gather_ok": lambda v: isinstance(v, bool),
    "paused_steps": lambda v: _int(v) and v >= 0,
    "self_cost": lambda v: isinstance(v, dict),
    "hosts": lambda v: _dict_of(_str)(v) or _list_of(_str)(v),
    "lead": lambda v: (
        v is None  # no top stage: mixed roles, or no exposed time
        or (
            isinstance(v, dict)
            and all(check(v[k]) for k, check in _LEAD.items() if k in v)
            and (v.get("scope") != "node" or bool(v.get("hosts") and "ranks" in v))
        )
    ),
    "block_lead": lambda v: (
        v is None  # no data wait on top, or no DataLoader handing batches over in bursts
        or (
            isinstance(v, dict)
            and _str(v.get("stage"))
            and _str(v.get("why"))
            and _int(v.get("size"))
            and v["size"] >= 2
            and (v.get("rank") is None or (_int(v["rank"]) and v["rank"] >= 0))
        )
    ),
    "wall_clock": lambda v: not wall_clock_problem(v),
}


def check_window_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (a record's window facts, a packet's ``meta``) when each fact a renderer reads
    has its type (other keys are free-form).

    Raises:
        ReportFormatError: the first fact that does not, by name.
    """
    for key, check in _META.items():
        if key in meta and not check(meta[key]):
            raise ReportFormatError(f"window fact {key!r} is malformed: {meta[key]!r:.60}")
    return meta
