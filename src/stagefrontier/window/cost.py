"""Rank 0's summary of what StageFrontier cost the ranks in a window (the ``self_cost`` object
of a window record), from the cost fields each RankWindow carries (measured by
``record.self_cost``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from .rank import RankWindow

COMPONENTS = ("hot_path_s", "handoff_s", "threads_cpu_s", "router_cpu_s", "capture_s", "total_s")


def rank_cost_s(w: RankWindow) -> dict[str, float]:
    """One rank's parts and their total, in seconds."""
    hot = w.contexts_entered * w.context_cost_ns * 1e-9
    handoff = w.handoff_ns * 1e-9
    threads = w.thread_cpu_ns * 1e-9
    router = w.router_cpu_ns * 1e-9
    capture = w.capture_ns * 1e-9
    return {
        "hot_path_s": hot,
        "handoff_s": handoff,
        "threads_cpu_s": threads,
        "router_cpu_s": router,
        "capture_s": capture,
        "total_s": hot + handoff + threads + router + capture,
    }


def self_cost_summary(ranks: Sequence[RankWindow]) -> dict[str, Any]:
    """The ``self_cost`` object of a window record: per component the max and median over
    ``ranks`` (seconds), the calibrated context cost, and the fraction of step time (each rank's
    total over its own summed step wall time)."""
    costs = [rank_cost_s(w) for w in ranks]
    walls = [float(w.wall_ns.sum()) * 1e-9 for w in ranks]
    fractions = [
        c["total_s"] / wall if wall > 0 else 0.0 for c, wall in zip(costs, walls, strict=True)
    ]
    out: dict[str, Any] = {name: _spread([c[name] for c in costs]) for name in COMPONENTS}
    out["context_cost_ns"] = _spread([float(w.context_cost_ns) for w in ranks])
    out["fraction"] = _spread(fractions)
    return out


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"max": 0.0, "median": 0.0}
    return {"max": float(max(values)), "median": float(statistics.median(values))}
