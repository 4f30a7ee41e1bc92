"""An incident's text: its verdict, its summary line and ``incident.md`` (the file itself:
``formats.incident``)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Any

from ..analysis.gates import Gates
from ..formats.incident import write_incident_files
from ..formats.names import is_plain_name
from ..formats.wall_clock import span_text
from .command import cli_command
from .escape import printable, printable_lines
from .loader_text import worker_line
from .regression_text import regression_text

REDUCED_WORDS = {
    "pending": "not yet: the run ended as the capture settled, a process of its own reduces it",
    "after the run": "after the run, by a process of its own (the run ended as it settled)",
    "offline": "offline, by `stagefrontier incident`",
}
"""How ``detail_facts`` states where the traces were reduced, other than live on rank 0."""


def verdict(incident: dict[str, Any]) -> str:
    if not incident["captured"]:
        return "not captured"
    if incident["confirmed"] is False:
        trace, live = incident["trace_shares"], incident["live_shares"]
        top = max(trace, key=trace.__getitem__) if trace else None
        if top is not None and live and top == max(live, key=live.__getitem__):
            return f"not confirmed ({_why_not(incident, top)})"
    if incident["confirmed"] is None and incident.get("reduced") == "pending":
        return "not reduced yet (a process of its own reduces it after the run)"
    if incident["confirmed"] is None and incident.get("reduced") in (
        "live",
        "after the run",
        "offline",
    ):
        return "reduced, but neither confirmed nor refuted (the reasons say why)"
    return {True: "confirmed", False: "disagrees", None: "not reduced"}[incident["confirmed"]]


def _why_not(incident: dict[str, Any], top: str) -> str:
    """Why an incident whose trace and live steps name the same top stage is not confirmed, as
    one clause that supports it: the routed stage is not that top, a share moved by more than
    the tie tolerance, or the suspect's lead in the trace is too small to matter."""
    stage = incident["stage"]
    if stage is not None and stage != top:
        return f"the captured steps put {top} on top, not the routed {stage}"
    diff = incident.get("max_share_diff")
    if isinstance(diff, (int, float)) and diff >= Gates.share_tie:
        return f"a stage's share in the trace differs from the live steps' by {diff}"
    return (
        f"in the trace rank {incident['leader_rank']}'s lead over rank "
        f"{incident['reference_rank']} in {stage or top} is under the material share of the step"
    )


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
    thread (``training_thread_s``: time the rank's steps spent in the capture, stop included)
    and the router threads' CPU (``router_cpu_s``), each said apart (one is wall time, the
    other CPU time: their sum would be neither), e.g. ``the capture cost the job 41 ms on rank
    2's training thread and 38 ms on rank 0's (0.08 s of training-thread time), and 0.61 s of
    CPU off the training threads (...)``; empty when neither was recorded."""
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
    router = router_cpu(incident)
    background = router_cost_text(router)
    if not spent:
        return f"capture and reduction took {background}" if background else ""
    if not background:
        return f"the capture took {spent}"
    training_s = sum(value for _, value in items)
    return (
        f"the capture cost the job {spent} ({training_s:.2f} s of training-thread time), "
        f"and {background}"
    )


def router_cpu(incident: dict[str, Any]) -> dict[str, float]:
    """The router threads' CPU seconds by part (``export rank 2``, ``reduction``) from the
    incident's ``router_cpu_s``; empty when not recorded."""
    cost = incident.get("router_cpu_s")
    if not isinstance(cost, dict):
        return {}
    export = cost.get("export")
    parts = {
        f"export rank {rank}": value
        for rank, value in (export.items() if isinstance(export, dict) else ())
        if isinstance(value, (int, float))
    }
    reduction = cost.get("reduction")
    if isinstance(reduction, (int, float)):
        parts["reduction"] = reduction
    return parts


def router_cost_text(parts: dict[str, float]) -> str:
    """``0.61 s of CPU off the training threads (trace writers: rank 2 0.21 s, rank 0 0.25 s;
    reduction on rank 0's router thread 0.15 s)`` for ``router_cpu``'s parts; empty without
    any. A rank's trace writer is a process forked for it (``route.trace_writer``), or its
    router thread where it cannot fork; its CPU includes the trace's slice for the reduction."""
    if not parts:
        return ""
    exports = ", ".join(
        f"{name.removeprefix('export ')} {value:.2f} s"
        for name, value in parts.items()
        if name.startswith("export ")
    )
    detail = "; ".join(
        part
        for part in (
            f"trace writers: {exports}" if exports else "",
            f"reduction on rank 0's router thread {parts['reduction']:.2f} s"
            if "reduction" in parts
            else "",
        )
        if part
    )
    return f"{sum(parts.values()):.2f} s of CPU off the training threads ({detail})"


HERE = "# in the incident's folder (the one holding incident.json), wherever it was copied:"
"""The line above the commands: they name the folder as ``.`` and the traces by file name."""


def open_commands(incident: dict[str, Any]) -> list[str]:
    """Shell commands to look at the traces: Perfetto / the trace viewer, the reduction and op
    diff again, the captured ranks through the analyzer (Kineto or HTA reader), the events in
    HTA (given as files: the folder also holds ``incident.json``). They are run in the
    incident's folder (``.``, the traces by file name), so they stay right on a copied folder;
    each is spelled so that it runs as printed (``render.command``). The HTA program is in
    double quotes when the file names are plain (nothing the shell would expand), each name
    otherwise quoted for the shell (``shlex.quote``) with the program."""
    files = incident["trace_files"]
    if not files:
        return []
    names = {int(rank): Path(path).name for rank, path in files.items()}
    suspect = int(incident["leader_rank"]) if incident["leader_rank"] is not None else -1
    rank = suspect if suspect in names else min(names)
    ranks = ", ".join(f"{r}: {name!r}" for r, name in sorted(names.items()))
    hta = (
        "from hta.trace_analysis import TraceAnalysis; "
        f"t = TraceAnalysis(trace_files={{{ranks}}}, trace_dir='.'); "
        f"print(t.t.get_trace({rank}))"
    )
    plain = all(is_plain_name(name) for name in names.values())
    program = f'"{hta}"' if plain else shlex.quote(hta)
    command = cli_command()
    return [
        "# open in https://ui.perfetto.dev (or chrome://tracing): drag in "
        + " ".join(shlex.quote(name) for name in names.values()),
        HERE,
        f"{command} incident .",
        f"{command} analyze .  # every captured rank; or --format hta",
        f"{shlex.quote(sys.executable)} -c {program}",
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
    when = span_text(incident, dated=True)
    if when != "?":  # incidents written before the times were kept have none
        facts.append(("opened, last written", when))
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


def write_incident(folder: str | os.PathLike[str], incident: dict[str, Any]) -> Path:
    """Write ``incident.json`` and its ``incident.md`` (``formats.incident.write_incident_files``);
    returns the JSON path."""
    return write_incident_files(folder, incident, render_markdown(incident))


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
