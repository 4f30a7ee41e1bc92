"""Role-aware attribution on a real pipeline-parallel job: 2 pipeline stages x 2 replicas.

Runs the pipeline demo (``stagefrontier.demo.pipeline``: ``torch.distributed.pipelining`` with
``ScheduleGPipe`` over a ``("pp", "dp")`` mesh on CPU Gloo, roles read from the mesh) once per
scenario and prints rank 0's details line per window (its role verdict in full). Scenarios: no
fault; a 120 ms stall in one replica of pipeline stage 1 (rank 3); the same stall on both
replicas of stage 0 (ranks 0 and 1). The stall sits in the stage module's forward (compute
inside the schedule) or, with the ``-data`` scenarios, in the data stage (outside the schedule).

Besides each role's report it measures the candidate across-roles signals on the last window
of every run (the first window holds start-up):

- ``bound``: the one role whose top stage is its own work rather than communication
  (``stagefrontier.analysis.across_roles``);
- ``grew``: per role, the growth of its own-work stage advances (stages not named after a
  parallelism dimension) over the no-fault run, in ms/step: the exact regression split of a
  role's exposed time, which needs a healthy reference;
- ``last``: the role whose exposed time per step is largest (the last boundary's leader);
- ``compute``: per role, the growth over the no-fault run of its slowest rank's forward compute
  per step, from the probe ``pp.forward_compute`` the demo puts around the stage module's
  forward (outside the frontier; needs that probe and a reference run).

Usage::

    python benchmarks/pipeline.py            # all scenarios, writes benchmarks/results/pipeline.md
    python benchmarks/pipeline.py --quick    # three scenarios, fewer steps
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness_common import command_line, environment, result_header, script_parser, write_result
from stagefrontier.analysis.across_roles import bounding_role, is_communication
from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.demo.faults import parse_fault
from stagefrontier.demo.pipeline import COMPUTE_PROBE, PipelineConfig, run_pipeline
from stagefrontier.render.text import window_details

STALL = "120ms"
SCENARIOS: dict[str, tuple[str, ...]] = {
    "none": (),
    "pp1-one-replica": (f"forward@3:{STALL}",),
    "pp0-both-replicas": (f"forward@0:{STALL}", f"forward@1:{STALL}"),
    "pp1-one-replica-data": (f"data@3:{STALL}",),
    "pp0-both-replicas-data": (f"data@0:{STALL}", f"data@1:{STALL}"),
}
QUICK = ("none", "pp1-one-replica", "pp0-both-replicas")


def main(argv: list[str] | None = None) -> int:
    ap = script_parser("pipeline", __doc__, quick="three scenarios, 20 steps each")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 40)")
    args = ap.parse_args(argv)
    steps = args.steps or (20 if args.quick else 40)
    names = QUICK if args.quick else tuple(SCENARIOS)
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="sf-pipeline-") as work:
        for name in names:
            config = PipelineConfig(
                steps=steps,
                window=steps // 2,
                faults=tuple(parse_fault(f) for f in SCENARIOS[name]),
                out_dir=str(Path(work, name)),
                quiet=True,
            )
            start = time.monotonic()
            runs[name] = run_pipeline(config)
            print(f"{name}: {len(runs[name])} windows in {time.monotonic() - start:.0f} s")
    lines = result_header("Role-aware attribution on a pipeline-parallel job", command_line())
    lines += [*environment(), "", f"{steps} steps per run, windows of {steps // 2} steps.", ""]
    lines += [*_log_lines(runs), "", *_signals(runs)]
    text = "\n".join(lines) + "\n"
    write_result(args.out, text)
    return 0


def _report(record: dict[str, Any]) -> WindowReport:
    return WindowReport.from_dict({k: v for k, v in record.items() if k in _REPORT_KEYS})


def _log_lines(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = ["## Log lines (rank 0, one per window)", ""]
    for name, windows in runs.items():
        lines += [f"{name} ({', '.join(SCENARIOS[name]) or 'no fault'}):", "", "```"]
        lines += [window_details(_report(w), w) for w in windows]
        lines += ["```", ""]
    return lines


def _signals(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    base = _report(runs["none"][-1])
    lines = [
        "## Across-roles signals (last window of each run)",
        "",
        "| scenario | bound | grew (own-work ms/step per role) | last (ms/step per role) "
        "| compute (ms/step per role) |",
        "|---|---|---|---|---|",
    ]
    for name, windows in runs.items():
        report = _report(windows[-1])
        bound = bounding_role(report)
        roles = report.role_reports or {}
        grew = {
            role: sum(
                (rep.advances[s] / rep.n_steps - base_rep.advances[s] / base_rep.n_steps) * 1e3
                for s in rep.stages
                if not is_communication(s)
            )
            for role, rep in roles.items()
            if (base_rep := (base.role_reports or {}).get(role)) is not None
        }
        last = {role: rep.mean_step_s * 1e3 for role, rep in roles.items()}
        compute = {
            role: _compute_ms(windows[-1], role) - _compute_ms(runs["none"][-1], role)
            for role in roles
        }
        lines.append(
            f"| {name} | {bound.role if bound else '-'} | "
            + ", ".join(f"{r} {v:+.1f}" for r, v in grew.items())
            + " | "
            + ", ".join(f"{r} {v:.1f}" for r, v in last.items())
            + " | "
            + ", ".join(f"{r} {v:+.1f}" for r, v in compute.items())
            + " |"
        )
    return lines


def _compute_ms(record: dict[str, Any], role: str) -> float:
    """The role's slowest rank's probed forward compute, in ms per step."""
    present = record["ranks_present"]
    totals = [
        record["probes"].get(str(present[i]), {}).get(COMPUTE_PROBE, {}).get("total_s", 0.0)
        for i, x in enumerate(record["roles"])
        if x == role
    ]
    return max(totals) / record["n_steps"] * 1e3


_REPORT_KEYS = {"format", "version", *WindowReport.__dataclass_fields__}

if __name__ == "__main__":
    sys.exit(main())
