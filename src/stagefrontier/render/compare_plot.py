"""The bar figure of ``stagefrontier compare --plot``: each stage's change in ms per step."""

from __future__ import annotations

from pathlib import Path

from ..analysis.compare import Comparison
from .escape import printable
from .plots import _pyplot

GREW = "#D55E00"
SHRANK = "#0072B2"


def plot_comparison(c: Comparison, path: str | Path) -> Path:
    plt = _pyplot()
    deltas = c.delta_advance_ms
    names = list(deltas)
    values = [deltas[s] for s in names]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(names) + 1.8))
    y = range(len(names))
    ax.barh(y, values, color=[GREW if v > 0 else SHRANK for v in values])
    ax.set_yticks(list(y), [printable(name) for name in names])
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    for i, v in enumerate(values):
        ax.annotate(
            f"{v:+.1f} ms",
            (v, i),
            xytext=(4 if v >= 0 else -4, 0),
            textcoords="offset points",
            ha="left" if v >= 0 else "right",
            va="center",
            fontsize=9,
        )
    span = max(abs(v) for v in values) or 1.0
    ax.set_xlim(-1.3 * span if min(values) < 0 else -0.05 * span, 1.3 * span)
    ax.set_xlabel("change of the stage's exposed time, ms per step (new - base)")
    ax.set_title(
        f"Exposed time per step {c.base_means.exposed_ms:.1f} -> {c.new_means.exposed_ms:.1f} ms "
        f"({c.delta_exposed_ms:+.1f} ms)",
        fontsize=11,
    )
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
