"""``incidents/<id>/incident.json`` (versioned, validated on read) and ``incident.md``."""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..analysis.regression import regression_text
from ..analysis.values import check_document, is_int, is_real
from ..errors import ReportFormatError
from ..formats.limits import (
    MAX_CAPTURE_STEPS,
    MAX_NAMED_RANKS,
    MAX_STEP,
    MAX_TEXT,
    limit,
    read_capped,
)
from ..formats.names import is_plain_name
from ..formats.packet import write_bytes_atomically
from .command import cli_command
from .escape import printable, printable_lines
from .loader_text import WORKER_ROW_NUMBERS, worker_line

INCIDENT_FORMAT = "stagefrontier.incident"
INCIDENT_VERSION = 1
INCIDENT_FILE = "incident.json"
TRIGGERS = ("window", "regression", "manual")
MAX_LIST = 1000
"""The most reasons, op diff rows or stage shares an incident may hold."""

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

REDUCED_WORDS = {
    "pending": "not yet: the run ended as the capture settled, a process of its own reduces it",
    "after the run": "after the run, by a process of its own (the run ended as it settled)",
    "offline": "offline, by `stagefrontier incident`",
}
"""How ``detail_facts`` states where the traces were reduced, other than live on rank 0."""

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


def write_incident(folder: str | os.PathLike[str], incident: dict[str, Any]) -> Path:
    """Write ``incident.json`` and ``incident.md``, each atomically (a failed write, say on a
    full disk, raises OSError and leaves the previous file and no temporary one); returns the
    JSON path."""
    check_incident(incident)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    text = json.dumps(incident, indent=1, allow_nan=False)
    write_bytes_atomically(path / INCIDENT_FILE, text.encode())
    write_bytes_atomically(path / "incident.md", render_markdown(incident).encode())
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


def verdict(incident: dict[str, Any]) -> str:
    if not incident["captured"]:
        return "not captured"
    if incident["confirmed"] is False:
        trace, live = incident["trace_shares"], incident["live_shares"]
        top = max(trace, key=trace.__getitem__) if trace else None
        if top is not None and live and top == max(live, key=live.__getitem__):
            return f"not confirmed (the trace and the live steps agree: top {top})"
    if incident["confirmed"] is None and incident.get("reduced") == "pending":
        return "not reduced yet (a process of its own reduces it after the run)"
    if incident["confirmed"] is None and incident.get("reduced") in REDUCED:
        return "reduced, but neither confirmed nor refuted (the reasons say why)"
    return {True: "confirmed", False: "disagrees", None: "not reduced"}[incident["confirmed"]]


def top_op_line(incident: dict[str, Any]) -> str:
    """``inside data.next_wait, `faults.py(120): delay › sleep` takes 120.3 ms/step on rank 2
    and 0.0 ms on rank 0``; empty without an op diff."""
    if not incident["op_diff"]:
        return ""
    top = incident["op_diff"][0]
    return (
        f"inside {incident['stage']}, `{top['name']}` takes {top['suspect_ms_per_step']:.1f} "
        f"ms/step on rank {incident['leader_rank']} and {top['reference_ms_per_step']:.1f} ms "
        f"{reference_text(incident)}"
    )


def reference_text(incident: dict[str, Any]) -> str:
    """What the suspect was compared with: ``on rank 0``, ``in its own steps 20-24`` (an
    earlier capture of the same rank), or ``with nothing to compare``."""
    earlier = incident.get("reference_capture")
    if earlier:
        first, last = earlier["steps"]
        return f"in rank {earlier['rank']}'s own steps {first}-{last}"
    if incident["reference_rank"] is None or incident["reference_rank"] == incident["leader_rank"]:
        return "with nothing to compare (no earlier trace)"
    return f"on rank {incident['reference_rank']}"


def summary_line(incident: dict[str, Any]) -> str:
    """One line (escaped: names from traces and the store stay on it): id, stage, suspect rank,
    verdict, the top op-diff line."""
    steps = incident["steps"]
    earlier = incident.get("reference_capture")
    reference = (
        f"reference: its steps {earlier['steps'][0]}-{earlier['steps'][1]}"
        if earlier
        else f"reference rank {incident['reference_rank']}"
    )
    parts = [
        f"incident {incident['id']}"
        + (" (regression)" if incident["trigger"] == "regression" else ""),
        f"{incident['stage'] or 'no stage'} on rank {incident['leader_rank']} ({reference})",
        f"steps {steps[0]}-{steps[1]}" if steps else "no steps",
        verdict(incident),
    ]
    top = top_op_line(incident)
    workers = worker_line(incident)
    if workers:
        parts.append(workers)
    if top:
        parts.append(top)
    if incident.get("loader_advice"):
        parts.append(incident["loader_advice"])
    elif not top and incident["reasons"]:
        parts.append(incident["reasons"][-1])
    cost = capture_cost_text(incident)
    if cost:
        parts.append(cost)
    return printable(" | ".join(parts))


def capture_cost_text(incident: dict[str, Any]) -> str:
    """What the incident cost the job: the capture's time on each captured rank's training
    thread (``training_thread_s``), then the router threads' CPU (``router_cpu_s``), e.g.
    ``the capture took 41 ms on rank 2's training thread and 38 ms on rank 0's; capture and
    reduction took 0.61 s of CPU on the router's background threads (...)``; empty when
    neither was recorded."""
    training = incident.get("training_thread_s")
    items = [
        (rank, value)
        for rank, value in (training.items() if isinstance(training, dict) else ())
        if isinstance(value, (int, float))
    ]
    spent = " and ".join(
        f"{value * 1e3:.0f} ms on rank {rank}'s" + (" training thread" if i == 0 else "")
        for i, (rank, value) in enumerate(items)
    )
    parts = [f"the capture took {spent}" if spent else "", router_cost_text(incident)]
    return "; ".join(part for part in parts if part)


def router_cost_text(incident: dict[str, Any]) -> str:
    """``capture and reduction took 0.61 s of CPU on the router threads (trace export: rank 2
    0.21 s, rank 0 0.25 s; reduction on rank 0 0.15 s)``; empty when not recorded."""
    cost = incident.get("router_cpu_s")
    if not isinstance(cost, dict):
        return ""
    export = cost.get("export")
    if not isinstance(export, dict):
        export = {}
    reduction = cost.get("reduction")
    numbers = [v for v in export.values() if isinstance(v, (int, float))]
    if isinstance(reduction, (int, float)):
        numbers.append(reduction)
    if not numbers:
        return ""
    exports = ", ".join(
        f"rank {r} {v:.2f} s" for r, v in export.items() if isinstance(v, (int, float))
    )
    detail = "; ".join(
        part
        for part in (
            f"trace export: {exports}" if exports else "",
            f"reduction on rank 0 {reduction:.2f} s" if isinstance(reduction, (int, float)) else "",
        )
        if part
    )
    return (
        f"capture and reduction took {sum(numbers):.2f} s of CPU on the router's background "
        f"threads ({detail})"
    )


def open_commands(incident: dict[str, Any]) -> list[str]:
    """Shell commands to look at the traces: Perfetto / the trace viewer, the reduction and op
    diff again, the captured ranks through the analyzer (Kineto or HTA reader), the events in
    HTA (given as files: the folder also holds ``incident.json``). Each command is spelled so
    that it runs as printed (``render.command``), every path quoted for the shell
    (``shlex.quote``; Python literals inside the ``-c`` program): a space or a ``$(...)`` in a
    path is pasted as part of the path."""
    files = incident["trace_files"]
    if not files:
        return []
    quote = shlex.quote
    folder = str(Path(next(iter(files.values()))).parent)
    suspect = str(incident["leader_rank"])
    rank = int(suspect) if suspect in files else int(next(iter(files)))
    ranks = ", ".join(f"{int(r)}: {p!r}" for r, p in sorted(files.items()))
    hta = (
        "from hta.trace_analysis import TraceAnalysis; "
        f"t = TraceAnalysis(trace_files={{{ranks}}}, trace_dir={folder!r}); "
        f"print(t.t.get_trace({rank}))"
    )
    command = cli_command()
    return [
        "# open in https://ui.perfetto.dev (or chrome://tracing): drag in "
        + " ".join(quote(Path(p).name) for p in files.values()),
        f"{command} incident {quote(folder)}",
        f"{command} analyze {quote(folder)}  # every captured rank; or --format hta",
        f"{quote(sys.executable)} -c {quote(hta)}",
    ]


TRIGGER_WORDS = {
    "window": "an actionable window",
    "regression": "a regression against the run's healthy windows",
    "manual": "a manual capture request",
}
"""What opened an incident, in words."""


def _share_difference(diff: float | None) -> str:
    if diff is None:
        return ""
    return f" (trace and live shares differ by at most {diff * 100:.1f} percentage points)"


def detail_facts(incident: dict[str, Any]) -> list[tuple[str, str]]:
    """The incident's facts as ``(name, value)`` pairs, for ``incident.md`` and the page."""
    steps = incident["steps"]
    trigger = TRIGGER_WORDS.get(incident["trigger"], incident["trigger"])
    facts = [("trigger", f"{trigger} (window {incident['window']})")]
    if incident.get("regression"):
        facts.append(("slower than the baseline", regression_text(incident["regression"])))
    facts += [
        (
            "stage",
            f"{incident['stage']}; suspect rank {incident['leader_rank']}, reference rank "
            f"{incident['reference_rank']}",
        ),
        ("captured steps", f"{steps[0]}-{steps[1]}" if steps else "none"),
        ("captured ranks", f"{incident['ranks']} of requested {incident['requested_ranks']}"),
        ("verdict", f"{verdict(incident)}{_share_difference(incident['max_share_diff'])}"),
        (
            "step time during capture",
            f"{_ms(incident['capture_step_ms'])}, outside it "
            + _baseline_steps(incident)
            + _ms(incident["baseline_step_ms"]),
        ),
    ]
    reduced = incident.get("reduced")
    if incident["captured"] and reduced in REDUCED_WORDS:
        facts.append(("reduced", REDUCED_WORDS[reduced]))
    return facts


def render_markdown(incident: dict[str, Any]) -> str:
    lines = [f"# Incident {incident['id']}", "", summary_line(incident), ""]
    lines += [f"- {name}: {value}" for name, value in detail_facts(incident)]
    lines.append("")
    if incident["trace_shares"]:
        lines += ["| stage | trace share | live share |", "|---|---:|---:|"]
        for stage, share in incident["trace_shares"].items():
            live = incident["live_shares"].get(stage, float("nan"))
            lines.append(f"| {stage} | {share:.1%} | {live:.1%} |")
        lines.append("")
    if incident["op_diff"]:
        lines += [
            f"Op diff inside {incident['stage']} (self time per step, suspect rank "
            f"{incident['leader_rank']} vs the reference: {reference_text(incident)}):",
            "",
            "| op / function | suspect ms/step | reference ms/step |",
            "|---|---:|---:|",
        ]
        for row in incident["op_diff"]:
            lines.append(
                f"| `{row['name']}` | {row['suspect_ms_per_step']:.2f} | "
                f"{row['reference_ms_per_step']:.2f} |"
            )
        lines.append("")
    if incident.get("worker_op_diff"):
        lines += [
            f"Rank {incident['leader_rank']}'s DataLoader workers (self time per batch, against "
            f"rank {incident['reference_rank']}'s):",
            "",
            "| worker function | suspect ms/batch | reference ms/batch | calls/batch |",
            "|---|---:|---:|---:|",
            *(
                f"| `{row['name']}` | {row['suspect_ms_per_batch']:.2f} | "
                f"{row['reference_ms_per_batch']:.2f} | {row['calls_per_batch']:g} |"
                for row in incident["worker_op_diff"]
            ),
            "",
        ]
    if incident["reasons"]:
        lines += ["Reasons:", "", *(f"- {r}" for r in incident["reasons"]), ""]
    commands = open_commands(incident)
    if commands:
        lines += ["Open the traces:", "", "```", *commands, "```", ""]
    return printable_lines(lines)


def _baseline_steps(incident: dict[str, Any]) -> str:
    """``(steps 20-49, since the window that opened it) `` when the incident says which steps
    its step time outside the capture comes from."""
    steps = incident.get("baseline_steps")
    if not steps:
        return ""
    return f"(steps {steps[0]}-{steps[1]}, since the window that opened it) "


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
