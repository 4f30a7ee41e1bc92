"""``report``, ``plot`` and ``compare``: a run's output folder, read whole."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import StageFrontierError
from .common import EXIT_OK, Subparsers, stage_list, warn


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
    parser.set_defaults(handler=_run_report)


def _run_report(args: argparse.Namespace) -> int:
    from ..formats.run_folder import load_run
    from ..render.text import run_report_text

    run = load_run(args.dir)
    for problem in run.problems:
        warn(problem)
    if args.html is None:
        print(run_report_text(run))
        return EXIT_OK
    from ..render.run_html import write_run_html

    target = args.html if str(args.html) not in ("", ".") else args.dir / "report.html"
    if target.suffix.lower() not in (".html", ".htm"):
        raise StageFrontierError(f"--html {target}: the report is an HTML page; name a *.html")
    print(write_run_html(run, target))
    return EXIT_OK


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
    parser.set_defaults(handler=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    from ..formats.run_folder import load_run
    from ..render.plots import plot_shares_over_time, plot_worst_step

    if args.output and args.output.suffix.lower() != ".png":
        raise StageFrontierError(f"-o {args.output}: the figures are PNG files; name one *.png")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
    run = load_run(args.dir)
    for problem in run.problems:
        warn(problem)
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
            warn("no per-rank packets in the folder: skipping the frontier figure")
        print(plot_shares_over_time(run, shares))
    return EXIT_OK


def add_compare(sub: Subparsers) -> None:
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
    from ..analysis.compare import compare
    from ..formats.sides import load_side
    from ..render.compare_text import render_comparison

    stages = stage_list(args.stages)
    result = compare(load_side(args.base), load_side(args.new), stages)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_comparison(result))
    if args.plot:
        from ..render.compare_plot import plot_comparison

        print(plot_comparison(result, args.plot), file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
