"""Confirm and op-diff an incident's traces: live on rank 0 when the capture settles, or offline
(``stagefrontier incident``) against the run's packets."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from ..formats.limits import regular_file_inside
from ..formats.names import is_plain_name
from ..record.window import AnalyzedWindow
from .confirm import LiveWindow, confirm, live_slice
from .opdiff import op_diff, stage_op_times

logger = logging.getLogger("stagefrontier")


def analyze_traces(
    incident: dict[str, Any],
    files: dict[int, str],
    live: list[LiveWindow],
    gates: Any,
    run_dir: str | os.PathLike[str],
) -> None:
    """Confirm and diff an incident's local traces in place (live windows may be empty, as in
    ``stagefrontier incident`` offline: then only the op diff is computed). An earlier trace
    the incident names as its reference is read only when it is a regular file inside
    ``run_dir``, the run's output folder."""
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
            earlier_file = earlier and reference_file(earlier, run_dir, incident["reasons"])
            if earlier and earlier_file:
                first_ref, last_ref = earlier["steps"]
                theirs = stage_op_times(
                    earlier_file, incident["stage"], range(first_ref, last_ref + 1)
                )
            elif reference in files and reference != suspect:
                theirs = stage_op_times(files[reference], incident["stage"], steps)
            else:
                theirs = None
            incident["op_diff"] = op_diff(mine, theirs)
        except Exception as exc:
            logger.exception("stagefrontier: the op diff of incident %s failed", incident["id"])
            incident["reasons"].append(f"op diff failed: {exc}")


def reference_file(
    earlier: dict[str, Any], run_dir: str | os.PathLike[str], reasons: list[str]
) -> Path | None:
    """The earlier trace a regression's incident is diffed against: its path when that is a
    regular file inside the run folder, else the same file name in its incident's folder there
    (a run folder copied from its host); None, with a reason, when neither is."""
    path = Path(earlier["path"])
    found = regular_file_inside(path, run_dir)
    incident = earlier.get("incident")
    if found is None and is_plain_name(incident):
        found = regular_file_inside(Path(run_dir, "incidents", str(incident), path.name), run_dir)
    if found is None:
        reasons.append(
            f"the reference trace {earlier['path']} is not a regular file inside the run "
            "folder on this host: diffed against nothing"
        )
    return found


def live_window(window: AnalyzedWindow) -> LiveWindow:
    return LiveWindow(
        window.merged.reference.first_step,
        tuple(w.rank for w in window.merged.ranks),
        window.d,
        tuple(window.report.stages),
    )
