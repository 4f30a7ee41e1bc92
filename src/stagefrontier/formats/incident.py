"""``incidents/<id>/incident.json``: its fields, versioned and checked on read and before
writing, its reader and its writer (the text beside it comes from ``render.incident``)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..analysis.values import check_document, is_int, is_real
from ..errors import ReportFormatError
from .limits import (
    MAX_CAPTURE_STEPS,
    MAX_NAMED_RANKS,
    MAX_STEP,
    MAX_TEXT,
    limit,
    read_capped,
)
from .names import is_plain_name
from .packet import write_bytes_atomically

INCIDENT_FORMAT = "stagefrontier.incident"
INCIDENT_VERSION = 1
INCIDENT_FILE = "incident.json"
TRIGGERS = ("window", "regression", "manual")
MAX_LIST = 1000
"""The most reasons, op diff rows or stage shares an incident may hold."""
WORKER_ROW_NUMBERS = (
    "suspect_ms_per_batch",
    "reference_ms_per_batch",
    "suspect_ms_per_call",
    "reference_ms_per_call",
    "calls_per_batch",
)
"""The numbers of a worker op diff row (checked when an incident is read)."""

Check = Callable[[Any], str]
"""A field's check: what is wrong with the value, or "" when it is fine."""


def _none_or(check: Check) -> Check:
    return lambda v: "" if v is None else check(v)


def _text(v: Any) -> str:
    return "" if isinstance(v, str) and len(v) <= MAX_TEXT else f"text of at most {MAX_TEXT}"


def _whole(low: int, high: int) -> Check:
    return lambda v: "" if is_int(v) and low <= v <= high else f"an integer in {low}..{high}"


def _number(v: Any) -> str:
    return "" if is_real(v) and math.isfinite(v) else "a finite number"


def _amount(v: Any) -> str:
    return "" if is_real(v) and math.isfinite(v) and v >= 0 else "a finite number >= 0"


def _flag(v: Any) -> str:
    return "" if isinstance(v, bool) else "true or false"


def _rank(v: Any) -> str:
    return _whole(0, limit("world_size") - 1)(v) and "a rank number"


def _ranks(v: Any) -> str:
    ok = isinstance(v, list) and len(v) <= MAX_NAMED_RANKS and not any(map(_rank, v))
    return "" if ok else f"a list of at most {MAX_NAMED_RANKS} rank numbers"


def _list_of(check: Check, most: int = MAX_LIST) -> Check:
    def checked(v: Any) -> str:
        if not isinstance(v, list) or len(v) > most:
            return f"a list of at most {most} items"
        return next((f"item {i}: {p}" for i, p in enumerate(map(check, v)) if p), "")

    return checked


def _map_of(key: Check, value: Check, most: int = MAX_LIST) -> Check:
    def checked(v: Any) -> str:
        if not isinstance(v, dict) or len(v) > most:
            return f"an object of at most {most} entries"
        for k, x in v.items():
            problem = key(k) or value(x)
            if problem:
                return f"entry {str(k)[:40]!r}: {problem}"
        return ""

    return checked


def _rank_key(v: Any) -> str:
    return "" if isinstance(v, str) and v.isdigit() and not _rank(int(v)) else "a rank number"


def _steps(v: Any, allow_empty: bool = True) -> str:
    if allow_empty and v == []:
        return ""
    if (
        isinstance(v, list)
        and len(v) == 2
        and all(is_int(x) and 0 <= x <= MAX_STEP for x in v)
        and 0 <= v[1] - v[0] < MAX_CAPTURE_STEPS
    ):
        return ""
    return f"[first, last] steps, first <= last, spanning at most {MAX_CAPTURE_STEPS} steps"


def _object(fields: dict[str, Check], optional: tuple[str, ...] = ()) -> Check:
    def checked(v: Any) -> str:
        if not isinstance(v, dict):
            return "an object"
        for name, check in fields.items():
            if name not in v:
                if name in optional:
                    continue
                return f"lacks {name!r}"
            problem = check(v[name])
            if problem:
                return f"{name!r} must be {problem}"
        return ""

    return checked


_OP_ROW = _object(
    {
        "name": _text,
        "suspect_ms_per_step": _number,
        "reference_ms_per_step": _number,
        "diff_ms_per_step": _number,
        "call_path": _list_of(_text),
    },
    optional=("diff_ms_per_step", "call_path"),
)
_SHARES = _map_of(_text, _number)
_WORKER_ROW = _object({"name": _text, **dict.fromkeys(WORKER_ROW_NUMBERS, _number)})


def _regression(v: Any) -> str:
    """What ``regression_text`` reads: the baseline windows, the top stage and its delta, the
    ranks."""
    problem = _object(
        {
            "baseline_windows": lambda w: "" if _steps_of_windows(w) else "[first, last] windows",
            "top_stage": _text,
            "delta_exposed_ms_per_step": _number,
            "delta_advance_ms_per_step": _SHARES,
            "ranks": _ranks,
            "all_ranks": _flag,
        }
    )(v)
    if not problem and v["top_stage"] not in v["delta_advance_ms_per_step"]:
        problem = "its top stage must have a delta"
    return problem


def _steps_of_windows(w: Any) -> bool:
    return isinstance(w, list) and len(w) == 2 and all(is_int(x) and x >= 0 for x in w)


_REFERENCE_CAPTURE = _object(
    {
        "path": _text,
        "rank": _rank,
        "steps": lambda v: _steps(v, allow_empty=False),
        "incident": _text,
        "from_baseline": _flag,
    },
    optional=("incident", "from_baseline"),
)

REDUCED = ("live", "pending", "after the run", "offline")
"""Where an incident's traces were reduced (``reduced``): on rank 0's router thread as the
capture settled, not yet (the run ended as it settled: left to the process started after the
run), by that process, or by a later ``stagefrontier incident``."""

_FIELDS: dict[str, Check] = {
    "id": lambda v: "" if is_plain_name(v) else "a plain name",
    "trigger": lambda v: "" if v in TRIGGERS else f"one of {', '.join(TRIGGERS)}",
    "window": _none_or(_whole(0, MAX_STEP)),
    "steps": _steps,
    "stage": _none_or(_text),
    "leader_rank": _none_or(_rank),
    "reference_rank": _none_or(_rank),
    "requested_ranks": _ranks,
    "ranks": _ranks,
    "trace_files": _map_of(_rank_key, _text, MAX_NAMED_RANKS),
    "trace_hosts": _map_of(_rank_key, _text, MAX_NAMED_RANKS),
    "trace_bytes": _map_of(_rank_key, _whole(0, 2**62), MAX_NAMED_RANKS),
    "captured": _flag,
    "confirmed": _none_or(_flag),
    "max_share_diff": _none_or(_amount),
    "trace_shares": _SHARES,
    "live_shares": _SHARES,
    "op_diff": _list_of(_OP_ROW),
    "capture_step_ms": _none_or(_amount),
    "baseline_step_ms": _none_or(_amount),
    "time_to_confirmation_s": _none_or(_amount),
    "reasons": _list_of(_text),
}
"""Every field of an incident and its check (type and range), run on read and before writing."""
_OPTIONAL_FIELDS: dict[str, Check] = {
    "regression": _none_or(_regression),
    "reference_capture": _none_or(_REFERENCE_CAPTURE),
    "router_cpu_s": _none_or(
        _object({"export": _map_of(_rank_key, _amount), "reduction": _amount})
    ),
    "training_thread_s": _none_or(_map_of(_rank_key, _amount)),
    "worker_op_diff": _none_or(_list_of(_WORKER_ROW)),
    "loader_advice": _none_or(_text),
    "loader": _none_or(_object({"saturated": _flag}, optional=("saturated",))),
    "reduced": _none_or(lambda v: "" if v in REDUCED else f"one of {', '.join(REDUCED)}"),
    "baseline_steps": _none_or(
        lambda v: "" if _steps_of_windows(v) and v[0] <= v[1] <= MAX_STEP else "[first, last]"
    ),
}
"""Fields a regression's incident adds (the regression object; the earlier trace diffed
against), checked when present: incidents written before them still read."""


def new_incident(incident_id: str, trigger: str) -> dict[str, Any]:
    return {
        "format": INCIDENT_FORMAT,
        "version": INCIDENT_VERSION,
        "id": incident_id,
        "trigger": trigger,
        "window": None,
        "steps": [],
        "stage": None,
        "leader_rank": None,
        "reference_rank": None,
        "requested_ranks": [],
        "ranks": [],
        "trace_files": {},
        "trace_hosts": {},
        "trace_bytes": {},
        "captured": False,
        "confirmed": None,
        "max_share_diff": None,
        "trace_shares": {},
        "live_shares": {},
        "op_diff": [],
        "capture_step_ms": None,
        "baseline_step_ms": None,
        "time_to_confirmation_s": None,
        "reasons": [],
        "regression": None,
        "reference_capture": None,
        "router_cpu_s": None,
    }


def check_incident(data: Any, source: str = "incident") -> dict[str, Any]:
    """The incident, validated: format, version, and every field's type and range (ids are
    plain names, step spans bounded, numbers finite), so that nothing a reader or renderer does
    with it can fail or grow with what a crafted file states.

    Raises:
        ReportFormatError: naming the first field that is wrong and what it must be.
    """
    document = check_document(data, INCIDENT_FORMAT, INCIDENT_VERSION, "incident", source=source)
    for name, check in {**_FIELDS, **_OPTIONAL_FIELDS}.items():
        if name not in document:
            if name in _OPTIONAL_FIELDS:
                continue
            raise ReportFormatError(f"{source}: incident is missing field {name!r}")
        problem = check(document[name])
        if problem:
            raise ReportFormatError(f"{source}: incident field {name!r} must be {problem}")
    return document


def write_incident_files(
    folder: str | os.PathLike[str], incident: dict[str, Any], markdown: str
) -> Path:
    """Write ``incident.json`` and ``incident.md`` (``markdown``, from
    ``render.incident.render_markdown``), each atomically (a failed write, say on a full disk,
    raises OSError and leaves the previous file and no temporary one); returns the JSON path."""
    check_incident(incident)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(incident, indent=1, allow_nan=False)
    write_bytes_atomically(path / INCIDENT_FILE, text.encode())
    write_bytes_atomically(path / "incident.md", markdown.encode())
    return path / INCIDENT_FILE


def read_incident(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an incident from its folder or its ``incident.json`` (a regular file within the
    ``incident_bytes`` limit); raises ReportFormatError."""
    p = Path(path)
    if p.is_dir():
        p = p / INCIDENT_FILE
    try:
        data = json.loads(read_capped(p, "incident_bytes"))
    except ReportFormatError as exc:
        raise ReportFormatError(f"{p}: {exc}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"{p}: not a readable incident: {_why(exc)}") from None
    return check_incident(data, str(p))


def _why(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def scan_incidents(
    out_dir: str | os.PathLike[str],
) -> tuple[list[tuple[Path, dict[str, Any]]], list[str]]:
    """The incident folders under ``out_dir/incidents`` with their incidents, found by folder
    (a renamed or copied folder is read where it is), and one line per folder whose
    ``incident.json`` cannot be read."""
    found: list[tuple[Path, dict[str, Any]]] = []
    problems: list[str] = []
    for path in sorted((Path(out_dir) / "incidents").glob(f"*/{INCIDENT_FILE}")):
        try:
            found.append((path.parent, read_incident(path)))
        except ReportFormatError as exc:
            problems.append(f"skipped {exc}")
    return found, problems


def list_incidents(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable incidents under ``out_dir/incidents``, oldest first (``scan_incidents``
    also says which were skipped)."""
    return [incident for _, incident in scan_incidents(out_dir)[0]]
