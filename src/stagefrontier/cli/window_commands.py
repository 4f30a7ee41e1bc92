"""``analyze`` (one window, from any input) and ``validate`` (the algorithmic checks)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from ..analysis.validation import check_rows, run_validation
from ..errors import StageFrontierError
from ..formats.incident import INCIDENT_FILE
from ..load import load_window
from ..reducers.files import PathLike
from ..reducers.options import TraceOptions
from ..render.text import window_report_text
from .common import EXIT_FAILED, EXIT_OK, int_pair, stage_list, warn, window_option


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


def handle_analyze(args: argparse.Namespace) -> int:
    window, attempt = window_option(args.window)
    stages = stage_list(args.stages)
    paths: list[Path] = args.paths
    trace = _trace_options(args)
    steps = None if args.steps is None else int_pair(args.steps, ":", "--steps", "FIRST:LAST")
    if len(paths) == 1 and (paths[0] / INCIDENT_FILE).is_file():
        paths, trace, incident_stages, incident_steps = _incident_input(paths[0], trace)
        stages = stages or incident_stages
        steps = steps or incident_steps
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


def _incident_input(
    folder: Path, trace: TraceOptions
) -> tuple[list[Path], TraceOptions, list[str] | None, tuple[int, int] | None]:
    """An incident folder's traces, each with the rank the incident gives it (a --rank given
    on the command line wins), the job's other ranks allowed to be missing: a capture holds
    only the ranks it was asked for; and the stages and steps the live incident compared (a
    --stages or --steps given on the command line wins)."""
    from ..route.offline import incident_traces

    files, stages, steps = incident_traces(folder)
    ranks: dict[PathLike, int] = {path: rank for rank, path in files.items()}
    ranks.update(trace.ranks or {})
    paths = [Path(files[rank]) for rank in sorted(files)]
    return paths, replace(trace, ranks=ranks, missing_ranks="allow"), stages, steps


def handle_validate(args: argparse.Namespace) -> int:
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
