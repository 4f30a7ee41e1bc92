"""``incidents/<id>/incident.json`` (versioned, validated on read) and ``incident.md``."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ..analysis.regression import regression_text
from ..errors import ReportFormatError
from .command import cli_command
from .loader_text import WORKER_ROW_NUMBERS, worker_line

INCIDENT_FORMAT = "stagefrontier.incident"
INCIDENT_VERSION = 1
INCIDENT_FILE = "incident.json"

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "version": int,
    "id": str,
    "trigger": str,
    "window": (int, type(None)),
    "steps": list,
    "stage": (str, type(None)),
    "leader_rank": (int, type(None)),
    "reference_rank": (int, type(None)),
    "requested_ranks": list,
    "ranks": list,
    "trace_files": dict,
    "trace_hosts": dict,
    "trace_bytes": dict,
    "captured": bool,
    "confirmed": (bool, type(None)),
    "max_share_diff": (int, float, type(None)),
    "trace_shares": dict,
    "live_shares": dict,
    "op_diff": list,
    "capture_step_ms": (int, float, type(None)),
    "baseline_step_ms": (int, float, type(None)),
    "time_to_confirmation_s": (int, float, type(None)),
    "reasons": list,
}
"""Every field of an incident and its JSON type, checked on read."""
_OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "regression": (dict, type(None)),
    "reference_capture": (dict, type(None)),
    "router_cpu_s": (dict, type(None)),
    "worker_op_diff": (list, type(None)),
    "loader_advice": (str, type(None)),
    "loader": (dict, type(None)),
}
"""Fields a regression's incident adds (the regression object; the earlier trace diffed
against), type-checked when present: incidents written before them still read."""


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
    """The incident, validated: format, version, every field and its type, the op diff rows."""
    if not isinstance(data, dict):
        raise ReportFormatError(f"{source}: an incident must be a JSON object")
    if data.get("format") != INCIDENT_FORMAT:
        raise ReportFormatError(f"{source}: not an incident (format={data.get('format')!r})")
    if data.get("version") != INCIDENT_VERSION:
        raise ReportFormatError(
            f"{source}: incident version {data.get('version')!r} is not supported "
            f"(this stagefrontier reads version {INCIDENT_VERSION})"
        )
    for name, kinds in _FIELDS.items():
        if name not in data:
            raise ReportFormatError(f"{source}: incident is missing field {name!r}")
        value = data[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _tuple(kinds)):
            raise ReportFormatError(
                f"{source}: incident field {name!r} has type {type(value).__name__}"
            )
    for name, kinds in _OPTIONAL_FIELDS.items():
        if not isinstance(data.get(name), kinds):
            raise ReportFormatError(
                f"{source}: incident field {name!r} has type {type(data[name]).__name__}"
            )
    earlier = data.get("reference_capture")
    if earlier is not None and not (
        isinstance(earlier.get("path"), str)
        and isinstance(earlier.get("rank"), int)
        and isinstance(earlier.get("steps"), list)
        and len(earlier["steps"]) == 2
        and all(isinstance(x, int) for x in earlier["steps"])
    ):
        raise ReportFormatError(f"{source}: malformed reference_capture {earlier!r:.80}")
    if len(data["steps"]) not in (0, 2):
        raise ReportFormatError(f"{source}: incident field 'steps' must be [first, last]")
    for row in data["op_diff"]:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise ReportFormatError(f"{source}: malformed op_diff entry {row!r}")
        for key in ("suspect_ms_per_step", "reference_ms_per_step"):
            if not isinstance(row.get(key), (int, float)):
                raise ReportFormatError(f"{source}: op_diff entry lacks a number {key!r}")
    for row in data.get("worker_op_diff") or []:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise ReportFormatError(f"{source}: malformed worker_op_diff entry {row!r:.80}")
        for key in WORKER_ROW_NUMBERS:
            if not isinstance(row.get(key), (int, float)) or isinstance(row.get(key), bool):
                raise ReportFormatError(f"{source}: worker_op_diff entry lacks a number {key!r}")
    return data


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def write_incident(folder: str | os.PathLike[str], incident: dict[str, Any]) -> Path:
    """Write ``incident.json`` (atomically) and ``incident.md``; returns the JSON path."""
    check_incident(incident)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (INCIDENT_FILE + ".tmp")
    tmp.write_text(json.dumps(incident, indent=1, allow_nan=False))
    os.replace(tmp, path / INCIDENT_FILE)
    (path / "incident.md").write_text(render_markdown(incident))
    return path / INCIDENT_FILE


def read_incident(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an incident from its folder or its ``incident.json``; raises ReportFormatError."""
    p = Path(path)
    if p.is_dir():
        p = p / INCIDENT_FILE
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportFormatError(f"{p}: not a readable incident: {exc}") from None
    return check_incident(data, str(p))


def list_incidents(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The readable incidents under ``out_dir/incidents``, oldest first."""
    root = Path(out_dir) / "incidents"
    found = []
    for path in sorted(root.glob(f"*/{INCIDENT_FILE}")):
        try:
            found.append(read_incident(path))
        except ReportFormatError:
            continue
    return found


def verdict(incident: dict[str, Any]) -> str:
    if not incident["captured"]:
        return "not captured"
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
    """One line: id, stage, suspect rank, verdict, the top op-diff line."""
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
    cost = router_cost_text(incident)
    if cost:
        parts.append(cost)
    return " | ".join(parts)


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
    that it runs as printed (``render.command``)."""
    files = incident["trace_files"]
    if not files:
        return []
    folder = str(Path(next(iter(files.values()))).parent)
    suspect = str(incident["leader_rank"])
    rank = int(suspect) if suspect in files else int(next(iter(files)))
    ranks = ", ".join(f"{int(r)}: '{p}'" for r, p in sorted(files.items()))
    hta = (
        f"t = TraceAnalysis(trace_files={{{ranks}}}, trace_dir='{folder}'); "
        f"print(t.t.get_trace({rank}))"
    )
    command = cli_command()
    return [
        "# open in https://ui.perfetto.dev (or chrome://tracing): drag in "
        + " ".join(Path(p).name for p in files.values()),
        f"{command} incident {shlex.quote(folder)}",
        f"{command} analyze {shlex.quote(folder)}  # every captured rank; or --format hta",
        f'{shlex.quote(sys.executable)} -c "from hta.trace_analysis import TraceAnalysis; {hta}"',
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
            f"{_ms(incident['capture_step_ms'])}, outside it {_ms(incident['baseline_step_ms'])}",
        ),
    ]
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
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"
