"""``stagefrontier compare BASE NEW --fail-above PCT``: read both sides, judge them
(``analysis.gate``), print the gate's line (or the JSON with the gate in it), write the asked
Markdown, JUnit XML and figure, and return the exit status: 0 pass, 1 fail, 3 not comparable."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..analysis.compare import Comparison, compare
from ..analysis.gate import Threshold, Verdict, comparable, judge, parse_percent, refused
from ..errors import StageFrontierError
from ..formats.sides import load_side
from .compare_text import render_comparison
from .gate_text import gate_junit, gate_line, gate_markdown


@dataclass(frozen=True)
class GateRequest:
    """What the command line asked of the gate."""

    base: str
    new: str
    threshold: Threshold
    stages: Sequence[str] | None = None
    json: bool = False
    markdown: Path | None = None
    junit: Path | None = None
    plot: Path | None = None
    strict: bool = False


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """The gate's options of ``stagefrontier compare``."""
    gate = parser.add_argument_group(
        "gate",
        "exit 1 when NEW is slower past the bar and the noise (in a stage beyond its even "
        "share, or in the whole step), 0 when it is not, "
        "3 when the two runs cannot be judged (world size, stages, too few steps; with "
        "--strict, a slowdown spread evenly over every stage and rank)",
    )
    gate.add_argument(
        "--fail-above", metavar="PCT", help="the bar as a share of BASE's median step, e.g. 10%%"
    )
    gate.add_argument("--fail-above-ms", type=float, metavar="MS", help="the bar in milliseconds")
    gate.add_argument("--markdown", type=Path, metavar="FILE", help="write a PR comment here")
    gate.add_argument("--junit", type=Path, metavar="FILE", help="write JUnit XML here")
    gate.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 rather than 0 when NEW is slower past the bar evenly over every stage "
        "and rank (read as the machine's slowdown, not the code's)",
    )


def gate_asked(args: argparse.Namespace) -> bool:
    """Whether the command asked for the gate; its report files alone are a usage error."""
    if args.fail_above is not None or args.fail_above_ms is not None:
        return True
    if args.markdown or args.junit or args.strict:
        raise StageFrontierError(
            "--markdown, --junit and --strict are the gate's: add --fail-above PCT"
        )
    return False


def gate_request(args: argparse.Namespace, stages: Sequence[str] | None) -> GateRequest:
    percent = None if args.fail_above is None else parse_percent(args.fail_above)
    threshold = Threshold(percent, args.fail_above_ms)
    return GateRequest(
        args.base,
        args.new,
        threshold,
        stages,
        args.json,
        args.markdown,
        args.junit,
        args.plot,
        args.strict,
    )


def run_gate(request: GateRequest) -> int:
    """Judge NEW against BASE, say it and write the asked files; the exit status."""
    base, new = load_side(request.base), load_side(request.new)
    reason = comparable(base, new, request.stages)
    comparison: Comparison | None = None
    if reason:
        verdict: Verdict = refused(reason, request.threshold, base, new)
    else:
        comparison = compare(base, new, request.stages)
        verdict = judge(comparison, request.threshold, request.strict)
    line = gate_line(verdict, request.base, request.new)
    if request.json:
        data = comparison.to_dict() if comparison is not None else {}
        print(json.dumps({**data, "gate": verdict.to_dict()}, indent=2))
    else:
        if comparison is not None:
            print(render_comparison(comparison), end="\n\n")
        print(line)
    written = []
    if request.markdown:
        md = gate_markdown(verdict, comparison, request.base, request.new)
        request.markdown.write_text(md, encoding="utf-8")
        written.append(request.markdown)
    if request.junit:
        request.junit.write_text(gate_junit(verdict, line), encoding="utf-8")
        written.append(request.junit)
    if request.plot and comparison is not None:
        from .compare_plot import plot_comparison

        written.append(plot_comparison(comparison, request.plot))
    for path in written:
        print(path, file=sys.stderr if request.json else sys.stdout)
    return verdict.status
