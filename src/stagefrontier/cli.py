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
import sys
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .analysis.analyzer import analyze
from .analysis.validation import check_rows, run_validation
from .analysis.window_report import WindowReport
from .errors import ReportFormatError, StageFrontierError
from .formats.packet import read_packet
from .reducers.detect import FORMATS, TRACE_FORMATS, detect_format, reduce_trace
from .render.text import window_report_text

Handler = Callable[[argparse.Namespace], int]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2


# --- input windows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedWindow:
    """An analyzed input: the fresh report, plus what a packet stored alongside it, or what
    reducing a trace noted."""

    report: WindowReport
    meta: dict[str, Any] | None = None
    stored_report: WindowReport | None = None
    notes: tuple[str, ...] = ()


def load_window(
    path: Path, fmt: str = "auto", trace_options: dict[str, Any] | None = None
) -> LoadedWindow:
    """Analyze an ``.npz`` window (``d``, ``stages``, optional ``roles``), an evidence packet,
    or a profiler trace reduced to the stage matrix (PyTorch Profiler files or folder, through
    the direct reader or HTA; an Nsight Systems SQLite export).

    With ``fmt="auto"`` the kind is told by content, falling back to the name (a folder is read
    as PyTorch Profiler traces). A packet is re-analyzed with its stored gates, roles and side
    evidence. ``trace_options`` go to the trace reducer (``stages``, ``ranks``, ...).
    """
    if fmt not in FORMATS:
        raise ReportFormatError(f"unknown --format {fmt!r}; one of {', '.join(FORMATS)}")
    kind = detect_format(path) if fmt == "auto" else fmt
    if kind in TRACE_FORMATS:
        return _load_trace(path, kind, trace_options or {})
    if path.is_dir():
        raise ReportFormatError(f"{path}: a folder; only traces can be read from a folder")
    if kind == "npz":
        return _load_npz(path)
    try:
        packet = read_packet(path)
    except ReportFormatError as exc:
        raise ReportFormatError(f"{path}: {exc}") from None
    return LoadedWindow(report=packet.reanalyze(), meta=packet.meta, stored_report=packet.report)


def _load_trace(path: Path, kind: str, options: dict[str, Any]) -> LoadedWindow:
    options = dict(options)
    steps = options.pop("steps", None)
    reduced = reduce_trace(path, kind, **options)
    if steps is not None:
        first, last = steps
        wanted = [s for s in reduced.step_ids if first <= s <= last]
        if not wanted:
            raise ReportFormatError(
                f"{path}: no step id in {first}:{last} among {reduced.step_ids}"
            )
        reduced = reduced.select_steps(wanted)
    return LoadedWindow(report=reduced.analyze(), meta=reduced.summary(), notes=reduced.notes)


def _load_npz(path: Path) -> LoadedWindow:
    arrays = _npz_arrays(path, ("d", "stages", "roles"))
    for key in ("d", "stages"):
        if key not in arrays:
            raise ReportFormatError(f"{path}: the .npz file has no {key!r} array")
    stages = _names(arrays["stages"], path, "stages")
    roles = _names(arrays["roles"], path, "roles") if "roles" in arrays else None
    return LoadedWindow(report=analyze(arrays["d"], stages, roles=roles))


def _npz_arrays(path: Path, keys: Sequence[str]) -> dict[str, np.ndarray[Any, Any]]:
    """The named arrays present in an .npz archive; object arrays are refused, never unpickled."""
    unreadable = (zipfile.BadZipFile, zlib.error, ValueError, EOFError)
    try:
        loaded = np.load(path, allow_pickle=False)
    except unreadable as exc:
        raise ReportFormatError(f"{path}: not a readable .npz window: {exc}") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ReportFormatError(f"{path}: a single .npy array, not an .npz window")
    try:
        with loaded as npz:
            return {key: npz[key] for key in keys if key in npz.files}
    except unreadable as exc:
        raise ReportFormatError(f"{path}: not a readable .npz window: {exc}") from None


def _names(arr: np.ndarray[Any, Any], path: Path, key: str) -> list[str]:
    if arr.ndim != 1 or arr.dtype.kind not in "US":
        raise ReportFormatError(f"{path}: {key!r} must be a 1-D array of strings")
    return [x.decode() if isinstance(x, bytes) else str(x) for x in arr.tolist()]


# --- analyze --------------------------------------------------------------------------------------


def _add_analyze(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "analyze",
        help="analyze one window (.npz, evidence packet, or a profiler trace)",
        description="Frontier accounting, localization and labels for one window. PATH is an "
        ".npz with arrays d [steps, ranks, stages] and stages (optional roles), an evidence "
        "packet written by stagefrontier, PyTorch Profiler traces (.json/.json.gz files or a "
        "folder of them, one per rank) or an Nsight Systems SQLite export. A trace is reduced "
        "to the ordered stage matrix from its step ranges and the ranges named like the stages.",
    )
    parser.add_argument("file", type=Path, metavar="PATH")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="input kind (default: told by content; a folder is read as PyTorch Profiler "
        "traces); hta reads PyTorch Profiler traces through Holistic Trace Analysis",
    )
    trace = parser.add_argument_group("traces")
    trace.add_argument(
        "--stages",
        metavar="A,B,...",
        help="ordered stage names the trace's ranges carry (default: the six default stages)",
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


def _trace_options(args: argparse.Namespace) -> dict[str, Any]:
    """Reducer options from the command line; ignored for .npz windows and packets."""
    options: dict[str, Any] = {}
    if args.stages:
        options["stages"] = [s.strip() for s in args.stages.split(",") if s.strip()]
    if args.rank:
        ranks: dict[str, int] = {}
        for item in args.rank:
            file, sep, rank = item.rpartition("=")
            if not sep or not file or not rank.isdigit():
                raise StageFrontierError(f"bad --rank {item!r}: expected FILE=RANK")
            ranks[file] = int(rank)
        options["ranks"] = ranks
    if args.steps:
        first, sep, last = args.steps.partition(":")
        if not sep or not first.isdigit() or not last.isdigit():
            raise StageFrontierError(f"bad --steps {args.steps!r}: expected FIRST:LAST")
        options["steps"] = (int(first), int(last))
    if args.allow_missing_ranks:
        options["missing_ranks"] = "allow"
    if args.step_source != "auto":
        options["step_source"] = args.step_source
    return options


def _run_analyze(args: argparse.Namespace) -> int:
    loaded = load_window(args.file, args.format, _trace_options(args))
    if loaded.stored_report is not None and loaded.stored_report != loaded.report:
        _warn(f"{args.file}: stored report differs from a fresh analysis; showing the fresh one")
    if args.json:
        print(loaded.report.to_json(indent=2))
    else:
        print(window_report_text(loaded.report, meta=loaded.meta, notes=loaded.notes))
    return EXIT_OK


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
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from .render.run_folder import load_run
    from .render.text import run_report_text

    print(run_report_text(load_run(args.dir)))
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
    from .render.plots import plot_shares_over_time, plot_worst_step
    from .render.run_folder import load_run

    run = load_run(args.dir)
    frontier = args.output or args.dir / "frontier_worst_step.png"
    shares = (
        frontier.with_name(frontier.stem + "_shares.png")
        if args.output
        else args.dir / "shares_over_time.png"
    )
    if run.packets:
        print(plot_worst_step(run, frontier))
    else:
        _warn("no packets/ in the folder: skipping the frontier figure")
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

    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    result = compare(load_side(args.base), load_side(args.new), stages)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_comparison(result))
    if args.plot:
        from .render.compare_plot import plot_comparison

        print(plot_comparison(result, args.plot), file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the CPU demo: multi-rank Gloo DDP training with injected faults",
        description="Spawn RANKS real processes (Gloo DDP, CPU), train a small transformer "
        "language model with StageTimer, inject faults, and report. Needs torch.",
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND@RANK:DELAYms[,every=K][,from=S,to=E] with KIND one of data, forward, "
        "backward, comm, callback_sync, callback_host (forward_device is refused: the demo's "
        "forward has no device work); repeatable",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="stagefrontier-demo", metavar="DIR")
    parser.set_defaults(handler=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    try:
        from .demo.command import run_demo
    except ImportError as exc:
        raise StageFrontierError(
            f"the demo needs torch ({exc}); install it, e.g. pip install torch"
        ) from None
    if args.ranks < 1 or args.steps < 1 or args.window < 1:
        raise StageFrontierError("--ranks, --steps and --window must be >= 1")
    run_demo(
        ranks=args.ranks,
        steps=args.steps,
        window=args.window,
        faults=args.fault,
        seed=args.seed,
        out=args.out,
    )
    return EXIT_OK


# --- entry point ----------------------------------------------------------------------------------

COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_analyze,
    _add_validate,
    _add_report,
    _add_plot,
    _add_compare,
    _add_demo,
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
    print(f"stagefrontier: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (the console script exits with it)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (StageFrontierError, OSError) as exc:
        print(f"stagefrontier: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
