"""The text of ``stagefrontier compare``: where the per-step exposed time went between two sides."""

from __future__ import annotations

from ..analysis.compare import Comparison, label_counts
from .escape import printable_lines

RANKS_SHOWN = 4
MAX_LEADERS = 3


def render_comparison(c: Comparison) -> str:
    base_n, new_n = c.base.d.shape[0], c.new.d.shape[0]
    base, new = c.base_means, c.new_means
    lines = [
        f"base: {c.base.name} ({base_n} steps, {c.base.d.shape[1]} ranks)",
        f"new:  {c.new.name} ({new_n} steps)",
        f"exposed time per step: {base.exposed_ms:.1f} ms -> {new.exposed_ms:.1f} ms "
        f"({c.delta_exposed_ms:+.1f} ms{percent_change(c.delta_exposed_ms, base.exposed_ms)})",
        "",
    ]
    width = max(len(s) for s in c.delta_advance_ms) + 2
    lines.append(
        f"{'stage':<{width}}{'base ms':>9}{'new ms':>9}{'delta ms':>10}   leading ranks base -> new"
    )
    base_leads, new_leads = c.leaders(base.report), c.leaders(new.report)
    for stage, delta in c.delta_advance_ms.items():
        leads = f"{_ranks(base_leads.get(stage))} -> {_ranks(new_leads.get(stage))}"
        lines.append(
            f"{stage:<{width}}{base.advance_ms[stage]:>9.1f}{new.advance_ms[stage]:>9.1f}"
            f"{delta:>+10.1f}   {leads if stage in c.stages else ''}"
        )
    lines.append(
        f"{'exposed':<{width}}{base.exposed_ms:>9.1f}{new.exposed_ms:>9.1f}"
        f"{c.delta_exposed_ms:>+10.1f}   (the stage deltas add up to this exactly)"
    )
    top = c.top_stage
    lines += ["", f"grew most: {top} ({c.delta_advance_ms[top]:+.1f} ms/step)"]
    by_stage = c.stage_rank_deltas(top)[:RANKS_SHOWN]
    if by_stage:
        shown = ", ".join(f"rank {row['rank']} {row['delta_ms']:+.1f} ms" for row in by_stage)
        lines.append(f"own time in {top}, by rank: {shown}")
    slower = [row for row in c.rank_deltas if row["total_ms"] > 0][:RANKS_SHOWN]
    if slower:
        lines.append(
            "ranks whose own step time grew most: "
            + ", ".join(f"rank {row['rank']} {row['total_ms']:+.1f} ms" for row in slower)
        )
    lines.append(f"labels: base {_labels(c, 'base')}; new {_labels(c, 'new')}")
    lines += [f"note: {note}" for note in c.notes]
    return printable_lines(lines)


def percent_change(delta: float, base: float) -> str:
    """``", +12%"``: the change as a share of ``base`` (empty when ``base`` is not positive)."""
    return f", {delta / base:+.0%}" if base > 0 else ""


def _ranks(ranks: list[int] | None) -> str:
    if not ranks:
        return "-"
    return ",".join(str(r) for r in ranks) if len(ranks) <= MAX_LEADERS else "no single leader"


def _labels(c: Comparison, which: str) -> str:
    side = c.base if which == "base" else c.new
    counts = label_counts(side)
    total = len(side.window_labels)
    if not counts:
        return "none recorded"
    return ", ".join(f"{label} {n}/{total}" for label, n in sorted(counts.items()))
