"""The forward-event labels: the device-evidence axis of the labeler (``analysis.labels``).

Where the timer sampled the forward region with CUDA-event pairs (``SamplingConfig``), the
sampled device time is set against the forward stage's CPU wall: a forward whose device time
matches or exceeds its wall is device-bound (``forward_device_supported``), one whose device time
runs past its wall while the exposed cost peaks in a later stage spills over
(``forward_spillover_suspected``), one with little device time under its wall is host overhead
(``forward_host_overhead_suspected``). Too few completed pairs, or events that do not cover the
stage, say so instead (``forward_event_scope_limited``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .accounting import FloatArray
from .gates import Gates
from .side import EVENT_NOT_SAMPLED, EVENT_READY, SideEvidence

FORWARD_DEVICE_SUPPORTED = "forward_device_supported"
FORWARD_SPILLOVER_SUSPECTED = "forward_spillover_suspected"
FORWARD_HOST_OVERHEAD_SUSPECTED = "forward_host_overhead_suspected"
FORWARD_EVENT_SCOPE_LIMITED = "forward_event_scope_limited"

Emit = Callable[[str, str], None]
"""``Labeling.emit``: a label and its reason."""


def forward_event_labels(
    side: SideEvidence,
    g: Gates,
    stages: Sequence[str],
    d: FloatArray | None,
    shares: FloatArray,
    order: list[int],
    emit: Emit,
) -> dict[str, float] | None:
    """Emit the forward-event labels of a window and return the window's ``forward_event``
    summary (pairs sampled and completed, the means and their ratio); None when no pair was
    sampled. ``d``: the broad stages' durations ``[N, R, G]`` (None for a summary, which
    carries the samples as totals); ``order``: the stages by share, largest first."""
    counts = _event_counts(side, d)
    if counts is None:
        return None
    sampled, ready = counts
    ratio_ready = ready / sampled
    summary: dict[str, float] = {
        "sampled": float(sampled),
        "ready": float(ready),
        "ready_ratio": ratio_ready,
    }
    if side.forward_stage not in stages:
        emit(
            FORWARD_EVENT_SCOPE_LIMITED,
            f"event samples bracket {side.forward_stage!r}, which is not an ordered stage here",
        )
        return summary
    problems = []
    if side.event_scope_limited:
        problems.append("the trainer uses streams the event markers do not cover")
    if ratio_ready < g.min_event_ready_ratio:
        problems.append(
            f"only {ready}/{sampled} sampled event pairs completed "
            f"(ratio {ratio_ready:.2f} < {g.min_event_ready_ratio})"
        )
    if ready < g.min_event_samples:
        problems.append(f"{ready} ready event pair(s) < {g.min_event_samples} needed")
    if problems:
        for p in problems:
            emit(FORWARD_EVENT_SCOPE_LIMITED, p)
        return summary
    fwd = list(stages).index(side.forward_stage)
    event_s, cpu_s = _event_means(side, d, fwd)
    summary.update({"event_mean_ms": event_s * 1e3, "cpu_mean_ms": cpu_s * 1e3})
    if cpu_s <= 0.0:
        emit(FORWARD_EVENT_SCOPE_LIMITED, "forward CPU wall is zero where events completed")
        return summary
    ratio = event_s / cpu_s
    summary["ratio"] = ratio
    in_top2 = fwd in order[:2] and shares[fwd] > 0
    if ratio >= g.event_high_ratio:
        if in_top2:
            emit(
                FORWARD_DEVICE_SUPPORTED,
                f"forward is a top-2 stage and sampled device time is {ratio:.2f}x its CPU wall",
            )
        if order[0] > fwd and event_s > cpu_s:
            emit(
                FORWARD_SPILLOVER_SUSPECTED,
                f"forward device time ({event_s * 1e3:.3g} ms) exceeds its CPU wall "
                f"({cpu_s * 1e3:.3g} ms) while the exposed cost peaks later, in "
                f"{stages[order[0]]}",
            )
    elif ratio < g.event_low_ratio and in_top2:
        emit(
            FORWARD_HOST_OVERHEAD_SUSPECTED,
            f"forward is a top-2 stage but sampled device time is only {ratio:.2f}x its CPU wall",
        )
    return summary


def _event_counts(side: SideEvidence, d: FloatArray | None) -> tuple[int, int] | None:
    """(pairs sampled, pairs completed), from the ranks' arrays or from a summary's totals;
    None when nothing was sampled."""
    if side.event_state is not None and side.event_ms is not None and d is not None:
        state = np.asarray(side.event_state)
        sampled, ready = int((state != EVENT_NOT_SAMPLED).sum()), int((state == EVENT_READY).sum())
    elif side.event_totals is not None:
        sampled, ready = int(side.event_totals[0]), int(side.event_totals[1])
    else:
        return None
    return (sampled, ready) if sampled else None


def _event_means(side: SideEvidence, d: FloatArray | None, fwd: int) -> tuple[float, float]:
    """Mean event seconds and mean forward CPU wall over the completed pairs."""
    if side.event_ms is not None and side.event_state is not None and d is not None:
        ready = np.asarray(side.event_state) == EVENT_READY
        event_s = float(np.asarray(side.event_ms)[ready].mean()) / 1000.0
        return event_s, float(d[:, :, fwd][ready].mean())
    assert side.event_totals is not None
    _, ready_count, event_ms, cpu_s = side.event_totals
    return event_ms / ready_count / 1000.0, cpu_s / ready_count
