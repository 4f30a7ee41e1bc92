"""Every subcommand's parser: its words (help, description, examples) and its arguments, one
registrar per subcommand (``main.COMMANDS`` lists them in help order). What each subcommand
does is in its family's module; the declarations stay together here, where they read as the
command line's one surface."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..demo.faults import HOST_KINDS
from ..reducers.detect import FORMATS
from ..render.gate_report import add_gate_arguments
from .common import Subparsers
from .demo_command import handle_demo
from .router_commands import handle_capture, handle_incident
from .run_commands import handle_compare, handle_plot, handle_report
from .window_commands import handle_analyze, handle_validate


def add_analyze(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "analyze",
        help="analyze one window (.npz, evidence packet, output folder, or a profiler trace)",
        description="Frontier accounting, localization and labels for one window. PATH is an "
        ".npz with arrays d [steps, ranks, stages] and stages (optional roles), an evidence "
        "packet written by stagefrontier, an output folder, its packets/ or its windows.jsonl "
        "(with --window), PyTorch Profiler traces (.json/.json.gz files or a folder of them, "
        "one per rank) or an Nsight Systems SQLite export. A trace is reduced to the ordered "
        "stage matrix from its step ranges and its stage ranges. Several PATHs are the traces "
        "of one window, a file or folder per rank; an incident folder (incidents/<id>) is read "
        "as its traces, the ranks it captured.",
    )
    parser.add_argument("paths", type=Path, nargs="+", metavar="PATH")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="input kind (default: told by content; a folder is read as PyTorch Profiler "
        "traces unless it is an output folder); hta reads PyTorch Profiler traces through "
        "Holistic Trace Analysis",
    )
    parser.add_argument(
        "--window",
        metavar="N",
        help="output folders and windows.jsonl: the window to analyze, N or ATTEMPT/N after a "
        "restart (as `stagefrontier report` lists them)",
    )
    trace = parser.add_argument_group("traces")
    trace.add_argument(
        "--stages",
        metavar="A,B,...",
        help="ordered stage names the trace's ranges carry (default: inferred from the ranges "
        "on the step thread, the default stage names first)",
    )
    trace.add_argument(
        "--rank",
        action="append",
        default=[],
        metavar="FILE=RANK",
        help="rank of a trace file that does not say it (repeatable)",
    )
    trace.add_argument(
        "--steps", metavar="FIRST:LAST", help="analyze only step ids FIRST..LAST (inclusive)"
    )
    trace.add_argument(
        "--step-source",
        choices=("auto", "profiler", "annotation"),
        default="auto",
        help="step ranges: ProfilerStep#N (profiler), the stagefrontier.step ranges "
        "(annotation), or the first of them present (auto, the default)",
    )
    trace.add_argument(
        "--allow-missing-ranks",
        action="store_true",
        help="analyze the ranks present when the world size names more (labels are downgraded)",
    )
    parser.set_defaults(handler=handle_analyze)


def add_validate(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "validate",
        help="run the algorithmic validation suite",
        description="Regenerate the algorithmic validation checks (telescoping, bounds, "
        "stability, sync-wait and direct-exposure recovery, downgrade fixtures) from seeded "
        "fixtures. Exit status 0 only when every check holds.",
    )
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON")
    parser.set_defaults(handler=handle_validate)


def add_report(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "report",
        help="report an output folder (windows.jsonl, packets/) against the baselines",
        description="Print StageFrontier's shares next to the five rank-local baselines, the "
        "routing set, leaders, labels and reasons for every window in DIR.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.add_argument(
        "--html",
        nargs="?",
        const="",
        type=Path,
        metavar="FILE",
        help="write the report as one self-contained HTML page instead (default "
        "DIR/report.html): share timeline, who sets the frontier, the verdict per window, "
        "regressions, incidents, self-cost, the run's facts",
    )
    parser.set_defaults(handler=handle_report)


def add_plot(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "plot",
        help="write the worst-step frontier and shares-over-time PNGs for an output folder",
    )
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="FILE",
        help="frontier figure path (default DIR/frontier_worst_step.png); the shares figure "
        "goes beside it with a _shares suffix",
    )
    parser.set_defaults(handler=handle_plot)


def add_compare(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "compare",
        help="split the change in step time between two runs (or window ranges) by stage",
        description="Compare NEW against BASE: per-step exposed time on each side and its change, "
        "split exactly into the change of each stage's frontier advance, the leading ranks on "
        "each side, and each rank's change of its own stage times.",
        epilog="Each side is an output folder, a packet file, or a window range of a folder: "
        "DIR:3-7 (windows 3 to 7), DIR:3- (from 3), DIR:-7 (up to 7), DIR:5 (one window); "
        "on a folder of several restart attempts, name the attempt: DIR:1/3-7 (windows 3 to 7 "
        "of attempt 1), DIR:1/ (all of attempt 1). "
        "Example: stagefrontier compare yesterday/ today/ --plot delta.png",
    )
    parser.add_argument("base", metavar="BASE")
    parser.add_argument("new", metavar="NEW")
    parser.add_argument(
        "--stages",
        metavar="A,B,...",
        help="compare only these stages (for runs whose schemas differ); the others are "
        "reported together",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also write a bar figure here")
    add_gate_arguments(parser)
    parser.set_defaults(handler=handle_compare)


class _DefaultsAndExamples(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Help that shows each option's default (when it has one) and keeps the examples' line
    breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, []):
            return action.help
        return super()._get_help_string(action)


DEMO_EXAMPLES = """examples:
  stagefrontier demo --fault data@2:120ms --router    # what `make demo` runs
  stagefrontier demo --fault comm@1:80ms,from=40,to=80
  stagefrontier demo --ranks 2 --steps 40 --window 10 --fault callback_sync@0:60ms,every=5
  stagefrontier report stagefrontier-demo             # the report again, from the folder"""


def add_demo(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the CPU demo: multi-rank Gloo DDP training with injected faults",
        description="Spawn RANKS real processes (Gloo DDP, CPU), train a small transformer\n"
        "language model with StageTimer, inject faults, and report. Needs torch.",
        epilog=DEMO_EXAMPLES,
        formatter_class=_DefaultsAndExamples,
    )
    parser.add_argument("--ranks", type=int, default=4, help="processes to spawn")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps per rank")
    parser.add_argument("--window", type=int, default=20, help="steps per analyzed window")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND@RANK:DELAYms[,every=K][,from=S,to=E] with RANK a number or all and KIND one of "
        f"{', '.join(HOST_KINDS)}; repeatable (default: no fault)",
    )
    parser.add_argument("--seed", type=int, default=0, help="model, data and fault seed")
    parser.add_argument("--out", default="stagefrontier-demo", metavar="DIR", help="output folder")
    parser.add_argument(
        "--router",
        action="store_true",
        help="turn the profiler router on: an actionable window captures a trace of the "
        "suspect rank and a reference rank (out/incidents/)",
    )
    parser.set_defaults(handler=handle_demo)


def add_incident(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "incident",
        help="print the profiler router's incidents (reducing traces not reduced live)",
        description="Print an incident folder (out_dir/incidents/<id>) or every incident of an "
        "output folder, and write its incident.html again. A captured incident whose traces "
        "were not reduced live (another host, or the run ended first) is reduced now against "
        "the run's packets, and its files rewritten.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.set_defaults(handler=handle_incident)


def add_capture(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "capture",
        help="ask a running job's profiler router for a capture on some ranks",
        description="Write a capture request into a running job's c10d store; rank 0's router "
        "schedules it a few steps ahead on the named ranks and answers with the incident "
        "folder. Needs torch.",
    )
    parser.add_argument("--store", required=True, metavar="HOST:PORT")
    parser.add_argument("--ranks", required=True, metavar="R[,R]", help="e.g. 2,0")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stage", default=None, help="the stage to diff (default: live top)")
    parser.add_argument("--run-id", default=None, help="the job's run id (TORCHELASTIC_RUN_ID)")
    parser.add_argument("--attempt", type=int, default=0, help="the job's restart count")
    parser.add_argument("--wait", type=float, default=120.0, metavar="SECONDS")
    parser.add_argument(
        "--router",
        type=int,
        default=0,
        metavar="K",
        help="which router of each process to ask: 0 the first opened (default), 1 the second "
        "(an evaluation timer's, say)",
    )
    parser.set_defaults(handler=handle_capture)
