"""PNG figures for an output folder: the frontier of the worst step, and shares over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StageFrontierError
from .run_folder import RunWindows

STAGE_COLORS = ["#0072B2", "#009E73", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9"]


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


def _color(j: int) -> str:
    return STAGE_COLORS[j % len(STAGE_COLORS)]


def plot_worst_step(run: RunWindows, path: str | Path) -> Path:
    """Each rank's prefix curve and the frontier for the step with the largest exposed time."""
    if not run.packets:
        raise StageFrontierError("the frontier figure needs packets/ (the per-rank matrix)")
    best = max(
        ((p, t) for p in run.packets for t in range(p.d.shape[0])),
        key=lambda pt: float(pt[0].d[pt[1]].sum(axis=1).max()),
    )
    packet, t = best
    d = packet.d[t] * 1e3  # [R, S] milliseconds
    stages = list(packet.stages)
    n_ranks, n_stages = d.shape
    prefix = np.concatenate([np.zeros((n_ranks, 1)), np.cumsum(d, axis=1)], axis=1)
    front = prefix.max(axis=0)
    leaders = prefix[:, 1:].argmax(axis=0)
    x = np.arange(n_stages + 1)

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    many = n_ranks > 12
    for r in range(n_ranks):
        ax.plot(
            x,
            prefix[r],
            color="0.7" if many else None,
            lw=0.8 if many else 1.2,
            marker=None if many else "o",
            ms=3,
            label=None if many else f"rank {r}",
        )
    ax.plot(x, front, color="#7A1F5C", lw=3, alpha=0.75, label="frontier $F_{t,s}$")
    right = n_stages + 0.15
    for j in range(n_stages):
        advance = front[j + 1] - front[j]
        if advance <= 0.02 * front[-1]:
            continue
        ax.annotate(
            "",
            xy=(right, front[j + 1]),
            xytext=(right, front[j]),
            arrowprops={"arrowstyle": "<->", "color": _color(j), "lw": 1.5},
        )
        ax.text(
            right + 0.08,
            (front[j] + front[j + 1]) / 2,
            f"{stages[j]}: {advance:.1f} ms (rank {leaders[j]})",
            va="center",
            fontsize=8,
            color=_color(j),
        )
    meta = packet.meta
    step = meta.get("first_step", 0) + t if isinstance(meta.get("first_step"), int) else t
    ax.set_title(
        f"Max-prefix frontier of the worst step (step {step}, window "
        f"{meta.get('window', '?')}): exposed {front[-1]:.1f} ms"
    )
    ax.set_xticks(
        x, ["start", *[s.split(".")[0] + "\n" + s.split(".", 1)[-1] for s in stages]], fontsize=7
    )
    ax.set_xlim(-0.2, n_stages + 2.6)
    ax.set_ylabel("rank-local prefix time (ms)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_shares_over_time(run: RunWindows, path: str | Path) -> Path:
    """Stacked frontier shares per window, with the exposed step time on a second axis."""
    reports = [p.report.to_dict() | {"meta": p.meta} for p in run.packets] or run.records
    stages = run.stages
    labels = []
    for i, r in enumerate(reports):
        meta = r.get("meta", r)
        labels.append(f"{meta.get('first_step', i)}-{meta.get('last_step', '')}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
    bottom = np.zeros(len(reports))
    x = np.arange(len(reports))
    for j, stage in enumerate(stages):
        values = np.array([r["shares"].get(stage, 0.0) for r in reports])
        ax.bar(x, values, bottom=bottom, color=_color(j), label=stage, width=0.8)
        bottom += values
    ax.set_ylim(0, 1)
    ax.set_ylabel("frontier share of exposed step time")
    ax.set_xticks(x, labels, rotation=45 if len(x) > 8 else 0, fontsize=8)
    ax.set_xlabel("window (steps)")
    twin = ax.twinx()
    twin.plot(
        x,
        [r["exposed_s"] / r["n_steps"] * 1e3 for r in reports],
        color="black",
        marker="o",
        lw=1.5,
        label="exposed ms/step",
    )
    twin.set_ylabel("exposed step time (ms)")
    twin.set_ylim(bottom=0)
    handles, names = ax.get_legend_handles_labels()
    h2, n2 = twin.get_legend_handles_labels()
    ax.legend(
        handles + h2,
        names + n2,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=4,
        fontsize=8,
    )
    ax.set_title("Frontier shares per window")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out
