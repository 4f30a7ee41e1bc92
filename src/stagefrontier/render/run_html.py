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

import numpy as np

from ..analysis.regression import regression_text
from ..analysis.schema import semantic_stage
from ..analysis.window_report import WindowReport
from ..formats.packet import write_bytes_atomically
from ..formats.run_folder import RunWindows, method_shares, packetless_line
from ..formats.wall_clock import clock_cell, run_clock, span_text
from .command import cli_command
from .headline import Headlines
from .html_page import Figure, OpDiff, drawn_figures, op_diff, render
from .plots import RESIDUAL_COLOR, stage_colors
from .text import (
    METHOD_INTRO,
    METHOD_NOTES,
    METHOD_OUTRO,
    METHOD_TITLES,
    index_text,
    lead_text,
    report_windows,
    self_cost,
    self_cost_text,
    summary_window,
)
from .verdict import ranks_text, single_leader, verdict

MIN_LEADER_SHARE = 0.05
"""A rank counts as setting the frontier in a window when it leads a stage carrying at least
this share of the exposed time."""
MAX_LEADER_ROWS = 64
"""The leaders view lists at most this many ranks (those that led the most windows first)."""


def write_run_html(run: RunWindows, path: str | Path) -> Path:
    """Write the run's report page to ``path`` (its folder made if needed); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_bytes_atomically(out, run_html(run, out).encode())


def run_html(run: RunWindows, path: Path) -> str:
    windows = report_windows(run)
    stages = list(dict.fromkeys(semantic_stage(s) for s in run.stages))
    colors = stage_colors(stages)
    last_report, last_meta = summary_window(windows)
    shown: list[Figure] | None = None
    if run.packets:
        from .plots import plot_worst_step

        redraw = (
            f"run `{cli_command()} report {shlex.quote(str(run.folder))} --html` "
            "to write this page again"
        )
        shown = drawn_figures(
            [("Frontier of the worst step", lambda p: plot_worst_step(run, p))], redraw
        )
    return render(
        "run_report.html.j2",
        title=f"StageFrontier report: {run.folder}",
        folder=str(run.folder),
        last_index=index_text(last_meta),
        last_verdict=verdict(last_report, last_meta),
        run_facts=_run_facts(run, windows),
        timeline=share_timeline(windows, stages, colors),
        key=list(zip(stages, colors, strict=True)),
        leaders=leaders_view(windows, stages, colors),
        verdicts=_verdict_rows(windows),
        regressions=_regressions(windows),
        slowed=slowed_by_router(windows, run),
        comparison=_comparison(run),
        incidents=_incidents(run, path),
        self_cost=_self_cost(windows),
        shown=shown,
    )


# --- run facts ------------------------------------------------------------------------------------


def _run_facts(
    run: RunWindows, windows: list[tuple[WindowReport, dict[str, Any]]]
) -> list[tuple[str, str]]:
    first, last = windows[0][1], windows[-1][1]
    ranks = max(report.n_ranks for report, _ in windows)
    items = [("folder", str(run.folder))]
    if first.get("run_id"):
        items.append(("run id", str(first["run_id"])))
    steps = f"{first.get('first_step', '?')}-{last.get('last_step', '?')}"
    items.append(("windows", f"{len(windows)} (steps {steps})"))
    when = span_text(run_clock([meta for _, meta in windows]), dated=True)
    if when != "?":
        items.append(("time", when))
    world = first.get("world_size")
    items.append(("ranks", f"{ranks}" + (f" of world size {world}" if world else "")))
    hosts = first.get("hosts")
    if isinstance(hosts, Mapping) and hosts:
        names = sorted({str(h) for h in hosts.values()})
        items.append(
            ("hosts", f"{len(names)}: " + ", ".join(names[:8]) + (", ..." * (len(names) > 8)))
        )
    attempts = sorted({int(m.get("attempt") or 0) for _, m in windows})
    if attempts != [0]:
        items.append(("restart attempts", ", ".join(map(str, attempts))))
    items.append(("stages", ", ".join(run.stages)))
    missing = sorted({r for _, m in windows for r in (m.get("missing_ranks") or [])})
    if missing:
        items.append(("ranks missing from some window", ranks_text(missing)))
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
    peak_label: str
    bars: list[Bar]
    labels: list[Label]


def share_timeline(
    windows: list[tuple[WindowReport, dict[str, Any]]], stages: list[str], colors: list[str]
) -> Timeline:
    """Stacked shares per window under the exposed ms/step, laid out for inline SVG."""
    n = len(windows)
    width, left, right = 960, 56, 12
    top_h, gap, bar_h, label_h = 90, 14, 240, 46
    height = top_h + gap + bar_h + label_h
    step = (width - left - right) / max(n, 1)
    bar_w = max(step * 0.8, 1.0)
    ms = [report.mean_step_s * 1e3 for report, _ in windows]
    peak = max(max(ms), 1e-9) * 1.15
    points = " ".join(
        f"{left + step * (i + 0.5):.1f},{top_h - value / peak * top_h:.1f}"
        for i, value in enumerate(ms)
    )
    base = top_h + gap
    bars = []
    for i, (report, meta) in enumerate(windows):
        x = left + step * i + (step - bar_w) / 2
        y = float(base + bar_h)
        shares = report.semantic_shares if report.shares_defined else {}
        for stage, color in zip(stages, colors, strict=True):
            h = float(shares.get(stage, 0.0)) * bar_h
            if h <= 0:
                continue
            y -= h
            tip = f"window {index_text(meta)}: {stage} {shares[stage]:.0%}"
            bars.append(Bar(f"{x:.1f}", f"{y:.1f}", f"{bar_w:.1f}", f"{h:.1f}", color, tip))
    labels = [
        Label("4", f"{base + bar_h - frac * bar_h + 4:.0f}", f"{frac:.0%}")
        for frac in (0.0, 0.5, 1.0)
    ]
    every = max(1, n // 24)  # at most ~24 window labels, whatever the run's length
    labels += [
        Label(f"{left + step * (i + 0.5):.1f}", str(base + bar_h + 16), index_text(meta), True)
        for i, (_, meta) in enumerate(windows)
        if i % every == 0 or i == n - 1
    ]
    labels.append(
        Label(f"{left + (width - left - right) / 2:.0f}", str(height - 8), "window", True)
    )
    return Timeline(width, height, top_h, points, f"{max(ms):.0f}", bars, labels)


# --- the leaders view -----------------------------------------------------------------------------


def window_leaders(report: WindowReport) -> dict[int, tuple[str, float]]:
    """Per rank that sets the frontier in this window: the (broad) stage it leads with the
    largest share, and that share. Only a single, steady leader counts (as the verdict names
    one); stages under ``MIN_LEADER_SHARE`` are left out."""
    out: dict[int, tuple[str, float]] = {}
    if not report.shares_defined:
        return out
    for stage in report.semantic_localization:
        share = float(report.semantic_shares.get(stage, 0.0))
        leader = single_leader(report, stage)
        if leader is None or share < MIN_LEADER_SHARE:
            continue
        if leader not in out or out[leader][1] < share:
            out[leader] = (stage, share)
    return out


@dataclass(frozen=True)
class LeaderCell:
    """A rank's cell in a window where it sets the frontier: its stage's colour and share."""

    tip: str
    color: str
    share: str


@dataclass(frozen=True)
class Leaders:
    """The leaders view: ``rows`` are (rank, one cell or None per window) for the ranks that
    ever lead (at most ``MAX_LEADER_ROWS``; ``hidden`` more left out), of ``ranks``."""

    leading: int
    ranks: int
    hidden: int
    windows: list[str]
    rows: list[tuple[int, list[LeaderCell | None]]]


def leaders_view(
    windows: list[tuple[WindowReport, dict[str, Any]]], stages: list[str], colors: list[str]
) -> Leaders:
    """Rank by window: a coloured cell where the rank sets the frontier, in the colour of the
    stage it leads, with that stage's share. Only ranks that ever lead are listed."""
    color = dict(zip(stages, colors, strict=True))
    per_window = [window_leaders(report) for report, _ in windows]
    count: dict[int, int] = {}
    for leaders in per_window:
        for rank in leaders:
            count[rank] = count.get(rank, 0) + 1
    ranks = sorted(sorted(count, key=lambda r: (-count[r], r))[:MAX_LEADER_ROWS])
    rows: list[tuple[int, list[LeaderCell | None]]] = []
    for rank in ranks:
        cells: list[LeaderCell | None] = []
        for (_, meta), leaders in zip(windows, per_window, strict=True):
            if rank not in leaders:
                cells.append(None)
                continue
            stage, share = leaders[rank]
            tip = f"window {index_text(meta)}: rank {rank} sets {stage} ({share:.0%})"
            cells.append(LeaderCell(tip, color.get(stage, RESIDUAL_COLOR), f"{share:.0%}"))
        rows.append((rank, cells))
    return Leaders(
        leading=len(count),
        ranks=max(report.n_ranks for report, _ in windows),
        hidden=len(count) - len(ranks),
        windows=[index_text(meta) for _, meta in windows],
        rows=rows,
    )


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


def slowed_by_router(windows: list[tuple[WindowReport, dict[str, Any]]], run: RunWindows) -> str:
    """A note naming the windows the profiler router's capture slowed (:data:`SLOWED`), with
    their step time against the other windows': they are the router's cost, not the
    training's; empty when none was (or the folder has no packets to tell)."""
    from .plots import router_windows

    captured = router_windows(run) if run.packets else set()
    others = [w[0].mean_step_s for i, w in enumerate(windows) if i not in captured]
    if not others:
        return ""
    typical = float(np.median(others)) * 1e3
    slowed = [  # those it did slow: a window it captured in may have run at the usual pace
        i for i in sorted(captured) if windows[i][0].mean_step_s * 1e3 > SLOWED * typical
    ]
    if not slowed:
        return ""
    said = ", ".join(
        f"window {index_text(windows[i][1])} ran {windows[i][0].mean_step_s * 1e3:.1f} ms/step"
        for i in slowed
    )
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
    if not run.packets:
        return None
    per_window = [method_shares(p) for p in run.packets]
    methods = list(METHOD_TITLES)
    rows = []
    for j, stage in enumerate(run.stages):
        mean = [sum(w[m][j] for w in per_window) / len(per_window) for m in methods]
        rows.append([stage, *(f"{v:.1%}" for v in mean)])
    return Comparison(
        titles=[METHOD_TITLES[m] for m in methods],
        rows=rows,
        intro=METHOD_INTRO,
        notes=list(METHOD_NOTES.items()),
        outro=METHOD_OUTRO,
        packetless=(
            f"{packetless_line(run.packetless)}: left out of these shares and the figure."
            if run.packetless
            else ""
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
