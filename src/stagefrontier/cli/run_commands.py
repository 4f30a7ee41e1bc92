"""``report``, ``plot`` and ``compare``: a run's output folder, read whole."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import StageFrontierError
from .common import EXIT_OK, stage_list, warn


def handle_report(args: argparse.Namespace) -> int:
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


def handle_plot(args: argparse.Namespace) -> int:
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
        if run.worst is not None:
            print(plot_worst_step(run, frontier))
        else:
            warn("no per-rank packets in the folder: skipping the frontier figure")
        print(plot_shares_over_time(run, shares))
    return EXIT_OK


def handle_compare(args: argparse.Namespace) -> int:
    from ..analysis.compare import compare
    from ..formats.sides import load_side
    from ..render.compare_text import render_comparison
    from ..render.gate_report import gate_asked, gate_request, run_gate

    stages = stage_list(args.stages)
    if gate_asked(args):
        return run_gate(gate_request(args, stages))
    for side in (args.base, args.new):
        _refuse_another_kind(side)
    result = compare(load_side(args.base, warn), load_side(args.new, warn), stages)
    print(json.dumps(result.to_dict(), indent=2) if args.json else render_comparison(result))
    if args.plot:
        from ..render.compare_plot import plot_comparison

        print(plot_comparison(result, args.plot), file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


KIND_NAMES = {
    "windows": "windows.jsonl",
    "npz": ".npz window",
    "kineto": "PyTorch Profiler trace",
    "nsys": "Nsight Systems export",
}


def _refuse_another_kind(side: str) -> None:
    """A file given to ``compare`` that is not a packet (a trace, a ``windows.jsonl``) is named
    as what its first bytes say it is (only sniffed, so a broken file is not called a trace
    outright), not read as a broken packet."""
    from pathlib import Path

    from ..errors import TraceFormatError
    from ..reducers.detect import detect_format

    path = Path(side)
    if not path.is_file():
        return
    try:
        kind = detect_format(path)
    except TraceFormatError:
        return  # unknown: read as a packet, whose error names the defect
    if kind != "packet":
        raise StageFrontierError(
            f"{path} starts like a {KIND_NAMES.get(kind, kind)}, not an evidence packet: compare "
            "takes packets and output folders (`stagefrontier analyze` reads the other kinds)"
        )
