"""``stagefrontier report DIR --html``: one self-contained page for a whole run.

The share timeline and the leaders view are inline SVG and HTML drawn here (no matplotlib
needed, readable at any number of ranks: the leaders view lists only the ranks that ever set the
frontier); the frontier figure of the worst step is embedded when matplotlib is installed, and
said missing otherwise. This module computes the page's values; the template
``templates/run_report.html.j2`` lays them out, escaped by ``render/html_page.py``'s
autoescaping environment, as the incident pages are.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.schema import semantic_stage
from ..analysis.window_report import WindowReport
from ..formats.packet import write_bytes_atomically
from ..formats.run_digest import Bucket
from ..formats.run_folder import RunWindows
from ..formats.wall_clock import clock_cell, run_clock, span_text
from .command import cli_command
from .headline import Headlines
from .html_page import Figure, OpDiff, drawn_figures, op_diff, render
from .leaders_view import bucket_leaders_view, leaders_view
from .plots import stage_colors
from .regression_text import regression_text
from .run_summary import bucket_span, sample_note, step_span, summary_sentence
from .text import (
    METHOD_INTRO,
    METHOD_NOTES,
    METHOD_OUTRO,
    METHOD_TITLES,
    index_text,
    lead_text,
    self_cost,
    self_cost_text,
    summary_window,
)
from .verdict import ranks_text, verdict


def write_run_html(run: RunWindows, path: str | Path) -> Path:
    """Write the run's report page to ``path`` (its folder made if needed); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes_atomically(out, run_html(run, out).encode())


def run_html(run: RunWindows, path: Path) -> str:
    windows = run.windows
    stages = list(dict.fromkeys(semantic_stage(s) for s in run.stages))
    colors = stage_colors(stages)
    last_report, last_meta = summary_window(windows)
    shown: list[Figure] | None = None
    if run.worst is not None:
        from .plots import plot_worst_step

        redraw = (
            f"run `{cli_command()} report {shlex.quote(str(run.folder))} --html` "
            "to write this page again"
        )
        shown = drawn_figures(
            [("Frontier of the worst step", lambda p: plot_worst_step(run, p))], redraw
        )
    columns = bucket_columns(run.buckets) if run.summarized else window_columns(windows)
    return render(
        "run_report.html.j2",
        title=f"StageFrontier report: {run.folder}",
        folder=str(run.folder),
        last_index=index_text(last_meta),
        last_verdict=verdict(last_report, last_meta),
        summarized=summary_sentence(run) if run.summarized else "",
        run_facts=_run_facts(run),
        timeline=share_timeline(columns, stages, colors),
        key=list(zip(stages, colors, strict=True)),
        leaders=(
            bucket_leaders_view(run.buckets, run.tallies.ranks, stages, colors)
            if run.summarized
            else leaders_view(windows, stages, colors)
        ),
        verdicts=_verdict_rows(windows),
        regressions=_regressions(windows),
        slowed=slowed_by_router(run),
        comparison=_comparison(run),
        incidents=_incidents(run, path),
        self_cost=_self_cost(windows),
        shown=shown,
    )


# --- run facts ------------------------------------------------------------------------------------


def _run_facts(run: RunWindows) -> list[tuple[str, str]]:
    first, last = run.windows[0][1], run.windows[-1][1]
    items = [("folder", str(run.folder))]
    if first.get("run_id"):
        items.append(("run id", str(first["run_id"])))
    steps = step_span(run.tallies)
    items.append(("windows", f"{run.count} (steps {steps})"))
    when = span_text(run_clock([first, last]), dated=True)
    if when != "?":
        items.append(("time", when))
    world = first.get("world_size")
    items.append(("ranks", f"{run.tallies.ranks}" + (f" of world size {world}" if world else "")))
    hosts = first.get("hosts")
    if isinstance(hosts, Mapping) and hosts:
        names = sorted({str(h) for h in hosts.values()})
        items.append(
            ("hosts", f"{len(names)}: " + ", ".join(names[:8]) + (", ..." * (len(names) > 8)))
        )
    attempts = sorted(run.tallies.attempts)
    if attempts != [0]:
        items.append(("restart attempts", ", ".join(map(str, attempts))))
    items.append(("stages", ", ".join(run.stages)))
    if run.tallies.missing:
        items.append(("ranks missing from some window", ranks_text(sorted(run.tallies.missing))))
    items.append(("written by", f"stagefrontier {_version()}"))
    return items


def _version() -> str:
    try:
        return importlib.metadata.version("stagefrontier")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown: not installed)"


# --- the share timeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    """One stage's part of one window's bar (SVG user units; ``tip``: its hover text)."""

    x: str
    y: str
    width: str
    height: str
    color: str
    tip: str


@dataclass(frozen=True)
class Label:
    x: str
    y: str
    text: str
    middle: bool = False


@dataclass(frozen=True)
class Timeline:
    """The share timeline's geometry: the exposed ms/step line above (``points``), the
    stacked bars below, and the axes' labels."""

    width: int
    height: int
    top: int
    points: str
    band: str
    """The min-max band of a summarized run's buckets (SVG polygon points), or empty."""
    peak_label: str
    bars: list[Bar]
    labels: list[Label]


@dataclass(frozen=True)
class Column:
    """One bar of the share timeline: a window, or a bucket of windows (its median ms/step,
    ``low`` and ``high`` its band)."""

    name: str
    what: str
    ms: float
    low: float
    high: float
    shares: Mapping[str, float]


def window_columns(windows: list[tuple[WindowReport, dict[str, Any]]]) -> list[Column]:
    columns = []
    for report, meta in windows:
        ms = report.mean_step_s * 1e3
        shares = report.semantic_shares if report.shares_defined else {}
        name = index_text(meta)
        columns.append(Column(name, f"window {name}", ms, ms, ms, shares))
    return columns


def bucket_columns(buckets: list[Bucket]) -> list[Column]:
    return [
        Column(bucket_span(b), f"windows {bucket_span(b)}", b.ms[1], b.ms[0], b.ms[2], b.shares)
        for b in buckets
    ]


def share_timeline(columns: list[Column], stages: list[str], colors: list[str]) -> Timeline:
    """Stacked shares per column under the exposed ms/step (a bucket's median, its min-max
    band shaded), laid out for inline SVG."""
    n = len(columns)
    width, left, right = 960, 56, 12
    top_h, gap, bar_h, label_h = 90, 14, 240, 46
    height = top_h + gap + bar_h + label_h
    step = (width - left - right) / max(n, 1)
    bar_w = max(step * 0.8, 1.0)
    peak = max(max(c.high for c in columns), 1e-9) * 1.15

    def at(i: int, value: float) -> str:
        return f"{left + step * (i + 0.5):.1f},{top_h - value / peak * top_h:.1f}"

    points = " ".join(at(i, c.ms) for i, c in enumerate(columns))
    band = ""
    if any(c.low != c.high for c in columns):
        band = " ".join(
            [at(i, c.high) for i, c in enumerate(columns)]
            + [at(i, c.low) for i, c in reversed(list(enumerate(columns)))]
        )
    base = top_h + gap
    bars = []
    for i, column in enumerate(columns):
        x = left + step * i + (step - bar_w) / 2
        y = float(base + bar_h)
        for stage, color in zip(stages, colors, strict=True):
            h = float(column.shares.get(stage, 0.0)) * bar_h
            if h <= 0:
                continue
            y -= h
            tip = f"{column.what}: {stage} {column.shares[stage]:.0%}"
            bars.append(Bar(f"{x:.1f}", f"{y:.1f}", f"{bar_w:.1f}", f"{h:.1f}", color, tip))
    labels = [
        Label("4", f"{base + bar_h - frac * bar_h + 4:.0f}", f"{frac:.0%}")
        for frac in (0.0, 0.5, 1.0)
    ]
    every = max(1, n // 24)  # at most ~24 labels, whatever the run's length
    labels += [
        Label(f"{left + step * (i + 0.5):.1f}", str(base + bar_h + 16), column.name, True)
        for i, column in enumerate(columns)
        if i % every == 0 or i == n - 1
    ]
    labels.append(
        Label(f"{left + (width - left - right) / 2:.0f}", str(height - 8), "window", True)
    )
    peak_label = f"{max(c.high for c in columns):.0f}"
    return Timeline(width, height, top_h, points, band, peak_label, bars, labels)


# --- tables ---------------------------------------------------------------------------------------


def _verdict_rows(windows: list[tuple[WindowReport, dict[str, Any]]]) -> list[dict[str, str]]:
    """One row per window; a window that found what the one before it found says ``same as
    window N`` instead of repeating its verdict."""
    rows = []
    headlines = Headlines()
    for report, meta in windows:
        same = headlines.same_as(report, meta)
        top = report.top1
        share = f"{report.semantic_shares[top]:.0%}" if top and report.shares_defined else "n/a"
        labels = ", ".join(label for label in report.labels if label != "frontier_accounting")
        rows.append(
            {
                "index": index_text(meta),
                "steps": f"{meta.get('first_step', '?')}-{meta.get('last_step', '?')}",
                "time": clock_cell(meta),
                "ms": f"{report.mean_step_s * 1e3:.1f}",
                "top": top or "-",
                "share": share,
                "lead": lead_text(report, meta) if top else "",
                "labels": labels or "-",
                "verdict": f"same as window {same}" if same else verdict(report, meta),
            }
        )
    return rows


def _regressions(windows: list[tuple[WindowReport, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [
        (index_text(meta), regression_text(meta["regression"]))
        for _, meta in windows
        if isinstance(meta.get("regression"), dict)
    ]


SLOWED = 1.1
"""A window the profiler router worked in is named as slowed by it when its step time exceeds
the median other window's by this factor."""


def slowed_by_router(run: RunWindows) -> str:
    """A note naming the windows the profiler router's capture slowed (:data:`SLOWED`), with
    their step time against the other windows': they are the router's cost, not the
    training's; empty when none was (or the folder has no packets to tell)."""
    typical = run.slowed.typical_ms
    if run.worst is None or typical is None:
        return ""
    slowed = [(facts, ms) for facts, ms in run.slowed.windows if ms > SLOWED * typical]
    if not slowed:  # those it did slow: a window it captured in may have run at the usual pace
        return ""
    said = ", ".join(f"window {index_text(facts)} ran {ms:.1f} ms/step" for facts, ms in slowed)
    them = "it" if len(slowed) == 1 else "them"
    return (
        f"{said}, against {typical:.1f} ms/step for the median other window: the profiler "
        f"router's capture slowed {them} (its captured steps, its trace export and reduction), "
        f"which is the router's cost, not the training's, so the frontier figure's worst step "
        f"leaves {them} out too."
    )


@dataclass(frozen=True)
class Comparison:
    """Each stage's mean share under StageFrontier and the rank-local timers, and the legend."""

    titles: list[str]
    rows: list[list[str]]
    intro: str
    notes: list[tuple[str, str]]
    outro: str
    packetless: str = ""
    """The windows left out of these shares for want of a packet, or ``""``."""


def _comparison(run: RunWindows) -> Comparison | None:
    if run.methods is None:
        return None
    methods = list(METHOD_TITLES)
    mean = {m: run.methods.mean(m) for m in methods}
    rows = [[stage, *(f"{mean[m][j]:.1%}" for m in methods)] for j, stage in enumerate(run.stages)]
    return Comparison(
        titles=[METHOD_TITLES[m] for m in methods],
        rows=rows,
        intro=METHOD_INTRO + sample_note(run.methods),
        notes=list(METHOD_NOTES.items()),
        outro=METHOD_OUTRO,
        packetless=(
            f"{run.packetless}: left out of these shares and the figure." if run.packetless else ""
        ),
    )


@dataclass(frozen=True)
class IncidentEntry:
    """An incident on the run's page: the link to its own page, its line, its op diff."""

    id: str
    link: str
    summary: str
    diff: OpDiff


def _incidents(run: RunWindows, page_path: Path) -> list[IncidentEntry]:
    from ..formats.incident import list_incidents
    from .incident import summary_line

    return [
        IncidentEntry(
            id=str(incident["id"]),
            link=_relative(
                run.folder / "incidents" / incident["id"] / "incident.html", page_path.parent
            ),
            summary=summary_line(incident),
            diff=op_diff(incident, limit=5),
        )
        for incident in list_incidents(run.folder)
    ]


def _relative(target: Path, start: Path) -> str:
    try:
        return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
    except ValueError:  # another drive
        return target.resolve().as_uri()


@dataclass(frozen=True)
class CostTable:
    """The most the telemetry cost a rank (``summary``) and the per-window table's rows, in the
    same figures (the share of step time leaves the router's background threads out)."""

    summary: str
    rows: list[list[str]]


def _self_cost(windows: list[tuple[WindowReport, dict[str, Any]]]) -> CostTable:
    costs = [(meta, cost) for _, meta in windows if (cost := self_cost(meta)) is not None]
    rows = [
        [
            index_text(meta),
            f"{cost.fraction:.2%}",
            *(f"{value * 1e3:.1f}" for value in cost.spent.values()),
            f"{cost.capture_s * 1e3:.1f}",
            f"{cost.router_s * 1e3:.1f}",
        ]
        for meta, cost in costs
    ]
    if not costs:
        return CostTable("", [])
    worst = max(costs, key=lambda pair: pair[1].fraction)[0]
    return CostTable(self_cost_text(worst) or "under 1% of step time in every window", rows)
