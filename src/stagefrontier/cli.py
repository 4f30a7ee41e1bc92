"""The ``stagefrontier`` command line.

Subcommands register themselves in ``COMMANDS``: each entry is a function that adds its parser
to the subparsers and sets ``handler`` (``Namespace -> exit status``) as a default. A new
subcommand (``demo``, ``report``, ``plot``, ...) is one more such function.

Exit status: 0 on success, 1 when ``validate`` finds a failing check, 2 on bad input or usage.
Errors print one line to stderr, never a traceback. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from . import __version__
from .analysis.validation import check_rows, run_validation
from .demo.faults import HOST_KINDS
from .errors import StageFrontierError
from .formats.load import load_window
from .launch import command as run_command
from .reducers.detect import FORMATS
from .reducers.files import PathLike
from .reducers.options import TraceOptions
from .render.escape import printable
from .render.incident import INCIDENT_FILE
from .render.last_resort import last_resort_line
from .render.text import window_report_text

Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2


# --- analyze --------------------------------------------------------------------------------------


def _add_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _int_pair(text: str, sep: str, option: str, form: str) -> tuple[int, int]:
    """``A<sep>B`` as two ints."""
    first, found, last = text.partition(sep)
    if not found or not first.isdigit() or not last.isdigit():
        raise StageFrontierError(f"bad {option} {text!r}: expected {form}")
    return int(first), int(last)


def _window(text: str | None) -> tuple[int | None, int | None]:
    """``--window``: (window, attempt); the attempt only when written ``ATTEMPT/N``."""
    if text is None:
        return None, None
    if "/" in text:
        attempt, window = _int_pair(text, "/", "--window", "N or ATTEMPT/N")
        return window, attempt
    if not text.isdigit():
        raise StageFrontierError(f"bad --window {text!r}: expected N or ATTEMPT/N")
    return int(text), None


def _stage_list(text: str | None) -> list[str] | None:
    """``--stages A,B,...``: the names, or None when the option is not given; a list that names
    no stage (``,,``) is refused."""
    if text is None:
        return None
    stages = [s.strip() for s in text.split(",") if s.strip()]
    if not stages:
        raise StageFrontierError(f"--stages {text!r} names no stage: expected A,B,...")
    return stages


def _run_analyze(args: argparse.Namespace) -> int:
    window, attempt = _window(args.window)
    stages = _stage_list(args.stages)
    paths: list[Path] = args.paths
    trace = _trace_options(args)
    if len(paths) == 1 and (paths[0] / INCIDENT_FILE).is_file():
        paths, trace = _incident_input(paths[0], trace)
    steps = None if args.steps is None else _int_pair(args.steps, ":", "--steps", "FIRST:LAST")
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
        _warn(f"{paths[0]}: stored report differs from a fresh analysis; showing the fresh one")
    if args.json:
        print(loaded.report.to_json(indent=2))
    else:
        print(window_report_text(loaded.report, meta=loaded.facts(), notes=loaded.notes))
    return EXIT_OK


def _incident_input(folder: Path, trace: TraceOptions) -> tuple[list[Path], TraceOptions]:
    """An incident folder's traces, each with the rank the incident gives it (a --rank given
    on the command line wins), the job's other ranks allowed to be missing: a capture holds
    only the ranks it was asked for."""
    from .route.offline import incident_traces

    files = incident_traces(folder)
    ranks: dict[PathLike, int] = {path: rank for rank, path in files.items()}
    ranks.update(trace.ranks or {})
    paths = [Path(files[rank]) for rank in sorted(files)]
    return paths, replace(trace, ranks=ranks, missing_ranks="allow")


# --- validate -------------------------------------------------------------------------------------


def _add_validate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


# --- report, plot, demo ---------------------------------------------------------------------------


def _add_report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from .formats.run_folder import load_run
    from .render.text import run_report_text

    run = load_run(args.dir)
    for problem in run.problems:
        _warn(problem)
    if args.html is None:
        print(run_report_text(run))
        return EXIT_OK
    from .render.run_html import write_run_html

    target = args.html if str(args.html) not in ("", ".") else args.dir / "report.html"
    if target.suffix.lower() not in (".html", ".htm"):
        raise StageFrontierError(f"--html {target}: the report is an HTML page; name a *.html")
    print(write_run_html(run, target))
    return EXIT_OK


def _add_plot(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.set_defaults(handler=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from .formats.run_folder import load_run
    from .render.plots import plot_shares_over_time, plot_worst_step

    if args.output and args.output.suffix.lower() != ".png":
        raise StageFrontierError(f"-o {args.output}: the figures are PNG files; name one *.png")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
    run = load_run(args.dir)
    for problem in run.problems:
        _warn(problem)
    groups = run.by_schema()
    for i, run in enumerate(groups):
        # Windows of another stage list (a schema change mid-run) get figures of their own.
        tail = f"_stages{i + 1}" if len(groups) > 1 else ""
        frontier = args.output or args.dir / "frontier_worst_step.png"
        frontier = frontier.with_name(f"{frontier.stem}{tail}.png")
        shares = (
            frontier.with_name(f"{frontier.stem}_shares.png")
            if args.output
            else args.dir / f"shares_over_time{tail}.png"
        )
        if run.packets:
            print(plot_worst_step(run, frontier))
        else:
            _warn("no per-rank packets in the folder: skipping the frontier figure")
        print(plot_shares_over_time(run, shares))
    return EXIT_OK


def _add_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "compare",
        help="split the change in step time between two runs (or window ranges) by stage",
        description="Compare NEW against BASE: per-step exposed time on each side and its change, "
        "split exactly into the change of each stage's frontier advance, the leading ranks on "
        "each side, and each rank's change of its own stage times.",
        epilog="Each side is an output folder, a packet file, or a window range of a folder: "
        "DIR:3-7 (windows 3 to 7), DIR:3- (from 3), DIR:-7 (up to 7), DIR:5 (one window). "
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
    parser.set_defaults(handler=_run_compare)


def _run_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import compare
    from .formats.sides import load_side
    from .render.compare_text import render_comparison

    stages = _stage_list(args.stages)
    result = compare(load_side(args.base), load_side(args.new), stages)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_comparison(result))
    if args.plot:
        from .render.compare_plot import plot_comparison

        print(plot_comparison(result, args.plot), file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


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


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    try:
        from .demo.command import run_demo
        from .demo.train import DemoConfig
    except ImportError as exc:
        raise StageFrontierError(
            f"the demo needs torch ({exc}); install it, e.g. pip install torch"
        ) from None
    settings = DemoConfig(
        ranks=args.ranks,
        steps=args.steps,
        window=args.window,
        seed=args.seed,
        out_dir=args.out,
        router=args.router,
    )
    run_demo(settings, args.fault)
    return EXIT_OK


# --- the profiler router's incidents and manual captures -----------------------------------------


def _add_incident(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "incident",
        help="print the profiler router's incidents (reducing traces not reduced live)",
        description="Print an incident folder (out_dir/incidents/<id>) or every incident of an "
        "output folder, and write its incident.html again. A captured incident whose traces "
        "were not reduced live (another host, or the run ended first) is reduced now against "
        "the run's packets, and its files rewritten.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR")
    parser.set_defaults(handler=_run_incident)


def _run_incident(args: argparse.Namespace) -> int:
    from .render.incident import render_markdown
    from .route.html import write_html
    from .route.offline import incident_folders, reduce_offline, run_folder

    folders, skipped = incident_folders(args.dir)
    for problem in skipped:
        _warn(problem)
    if not folders:
        print(printable(f"no {'readable ' if skipped else ''}incidents in {args.dir}"))
    for folder in folders:
        incident, reduced = reduce_offline(folder)
        if reduced:
            print(printable(f"(reduced the traces of {incident['id']} now)"))
        else:  # the page again: its figures may be drawable now (matplotlib installed since)
            write_html(folder, incident, run_folder(folder))
        print(render_markdown(incident))
        print(printable(f"Files: {folder}/incident.json, incident.md, incident.html"))
    return EXIT_OK


def _add_capture(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.set_defaults(handler=_run_capture)


def _run_capture(args: argparse.Namespace) -> int:
    from .route.manual import request_capture

    host, _, port = args.store.rpartition(":")
    words = args.ranks.split(",")
    if not host or not port.isdigit():
        raise StageFrontierError(f"--store {args.store!r}: expected HOST:PORT")
    if not all(w.strip().isdigit() for w in words):
        raise StageFrontierError(f"--ranks {args.ranks!r}: expected ranks such as 2,0")
    answer = request_capture(
        host,
        int(port),
        [int(w) for w in words],
        args.steps,
        args.stage,
        args.run_id,
        args.attempt,
        args.wait,
        args.router,
    )
    if answer is None:
        print(f"no answer within {args.wait:g} s (is the job running with a ProfilerRouter?)")
        return EXIT_FAILED
    if answer.state == "refused":
        print(printable(f"refused: {answer.text}"))
        return EXIT_FAILED
    print(printable(answer.text))
    return EXIT_OK


# --- entry point ----------------------------------------------------------------------------------

COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_analyze,
    _add_validate,
    _add_report,
    _add_plot,
    _add_compare,
    _add_demo,
    _add_incident,
    _add_capture,
    run_command.add_parser,
]
"""Subcommand registrars, in help order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stagefrontier",
        description="Synchronization-aware stage accounting for distributed training.",
    )
    parser.add_argument("--version", action="version", version=f"stagefrontier {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in COMMANDS:
        register(sub)
    return parser


def _warn(message: str) -> None:
    print(f"stagefrontier: warning: {printable(message)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    words = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(run_command.separate(words))
    handler: Handler = args.handler
    try:
        status = handler(args)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
        return status
    except BrokenPipeError:
        # The reader (head, less) stopped reading: end quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (StageFrontierError, OSError) as exc:
        print(f"stagefrontier: error: {printable(_describe(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # the last resort: one line and a traceback file, never a dump
        print(f"stagefrontier: error: {printable(last_resort_line(exc))}", file=sys.stderr)
        return EXIT_ERROR


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
