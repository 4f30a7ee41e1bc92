"""What the end of a run costs each rank when an incident has just closed or is still open.

Runs the demo job (4 Gloo DDP ranks on CPU, windows of 20, a 120 ms data stall on rank 2, the
router on, 5 captured steps) for 33 steps: window 0 opens an incident whose capture (steps 26-30)
ends just before training does, so rank 0 settles it as its timer closes. Reports per run and
rank the wall time of ``timer.close()`` (the demo's ``close-time-rank<r>.json``), where the
incident was reduced (``reduced``: ``live`` on rank 0's router thread, ``after the run`` by the
process rank 0 starts as it closes; none on a revision without the field), its verdict, and how
long after the job's end the script saw it reduced. ``--steps`` moves the run's end (e.g.
28 ends it during the capture).

    python benchmarks/end_of_run.py
    python benchmarks/end_of_run.py --runs 3

Wall-clock figures on a shared machine: read them with the load average recorded beside them.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness_common import command_line, load_text, result_header, script_parser, write_result
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.formats.incident import list_incidents
from stagefrontier.render.incident import verdict

RANKS = 4
AFTER_RUN_WAIT_S = 300.0
"""How long the script waits for the after-run process to reduce the incident."""
TARGET_S = 1.0
"""The end of the run: at most this long in ``timer.close()`` on every rank."""


def measure(out_dir: Path, steps: int) -> dict[str, Any]:
    config = DemoConfig(
        ranks=RANKS,
        steps=steps,
        window=20,
        faults=(parse_fault("data@2:120ms"),),
        out_dir=str(out_dir),
        quiet=True,
        router=True,
    )
    run = launch(config)
    ended = time.monotonic()
    later = list_incidents(out_dir)
    while time.monotonic() < ended + AFTER_RUN_WAIT_S and any(
        i["captured"] and i["confirmed"] is None for i in later
    ):
        time.sleep(0.5)
        later = list_incidents(out_dir)
    return {
        "close_s": run.close_s,
        "incidents": [
            {
                "id": incident["id"],
                "steps": incident["steps"],
                "reduced": incident.get("reduced"),
                "verdict": verdict(incident),
            }
            for incident in later
        ],
        "after_run_s": time.monotonic() - ended,
    }


def render(runs: list[dict[str, Any]], steps: int, load_start: str, load_end: str) -> str:
    lines = result_header("The end of a run with an incident just closed", command_line())
    lines += [
        f"- Python: {platform.python_version()}; CPU count: {os.cpu_count()}; "
        f"platform: {platform.platform()}",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_end}",
        f"- Job: the demo, {RANKS} Gloo DDP ranks on CPU, {steps} steps, window 20, "
        "`data@2:120ms`, router on (5 steps, `with_stack=True`)",
        "",
        "| run | load at start -> end | "
        + " | ".join(f"rank {r} close (s)" for r in range(RANKS))
        + f" | at most {TARGET_S:.0f} s on every rank | incident: steps, reduced | verdict "
        "| reduced by (s after the job) |",
        "|---|---|" + "---:|" * RANKS + "---|---|---|---:|",
    ]
    for i, run in enumerate(runs, 1):
        close = run["close_s"]
        met = "yes" if max(close.values()) <= TARGET_S else "no"
        incidents = run["incidents"]
        what = "; ".join(
            f"{x['id']} {x['steps'][0]}-{x['steps'][1]}, {x['reduced'] or '-'}" for x in incidents
        )
        verdicts = "; ".join(x["verdict"] for x in incidents)
        lines.append(
            f"| {i} | {run['load']} | "
            + " | ".join(f"{close[r]:.3f}" for r in range(RANKS))
            + f" | {met} | {what or 'none'} | {verdicts or '-'} | {run['after_run_s']:.1f} |"
        )
    lines += [
        "",
        "Each rank's close is its own wall time in `timer.close()` (the last window's hand-off, "
        "the collector's flush and, with the router, its thread's end: a last trace export, "
        "and on rank 0 the open incident's settling). An incident that settles as the run ends "
        "is written `pending` and reduced by the process rank 0 starts as it closes "
        "(`stagefrontier incident` on its folder), which also draws the pages' figures; the "
        "last column is when the script saw that process's result, after the job's processes "
        "had exited (0.0: already there). `-`: a record with no `reduced` field (a revision "
        "that reduced every incident live on rank 0).",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = script_parser("end_of_run", __doc__)
    parser.add_argument("--runs", type=int, default=2, help="runs of the job (default 2)")
    parser.add_argument("--steps", type=int, default=33, help="the job's steps (default 33)")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    load_start = load_text()
    for _ in range(args.runs):
        run_start = load_text()
        with tempfile.TemporaryDirectory() as tmp:
            result = measure(Path(tmp) / "demo", args.steps)
        result["load"] = f"{run_start} -> {load_text()}"
        runs.append(result)
        print(result, file=sys.stderr)
    text = render(runs, args.steps, load_start, load_text())
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
