"""``stagefrontier report DIR --html``: one self-contained page for a whole run.

The share timeline and the leaders view are inline SVG and HTML drawn here (no matplotlib
needed, readable at any number of ranks: the leaders view lists only the ranks that ever set the
frontier); the frontier figure of the worst step is embedded when matplotlib is installed, and
said missing otherwise. Built from the shared pieces of ``render/html_page.py``, as the incident
pages are.
"""

from __future__ import annotations

import importlib.metadata
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..analysis.regression import regression_text
from ..analysis.schema import semantic_stage
from ..analysis.window_report import WindowReport
from ..formats.packet import write_bytes_atomically
from ..formats.run_folder import RunWindows, method_shares, packetless_line
from .command import cli_command
from .html_page import drawn_figures, esc, facts, note, op_diff_table, page, swatch_key, table
from .plots import RESIDUAL_COLOR, stage_colors
from .text import (
    METHOD_INTRO,
    METHOD_NOTES,
    METHOD_OUTRO,
    METHOD_TITLES,
    index_text,
    lead_text,
    report_windows,
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
    body = [
        f"<h1>StageFrontier run report: {esc(run.folder)}</h1>",
        f"<p><b>Verdict</b> (last full window, {esc(index_text(last_meta))}): "
        f"{esc(verdict(last_report, last_meta))}</p>",
        "<h2>Run</h2>",
        facts(_run_facts(run, windows)),
        "<h2>Share of exposed step time per window</h2>",
        "<p>Each bar is one window: how much of the step time each stage holds every rank back "
        "by (the frontier's advance in that stage). The line above is the exposed step time.</p>",
        share_timeline_svg(windows, stages, colors),
        swatch_key(list(zip(stages, colors, strict=True))),
        "<h2>Who sets the frontier</h2>",
        leaders_view(windows, stages, colors),
        "<h2>Verdict per window</h2>",
        _verdict_table(windows),
        _regressions(windows),
        _comparison(run),
        _incidents(run, path),
        "<h2>StageFrontier's own cost</h2>",
        _self_cost(windows),
    ]
    if run.packets:
        from .plots import plot_worst_step

        redraw = (
            f"run `{cli_command()} report {shlex.quote(str(run.folder))} --html` "
            "to write this page again"
        )
        figure, _ = drawn_figures(
            [("Frontier of the worst step", lambda p: plot_worst_step(run, p))], redraw
        )
        body.append(figure)
    else:
        body.append(
            note(
                "No frontier figure: the folder holds no per-rank packets (a run collected "
                "hierarchically keeps the [steps, ranks, stages] matrix on its nodes)."
            )
        )
    return page(f"StageFrontier report: {run.folder}", "".join(body))


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


def share_timeline_svg(
    windows: list[tuple[WindowReport, dict[str, Any]]], stages: list[str], colors: list[str]
) -> str:
    """Stacked shares per window under the exposed ms/step, as inline SVG."""
    n = len(windows)
    width, left, right = 960, 56, 12
    top_h, gap, bar_h, label_h = 90, 14, 240, 46
    height = top_h + gap + bar_h + label_h
    step = (width - left - right) / max(n, 1)
    bar_w = max(step * 0.8, 1.0)
    ms = [report.mean_step_s * 1e3 for report, _ in windows]
    peak = max(max(ms), 1e-9) * 1.15
    parts = [
        f"<svg viewBox='0 0 {width} {height}' width='{width}' role='img' "
        "aria-label='share of exposed step time per window' "
        "style='font:11px sans-serif' xmlns='http://www.w3.org/2000/svg'>"
    ]
    points = []
    for i, value in enumerate(ms):
        x = left + step * (i + 0.5)
        y = top_h - value / peak * top_h
        points.append(f"{x:.1f},{y:.1f}")
    parts.append(
        f"<polyline fill='none' stroke='#222' stroke-width='1.5' points='{' '.join(points)}'/>"
    )
    parts.append(f"<text x='4' y='12'>ms/step</text><text x='4' y='{top_h}'>0</text>")
    parts.append(f"<text x='4' y='26'>{max(ms):.0f}</text>")
    base = top_h + gap
    for i, (report, meta) in enumerate(windows):
        x = left + step * i + (step - bar_w) / 2
        y = base + bar_h
        shares = report.semantic_shares if report.shares_defined else {}
        for stage, color in zip(stages, colors, strict=True):
            h = float(shares.get(stage, 0.0)) * bar_h
            if h <= 0:
                continue
            y -= h
            tip = f"window {index_text(meta)}: {stage} {shares[stage]:.0%}"
            parts.append(
                f"<rect x='{x:.1f}' y='{y:.1f}' width='{bar_w:.1f}' height='{h:.1f}' "
                f"fill='{color}'><title>{esc(tip)}</title></rect>"
            )
    for frac in (0.0, 0.5, 1.0):
        y = base + bar_h - frac * bar_h
        parts.append(f"<text x='4' y='{y + 4:.0f}'>{frac:.0%}</text>")
    every = max(1, n // 24)  # at most ~24 window labels, whatever the run's length
    for i, (_, meta) in enumerate(windows):
        if i % every == 0 or i == n - 1:
            x = left + step * (i + 0.5)
            parts.append(
                f"<text x='{x:.1f}' y='{base + bar_h + 16}' text-anchor='middle'>"
                f"{esc(index_text(meta))}</text>"
            )
    parts.append(
        f"<text x='{left + (width - left - right) / 2:.0f}' y='{height - 8}' "
        "text-anchor='middle'>window</text></svg>"
    )
    return "<div class='wide'>" + "".join(parts) + "</div>"


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


def leaders_view(
    windows: list[tuple[WindowReport, dict[str, Any]]], stages: list[str], colors: list[str]
) -> str:
    """Rank by window: a coloured cell where the rank sets the frontier, in the colour of the
    stage it leads, with that stage's share. Only ranks that ever lead are listed."""
    color = dict(zip(stages, colors, strict=True))
    per_window = [window_leaders(report) for report, _ in windows]
    count: dict[int, int] = {}
    for leaders in per_window:
        for rank in leaders:
            count[rank] = count.get(rank, 0) + 1
    if not count:
        return "<p>No rank leads a stage in any window (no exposed time, or roles).</p>"
    ranks = sorted(count, key=lambda r: (-count[r], r))[:MAX_LEADER_ROWS]
    ranks.sort()
    n_ranks = max(report.n_ranks for report, _ in windows)
    header = ["rank", *(esc(index_text(meta)) for _, meta in windows)]
    rows = []
    for rank in ranks:
        cells = [f"<b>{rank}</b>"]
        for (_, meta), leaders in zip(windows, per_window, strict=True):
            if rank in leaders:
                stage, share = leaders[rank]
                tip = f"window {index_text(meta)}: rank {rank} sets {stage} ({share:.0%})"
                cells.append(
                    f"<span title='{esc(tip)}' style='display:block;background:"
                    f"{color.get(stage, RESIDUAL_COLOR)};color:#fff;text-align:center;"
                    f"font-weight:bold'>{share:.0%}</span>"
                )
            else:
                cells.append("")
        rows.append(cells)
    hidden = len(count) - len(ranks)
    intro = (
        f"<p>{len(count)} of {n_ranks} rank(s) set the frontier in some window: each coloured "
        "cell is the stage that rank leads in that window, and that stage's share of the "
        "exposed time. Ranks that never lead are not listed; a window where no single rank "
        "leads a stage (the lead is shared or keeps changing) has no cell."
        + (f" {hidden} more rank(s) led fewer windows and are left out." if hidden else "")
        + "</p>"
    )
    return intro + table(header, rows)


# --- tables ---------------------------------------------------------------------------------------


def _verdict_table(windows: list[tuple[WindowReport, dict[str, Any]]]) -> str:
    rows = []
    for report, meta in windows:
        top = report.top1
        share = f"{report.semantic_shares[top]:.0%}" if top and report.shares_defined else "n/a"
        labels = ", ".join(label for label in report.labels if label != "frontier_accounting")
        rows.append(
            [
                esc(index_text(meta)),
                esc(f"{meta.get('first_step', '?')}-{meta.get('last_step', '?')}"),
                f"{report.mean_step_s * 1e3:.1f}",
                f"<code>{esc(top or '-')}</code> {share}<br>"
                f"{esc(lead_text(report, meta) if top else '')}",
                esc(labels or "-"),
                esc(verdict(report, meta)),
            ]
        )
    return table(
        ["window", "steps", "ms/step", "top stage", "labels", "verdict"], rows, numeric=(2,)
    )


def _regressions(windows: list[tuple[WindowReport, dict[str, Any]]]) -> str:
    rows = [
        [esc(index_text(meta)), esc(regression_text(meta["regression"]))]
        for _, meta in windows
        if isinstance(meta.get("regression"), dict)
    ]
    if not rows:
        return "<h2>Regressions</h2><p>No window was slower than the run's healthy windows.</p>"
    return "<h2>Regressions</h2>" + table(["window", "slower than the baseline"], rows)


def _comparison(run: RunWindows) -> str:
    if not run.packets:
        return ""
    per_window = [method_shares(p) for p in run.packets]
    methods = list(METHOD_TITLES)
    rows = []
    for j, stage in enumerate(run.stages):
        mean = [sum(w[m][j] for w in per_window) / len(per_window) for m in methods]
        rows.append([f"<code>{esc(stage)}</code>", *(f"{v:.1%}" for v in mean)])
    notes = "".join(f"<li><b>{esc(t)}</b>: {esc(text)}</li>" for t, text in METHOD_NOTES.items())
    legend = f"{esc(METHOD_INTRO)}<ul>{notes}</ul>{esc(METHOD_OUTRO)}"
    return (
        "<h2>StageFrontier next to rank-local timers</h2>"
        + table(
            ["stage", *(METHOD_TITLES[m] for m in methods)],
            rows,
            numeric=tuple(range(1, len(methods) + 1)),
        )
        + f"<div class='muted'>{legend}</div>"
        + _packetless_note(run)
    )


def _packetless_note(run: RunWindows) -> str:
    if not run.packetless:
        return ""
    return note(f"{packetless_line(run.packetless)}: left out of these shares and the figure.")


def _incidents(run: RunWindows, page_path: Path) -> str:
    from .incident import list_incidents, summary_line

    incidents = list_incidents(run.folder)
    if not incidents:
        return "<h2>Incidents</h2><p>The profiler router opened no incident.</p>"
    out = [f"<h2>Incidents ({len(incidents)})</h2>"]
    for incident in incidents:
        target = run.folder / "incidents" / incident["id"] / "incident.html"
        link = _relative(target, page_path.parent)
        out.append(
            f"<h3><a href='{esc(link)}'>Incident {esc(incident['id'])}</a></h3>"
            f"<p>{esc(summary_line(incident))}</p>"
        )
        out.append(
            op_diff_table(incident, limit=5).replace("<h2>", "<h4>").replace("</h2>", "</h4>")
        )
    return "".join(out)


def _relative(target: Path, start: Path) -> str:
    import os

    try:
        return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()
    except ValueError:  # another drive
        return target.resolve().as_uri()


def _self_cost(windows: list[tuple[WindowReport, dict[str, Any]]]) -> str:
    rows = []
    for _, meta in windows:
        cost = meta.get("self_cost")
        if not isinstance(cost, Mapping):
            continue

        def most(key: str, cost: Mapping[str, Any] = cost) -> float:
            value = cost.get(key, {})
            return float(value.get("max", 0.0)) if isinstance(value, Mapping) else 0.0

        rows.append(
            [
                esc(index_text(meta)),
                f"{most('fraction'):.2%}",
                f"{most('hot_path_s') * 1e3:.1f}",
                f"{most('handoff_s') * 1e3:.1f}",
                f"{most('threads_cpu_s') * 1e3:.1f}",
                f"{most('router_cpu_s') * 1e3:.1f}",
            ]
        )
    if not rows:
        return "<p>The windows carry no self-cost figures.</p>"
    worst = max(windows, key=lambda w: _fraction(w[1]))[1]
    summary = self_cost_text(worst) or "under 1% of step time in every window"
    return f"<p>The most it cost a rank: {esc(summary)}.</p>" + table(
        [
            "window",
            "of step time (rank max)",
            "hot path ms",
            "hand-off ms",
            "collection ms",
            "profiler router ms",
        ],
        rows,
        numeric=(1, 2, 3, 4, 5),
    )


def _fraction(meta: Mapping[str, Any]) -> float:
    cost = meta.get("self_cost")
    if not isinstance(cost, Mapping):
        return 0.0
    fraction = cost.get("fraction", {})
    return float(fraction.get("max", 0.0)) if isinstance(fraction, Mapping) else 0.0
