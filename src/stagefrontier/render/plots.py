"""PNG figures for an output folder: the frontier of a typical and of the worst step, and the
shares and exposed step time per window with the top stage's leading rank."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.accounting import FloatArray
from ..analysis.schema import RESIDUAL_STAGE, semantic_stage
from ..errors import StageFrontierError
from ..formats.packet import Packet
from ..formats.run_folder import RunWindows
from .escape import printable
from .verdict import ranks_text

STAGE_COLORS = ["#0072B2", "#009E73", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9", "#8C6D1F"]
"""Colour-blind-safe stage colours (Okabe-Ito, plus a brown); the residual is always grey."""
RESIDUAL_COLOR = "#9A9A9A"
FRONTIER_COLOR = "#7A1F5C"
MIN_LABELED_ADVANCE = 0.02
"""Frontier advances below this fraction of the step are drawn but not labeled."""
MIN_ARROW_ADVANCE = 0.08
"""Frontier advances below this fraction of the step are too short for arrow heads."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise StageFrontierError(
            "plots need matplotlib: pip install 'stagefrontier[plot]'"
        ) from None
    return plt


def stage_colors(stages: Sequence[str]) -> list[str]:
    colors, j = [], 0
    for stage in stages:
        if stage == RESIDUAL_STAGE:
            colors.append(RESIDUAL_COLOR)
        else:
            colors.append(STAGE_COLORS[j % len(STAGE_COLORS)])
            j += 1
    return colors


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    """Write the figure, its text escaped as every text output's is (a stage name's control
    characters shown as ``\\x1b``, not as a missing glyph) but for the line breaks the figure
    itself puts in a title or label; names are escaped where they enter a text, and tick
    labels, which matplotlib writes again when it draws, where they are set."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_text("\n".join(printable(line) for line in text.get_text().split("\n")))
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------- frontier of a step
def plot_worst_step(
    run: RunWindows, path: str | Path, captured: tuple[int, int] | None = None
) -> Path:
    """Each rank's prefix curve and the frontier of the run's worst step (the largest exposed
    time), below the typical step of the same window (its median exposed time) for scale; with
    ``captured`` (an incident's first and last step), the slowest of those steps instead."""
    packet, shown = steps_to_show(run) if captured is None else captured_steps(run, captured)
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(10, 4.4 * len(shown) + 1.2),
        dpi=110,
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    stages = list(packet.stages)
    ranks = packet.rank_ids
    for ax, (t, what) in zip(axes[:, 0], shown, strict=True):
        total = _draw_step(ax, packet.d[t] * 1e3, ranks, stages)
        head, *note = what.split("\n")
        title = f"{head}: step {_step_index(packet, t)}, exposed {total:.1f} ms"
        ax.set_title("\n".join([title, *note]), fontsize=10)
        ax.set_ylabel("rank-local prefix time (ms)")
    bottom = axes[-1, 0]
    bottom.set_xticks(np.arange(len(stages) + 1), ["start", *map(printable, stages)])
    plt.setp(bottom.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor", fontsize=8)
    bottom.set_xlim(-0.3, len(stages) + 3.2)
    meta = packet.meta
    fig.suptitle(
        f"Max-prefix frontier, window {meta.get('window', '?')} "
        f"(steps {meta.get('first_step', '?')}-{meta.get('last_step', '?')}); "
        "arrows: each stage's advance of the frontier and the rank that sets it",
        fontsize=10,
    )
    return _save(plt, fig, path)


def steps_to_show(run: RunWindows) -> tuple[Packet, list[tuple[int, str]]]:
    """The packet holding the run's worst step (largest exposed time), and the steps of it to
    draw, each with what it is: the window's typical step (its median exposed time), then the
    worst step (only the worst when they are the same step).

    Windows the profiler router slowed (a capture, its trace export and reduction:
    ``formats.run_digest.SchemaDigest.router_slowed``) are left out of the search for the worst
    step, and the title says so: their slowest step is the router's own cost, not the run's.
    When every window was slowed, all are searched and the worst step is said to include the
    router's cost."""
    if run.worst is None:
        raise StageFrontierError("the frontier figure needs packets/ (the per-rank matrix)")
    packet = run.worst
    steps = packet.d.sum(axis=2).max(axis=1)  # [N] seconds
    worst = int(steps.argmax())
    typical = int(np.argsort(steps, kind="stable")[len(steps) // 2])
    what = "worst step of the run"
    if run.worst_slowed:
        what += "\nevery window carries the profiler router's capture cost"
    elif run.slowed.windows:
        names = ranks_text([int(facts["window"]) for facts, _ in run.slowed.windows])
        what += f"\nwindow(s) {names} left out: the profiler router's capture slowed them"
    shown = [(worst, what)]
    if typical != worst:
        shown.insert(0, (typical, "typical step (median exposed time of its window)"))
    return packet, shown


def captured_steps(
    run: RunWindows, captured: tuple[int, int]
) -> tuple[Packet, list[tuple[int, str]]]:
    """As ``steps_to_show``, for an incident: the slowest of its captured steps, after the
    typical step of their window; the run's worst step, saying so, when no packet holds them."""
    first, last = captured
    for packet in run.captured:
        rows = [t for t in range(packet.d.shape[0]) if first <= _step_index(packet, t) <= last]
        if rows:
            exposed = packet.d.sum(axis=2).max(axis=1)
            slowest = max(rows, key=lambda t: float(exposed[t]))
            typical = int(np.argsort(exposed, kind="stable")[len(exposed) // 2])
            shown = [(slowest, f"slowest captured step (steps {first}-{last} were captured)")]
            if typical != slowest:
                shown.insert(0, (typical, "typical step (median exposed time of its window)"))
            return packet, shown
    packet, shown = steps_to_show(run)
    t, what = shown[-1]
    return packet, [*shown[:-1], (t, f"{what}\nno packet holds the captured steps {first}-{last}")]


def _step_index(packet: Packet, t: int) -> int:
    first = packet.meta.get("first_step")
    return first + t if isinstance(first, int) else t


def _draw_step(ax: Any, d: FloatArray, ranks: list[int], stages: list[str]) -> float:
    """One step's ``[R, S]`` milliseconds: rank prefixes over the frontier, advance arrows at
    the right, each in the colour of the rank that sets it; returns the exposed time."""
    n_ranks, n_stages = d.shape
    prefix = np.concatenate([np.zeros((n_ranks, 1)), np.cumsum(d, axis=1)], axis=1)
    front = prefix.max(axis=0)
    setters = prefix[:, 1:].argmax(axis=0)
    x = np.arange(n_stages + 1)
    # the frontier is a wide pale band underneath, so the rank line that sets it stays visible
    ax.plot(x, front, color=FRONTIER_COLOR, lw=9, alpha=0.22, solid_capstyle="round", zorder=1)
    advances = np.diff(front)
    styles = rank_styles(prefix[:, -1], setters, advances, ranks)
    for r in sorted(range(n_ranks), key=lambda r: "label" in styles[r]):  # highlighted on top
        ax.plot(x, prefix[r], zorder=3 if "label" in styles[r] else 2, **styles[r])
    if n_ranks > len(RANK_COLORS):
        ax.plot([], [], color=OTHER_RANK, lw=0.8, label="other ranks")
    ax.plot([], [], color=FRONTIER_COLOR, lw=9, alpha=0.22, label="frontier (max over ranks)")
    arrow_x = n_stages + 0.3
    labeled = []
    for j in range(n_stages):
        low, high = front[j], front[j + 1]
        color = styles[setters[j]]["color"]
        if high - low > MIN_ARROW_ADVANCE * front[-1]:
            ax.annotate(
                "",
                xy=(arrow_x, high),
                xytext=(arrow_x, low),
                arrowprops={"arrowstyle": "<->", "color": color, "lw": 1.5, "shrinkA": 0},
            )
        else:
            ax.plot([arrow_x, arrow_x], [low, high], color=color, lw=3, solid_capstyle="butt")
        if high - low > MIN_LABELED_ADVANCE * front[-1]:
            labeled.append((j, (low + high) / 2, high - low))
    heights = _spread([y for _, y, _ in labeled], gap=0.07 * max(front[-1], 1e-9))
    for (j, _, advance), y in zip(labeled, heights, strict=True):
        ax.text(
            arrow_x + 0.12,
            y,
            f"{printable(stages[j])} +{advance:.1f} ms, rank {ranks[setters[j]]}",
            va="center",
            fontsize=8,
            color=styles[setters[j]]["color"],
        )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    return float(front[-1])


RANK_COLORS = (
    "#000000",
    "#E69F00",
    "#0072B2",
    "#009E73",
    "#D55E00",
    "#56B4E9",
    "#CC79A7",
    "#8C6D1F",
)
"""Eight rank colours that stay apart, also for colour-blind readers (Okabe-Ito, its pale
yellow swapped for a brown); each rank also has its own marker."""
RANK_MARKERS = "osD^vPX*"
OTHER_RANK = "#C8C8C8"
"""Above eight ranks, the ranks that neither set the frontier nor are the reference."""


def rank_styles(
    totals: FloatArray, setters: Any, advances: FloatArray, ranks: list[int]
) -> list[dict[str, Any]]:
    """Line styles per rank position. Up to eight ranks, each its own colour and marker. Above
    that, the ranks that set the frontier's largest advances (strongest first) and the median
    rank of the step (the reference a slow rank is measured against) get colours and legend
    entries, eight at most; every other rank is a thin light line."""
    n_ranks = len(totals)
    if n_ranks <= len(RANK_COLORS):
        return [
            {
                "color": RANK_COLORS[r],
                "lw": 1.4,
                "marker": RANK_MARKERS[r],
                "ms": 4,
                "label": f"rank {ranks[r]}",
            }
            for r in range(n_ranks)
        ]
    styles: list[dict[str, Any]] = [{"color": OTHER_RANK, "lw": 0.8} for _ in range(n_ranks)]
    order = np.argsort(-advances, kind="stable")
    leaders = list(dict.fromkeys(int(setters[j]) for j in order if advances[j] > 0))
    reference = int(np.argsort(totals, kind="stable")[n_ranks // 2])
    chosen = leaders[: len(RANK_COLORS) - 1]
    if reference not in chosen:
        chosen.append(reference)
    for k, r in enumerate(chosen):
        role = "median rank" if r == reference and r not in leaders else "sets the frontier"
        styles[r] = {
            "color": RANK_COLORS[k],
            "lw": 1.6,
            "marker": RANK_MARKERS[k],
            "ms": 4,
            "label": f"rank {ranks[r]} ({role})",
        }
    return styles


def _spread(ys: list[float], gap: float) -> list[float]:
    """Label heights in ascending order, pushed apart to at least ``gap``."""
    out: list[float] = []
    for y in ys:
        out.append(max(y, out[-1] + gap) if out else y)
    return out


# ---------------------------------------------------------------------- shares over windows
def plot_shares_over_time(run: RunWindows, path: str | Path) -> Path:
    """Stacked frontier shares per window, the top stage's leading rank written on its band,
    and the exposed step time per window in a panel of its own above; a summarized run's
    buckets of windows instead (``plot_bucket_shares``)."""
    if run.summarized:
        return plot_bucket_shares(run, path)
    reports = [report.to_dict() | {"meta": meta} for report, meta in run.windows]
    stages = list(dict.fromkeys(semantic_stage(s) for s in run.stages))  # microsteps folded
    colors = stage_colors(stages)
    names = []
    for i, r in enumerate(reports):
        meta = r["meta"]
        names.append(f"{meta.get('first_step', i)}-{meta.get('last_step', '')}")
    if any(r.get("role_reports") for r in reports):
        return _plot_role_shares(reports, stages, names, path)
    n = len(reports)
    x = np.arange(n)
    plt = _pyplot()
    fig, (top, ax) = _two_panels(plt)
    ms = np.array([r["exposed_s"] / r["n_steps"] * 1e3 for r in reports])
    top.plot(x, ms, color="black", marker="o", lw=1.5)
    top.set_ylim(0, max(float(ms.max()), 1e-9) * 1.25)
    top.set_ylabel("exposed\nms/step")
    top.grid(alpha=0.3)
    top.set_title("Frontier shares per window, and who leads the top stage")

    tops = _stacked_shares(ax, x, reports, stages, colors)
    for i, r in enumerate(reports):
        _label_leader(ax, i, tops[i], r, vertical=n > 10)
    ax.set_ylim(0, 1)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("share of exposed step time")
    ax.set_xticks(x, names, rotation=45 if n > 8 else 0, fontsize=8)
    ax.set_xlabel("window (steps)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=8)
    return _save(plt, fig, path)


def _two_panels(plt: Any) -> tuple[Any, tuple[Any, Any]]:
    """The shares figures' layout: the exposed ms/step above, the stacked shares below."""
    fig, axes = plt.subplots(
        2,
        1,
        figsize=(10, 6.4),
        dpi=110,
        sharex=True,
        gridspec_kw={"height_ratios": [1, 3]},
        layout="constrained",
    )
    return fig, (axes[0], axes[1])


def plot_bucket_shares(run: RunWindows, path: str | Path) -> Path:
    """A summarized run's buckets of consecutive windows: each bucket's median exposed ms/step
    with its min-max band above, its mean stage shares stacked below (one panel per role, side
    by side, when the ranks play different roles: each role's own mean shares); the title says
    how many windows each bucket holds."""
    stages = list(dict.fromkeys(semantic_stage(s) for s in run.stages))
    colors = stage_colors(stages)
    buckets = run.buckets
    x = np.arange(len(buckets))
    plt = _pyplot()
    roles = sorted({role for b in buckets for role in b.roles})
    if roles:
        fig, top, panels = _role_panels(plt, roles)
    else:
        fig, (top, ax) = _two_panels(plt)
        panels = {"": ax}
    low, median, high = (np.array([b.ms[i] for b in buckets]) for i in range(3))
    top.fill_between(x, low, high, color="0.8", step="mid", label="min-max")
    top.plot(x, median, color="black", lw=1.5, label="median")
    top.set_ylim(0, max(float(high.max()), 1e-9) * 1.15)
    top.set_xlim(-0.6, len(buckets) - 0.4)
    top.set_ylabel("exposed\nms/step")
    top.grid(alpha=0.3)
    top.legend(loc="upper right", fontsize=7)
    per = run.count / len(buckets)
    top.set_title(
        f"{run.count} windows summarized in {len(buckets)} buckets of about {per:.0f}:\n"
        "exposed ms/step (median and min-max band), mean frontier shares"
        + (", each role's own" if roles else "")
    )
    for role, ax in panels.items():
        shares = [b.roles.get(role, {}) if role else b.shares for b in buckets]
        _bucket_bars(ax, shares, stages, colors, buckets)
        if role:
            ax.set_title(f"role {printable(role)}", fontsize=10)
    first = next(iter(panels.values()))
    first.set_ylabel("mean share of " + ("the role's " if roles else "") + "exposed step time")
    first.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=8)
    return _save(plt, fig, path)


def _role_panels(plt: Any, roles: list[str]) -> tuple[Any, Any, dict[str, Any]]:
    """A summarized role run's layout: the exposed ms/step across the top, below it one panel
    of shares per role. The panels are labelled by index: a role's name (``ms``, ``.``) is the
    user's and could name another panel or none."""
    top = len(roles)
    fig, axes = plt.subplot_mosaic(
        [[top] * len(roles), list(range(len(roles)))],
        figsize=(max(10, 5 * len(roles)), 6.4),
        dpi=110,
        height_ratios=[1, 3],
        layout="constrained",
    )
    axes[top].tick_params(labelbottom=False)  # the panels below name the buckets
    return fig, axes[top], {role: axes[i] for i, role in enumerate(roles)}


def _bucket_bars(
    ax: Any,
    shares: list[dict[str, float]],
    stages: list[str],
    colors: list[str],
    buckets: list[Any],
) -> None:
    """The buckets' mean ``shares`` stacked by stage (a bucket with none: no bar)."""
    from .run_summary import bucket_span

    x = np.arange(len(buckets))
    bottom = np.zeros(len(buckets))
    for stage, color in zip(stages, colors, strict=True):
        values = np.array([own.get(stage, 0.0) for own in shares])
        ax.bar(x, values, bottom=bottom, color=color, label=printable(stage), width=0.9)
        bottom += values
    ax.set_ylim(0, 1)
    ax.set_xlim(-0.6, len(buckets) - 0.4)
    every = max(1, len(buckets) // 12)
    ticks = x[::every]
    ax.set_xticks(ticks, [bucket_span(buckets[i]) for i in ticks], rotation=45, fontsize=8)
    ax.set_xlabel("windows")


def _stacked_shares(
    ax: Any, x: Any, reports: Sequence[dict[str, Any]], stages: Sequence[str], colors: list[str]
) -> list[tuple[float, float]]:
    """One bar per report, stacked by stage share (a report left empty: no bar); per report,
    the bottom and height of its top stage's band (where its leader is written)."""
    bottom = np.zeros(len(reports))
    tops: list[tuple[float, float]] = [(0.0, 0.0)] * len(reports)
    for j, stage in enumerate(stages):
        values = np.array([_broad_shares(r).get(stage, 0.0) if r else 0.0 for r in reports])
        ax.bar(x, values, bottom=bottom, color=colors[j], label=printable(stage), width=0.8)
        for i, r in enumerate(reports):
            if r.get("top1") == stage:
                tops[i] = (float(bottom[i]), float(values[i]))
        bottom += values
    return tops


def _label_leader(
    ax: Any, i: int, band: tuple[float, float], report: dict[str, Any], vertical: bool
) -> None:
    """``rank 2`` (or ``no single leader``) on the top stage's band of window ``i``."""
    low, height = band
    if report.get("top1") is None or height <= 0:
        return
    text = leader_text(report)
    if height < 0.12:  # too thin to write in: above the bar instead
        y, color = min(low + height + 0.02, 0.97), "black"
    else:
        y, color = low + height / 2, "white"
    ax.text(
        i,
        y,
        text,
        ha="center",
        va="center",
        rotation=90 if vertical else 0,
        fontsize=7 if vertical else 9,
        color=color,
        fontweight="bold",
    )


def _broad_shares(report: dict[str, Any]) -> dict[str, float]:
    shares: dict[str, float] = report.get("semantic_shares") or report["shares"]
    return shares


def leader_text(report: dict[str, Any]) -> str:
    """``rank 2`` for the (broad) top stage's single leading rank, else ``no single leader``."""
    top = report.get("top1")
    where = report.get("semantic_localization", {}).get(top)
    lead = where["leader_rank"] if where else report.get("leaders", {}).get(top)
    return "no single leader" if lead is None else f"rank {lead}"


def _plot_role_shares(
    reports: list[dict[str, Any]], stages: list[str], names: list[str], path: str | Path
) -> Path:
    """Ranks in different roles: one panel per role, side by side, of that role's own shares
    per window (a global share would mix roles), its top stage's leader written on its band."""
    roles = sorted({role for r in reports for role in r.get("role_reports") or {}})
    colors = stage_colors(stages)
    x = np.arange(len(reports))
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(roles), figsize=(5 * len(roles), 5.2), dpi=110, sharey=True, layout="constrained"
    )
    for ax, role in zip(np.atleast_1d(axes), roles, strict=True):
        own = [(r.get("role_reports") or {}).get(role) or {} for r in reports]
        tops = _stacked_shares(ax, x, own, stages, colors)
        for i, o in enumerate(own):
            if o:
                _label_leader(ax, i, tops[i], o, vertical=len(reports) > 6)
        ax.set_ylim(0, 1)
        ax.set_title(f"role {printable(role)}")
        ax.set_xticks(x, names, rotation=45 if len(x) > 6 else 0, fontsize=8)
        ax.set_xlabel("window (steps)")
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("share of the role's exposed step time")
    first.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, fontsize=8)
    fig.suptitle("Frontier shares per window, each role analyzed on its own")
    return _save(plt, fig, path)
