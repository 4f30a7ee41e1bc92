"""Confirm and op-diff an incident's traces: live on rank 0 when the capture settles, or offline
(``stagefrontier incident``) against the run's packets."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..record.window import AnalyzedWindow
from .confirm import LiveWindow, confirm, live_slice
from .opdiff import op_diff, stage_op_times

logger = logging.getLogger("stagefrontier")


def analyze_traces(
    incident: dict[str, Any],
    files: dict[int, str],
    live: list[LiveWindow],
    gates: Any,
) -> None:
    """Confirm and diff an incident's local traces in place (live windows may be empty, as in
    ``stagefrontier incident`` offline: then only the op diff is computed)."""
    first, last = incident["steps"]
    steps = list(range(first, last + 1))
    ranks = sorted(files)
    try:
        result = confirm(files, live_slice(live, ranks, steps), incident["stage"], gates)
        incident.update(
            confirmed=result.confirmed,
            max_share_diff=result.max_share_diff,
            trace_shares=result.trace_shares,
            live_shares=result.live_shares,
        )
        incident["reasons"].extend(result.notes)
        if result.confirmed is False:
            incident["reasons"].append(
                f"disagrees: trace top {result.trace_top}, live top {result.live_top}, "
                f"largest share difference {result.max_share_diff}"
            )
    except Exception as exc:
        logger.exception("stagefrontier: confirming incident %s failed", incident["id"])
        incident["reasons"].append(f"confirmation failed: {exc}")
    suspect, reference = incident["leader_rank"], incident["reference_rank"]
    if incident["stage"] and suspect in files:
        try:
            mine = stage_op_times(files[suspect], incident["stage"], steps)
            earlier = incident.get("reference_capture")
            if earlier and Path(earlier["path"]).exists():
                first_ref, last_ref = earlier["steps"]
                theirs = stage_op_times(
                    earlier["path"], incident["stage"], range(first_ref, last_ref + 1)
                )
            elif reference in files and reference != suspect:
                theirs = stage_op_times(files[reference], incident["stage"], steps)
            else:
                theirs = None
                if earlier:
                    incident["reasons"].append(
                        f"the reference trace {earlier['path']} is not on this host"
                    )
            incident["op_diff"] = op_diff(mine, theirs)
        except Exception as exc:
            logger.exception("stagefrontier: the op diff of incident %s failed", incident["id"])
            incident["reasons"].append(f"op diff failed: {exc}")


def live_window(window: AnalyzedWindow) -> LiveWindow:
    return LiveWindow(
        window.merged.reference.first_step,
        tuple(w.rank for w in window.merged.ranks),
        window.d,
        tuple(window.report.stages),
    )
