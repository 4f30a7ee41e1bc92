"""``analyze`` (one window, from any input) and ``validate`` (the algorithmic checks)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from ..analysis.validation import check_rows, run_validation
from ..errors import StageFrontierError
from ..formats.load import load_window
from ..reducers.detect import FORMATS
from ..reducers.files import PathLike
from ..reducers.options import TraceOptions
from ..render.incident import INCIDENT_FILE
from ..render.text import window_report_text
from .common import EXIT_FAILED, EXIT_OK, Subparsers, int_pair, stage_list, warn, window_option


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
    parser.set_defaults(handler=_run_analyze)


def _trace_options(args: argparse.Namespace) -> TraceOptions:
    """Reducer options from the command line; ignored for .npz windows and packets."""
    ranks: dict[PathLike, int] = {}
    for item in args.rank:
        file, sep, rank = item.rpartition("=")
        if not sep or not file or not rank.isdigit():
            raise StageFrontierError(f"bad --rank {item!r}: expected FILE=RANK")
        ranks[file] = int(rank)
    return TraceOptions(
        ranks=ranks or None,
        step_source=args.step_source,
        missing_ranks="allow" if args.allow_missing_ranks else "error",
    )


def _run_analyze(args: argparse.Namespace) -> int:
    window, attempt = window_option(args.window)
    stages = stage_list(args.stages)
    paths: list[Path] = args.paths
    trace = _trace_options(args)
    if len(paths) == 1 and (paths[0] / INCIDENT_FILE).is_file():
        paths, trace = _incident_input(paths[0], trace)
    steps = None if args.steps is None else int_pair(args.steps, ":", "--steps", "FIRST:LAST")
    loaded = load_window(
        paths,
        args.format,
        stages=stages,
        trace=trace,
        steps=steps,
        window=window,
        attempt=attempt,
    )
    if loaded.stored_report is not None and loaded.stored_report != loaded.report:
        warn(f"{paths[0]}: stored report differs from a fresh analysis; showing the fresh one")
    if args.json:
        print(loaded.report.to_json(indent=2))
    else:
        print(window_report_text(loaded.report, meta=loaded.facts(), notes=loaded.notes))
    return EXIT_OK


def _incident_input(folder: Path, trace: TraceOptions) -> tuple[list[Path], TraceOptions]:
    """An incident folder's traces, each with the rank the incident gives it (a --rank given
    on the command line wins), the job's other ranks allowed to be missing: a capture holds
    only the ranks it was asked for."""
    from ..route.offline import incident_traces

    files = incident_traces(folder)
    ranks: dict[PathLike, int] = {path: rank for rank, path in files.items()}
    ranks.update(trace.ranks or {})
    paths = [Path(files[rank]) for rank in sorted(files)]
    return paths, replace(trace, ranks=ranks, missing_ranks="allow")


def add_validate(sub: Subparsers) -> None:
    parser = sub.add_parser(
        "validate",
        help="run the algorithmic validation suite",
        description="Regenerate the algorithmic validation checks (telescoping, bounds, "
        "stability, sync-wait and direct-exposure recovery, downgrade fixtures) from seeded "
        "fixtures. Exit status 0 only when every check holds.",
    )
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON")
    parser.set_defaults(handler=_run_validate)


def _run_validate(args: argparse.Namespace) -> int:
    result = run_validation()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        rows = check_rows(result)
        width = max(len(row.name) for row in rows)
        print(f"{'check':<{width}}  {'value':>12}  {'criterion':>10}  result")
        for row in rows:
            verdict = "PASS" if row.passed else "FAIL"
            print(f"{row.name:<{width}}  {row.value:>12}  {row.criterion:>10}  {verdict}")
        print("all checks pass" if result["ok"] else "SOME CHECKS FAILED")
    return EXIT_OK if result["ok"] else EXIT_FAILED
