"""Confirm and op-diff an incident's traces: live on rank 0 when the capture settles, or offline
(``stagefrontier incident``) against the run's packets."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.gates import DEFAULT_GATES, Gates
from ..failures import reason, say_failed
from ..formats.limits import regular_file_inside
from ..formats.names import is_plain_name
from ..window.merged import AnalyzedWindow
from .confirm import Confirmation, LiveWindow, confirm, live_slice
from .decide import MIN_SHARE
from .opdiff import OpTimes, op_diff, stage_op_times
from .own_work import own_work_lead, own_work_shortfall, own_work_text
from .trace_slice import load_for_reduction

logger = logging.getLogger("stagefrontier")


Loaded = dict[Path, tuple[dict[str, Any], list[Any]]]
"""The incident's traces by path, each parsed once (events and their index) for the
confirmation and the op diff."""

MIN_BUDGET_S = 1.0
"""The least CPU the reduction may take before it leaves parts out (a few steps of a fast job
would otherwise leave no room for the op diff at all)."""


def analyze_traces(
    incident: dict[str, Any],
    files: dict[int, str],
    live: list[LiveWindow],
    gates: Any,
    run_dir: str | os.PathLike[str],
    budget_s: float | None = None,
    min_share: float = MIN_SHARE,
) -> float:
    """Confirm and diff an incident's local traces in place (live windows may be empty, as in
    ``stagefrontier incident`` offline: then only the op diff is computed). An earlier trace
    the incident names as its reference is read only when it is a regular file inside
    ``run_dir``, the run's output folder. Returns the CPU seconds it took.

    ``budget_s``: the CPU the reduction may take (live: the captured steps' own wall time, at
    least ``MIN_BUDGET_S``). The confirmation always runs; the suspect's op diff runs while the
    budget is not spent, and the reference's after it; a part left out is said in a reason
    (the op diff then lists the suspect's own times). ``min_share``: the share of the step by
    which the suspect's lead over its reference must hold in the trace (``confirm``)."""
    start = time.thread_time()
    budget = None if budget_s is None else max(budget_s, MIN_BUDGET_S)

    def over(part: str) -> bool:
        spent = time.thread_time() - start
        if budget is None or spent <= budget:
            return False
        incident["reasons"].append(
            f"{part} left out: the reduction had taken {spent:.2f} s of CPU, over its budget of "
            f"{budget:.2f} s (the captured steps' wall time)"
        )
        return True

    loaded, result = _confirm(incident, files, live, gates, min_share)
    sides = _op_diff(incident, files, loaded, run_dir, over)
    if result is not None and result.weak_lead:
        _judge_own_work(incident, result, gates, min_share, sides)
    return time.thread_time() - start


def _judge_own_work(
    incident: dict[str, Any],
    result: Confirmation,
    gates: Any,
    min_share: float,
    sides: tuple[OpTimes, OpTimes | None] | None,
) -> None:
    """The stage's time gave the suspect no material lead (``result.weak_lead``): where all
    else agreed, the suspect's own work in the stage (the op diff against the reference rank,
    ``sides``: its two op times) may still confirm it, when it holds over the captured steps
    (``own_work``); otherwise the weak lead is the reason it is not, and the own work's
    shortfall with it."""
    tie = (gates or DEFAULT_GATES).share_tie
    on_top = not incident.get("routed_below_top")
    rest_agrees = not_confirmed_text(result, incident["stage"], tie, on_top) == ""
    row = own_work_lead(incident.get("op_diff") or [], result.step_s, min_share, result.lead_s)
    step_s = result.step_s
    if not (rest_agrees and row and step_s and sides) or incident.get("reference_capture"):
        incident["reasons"].append(result.weak_lead)
        return
    burst = incident.get("lead_block_steps") or 1
    short = own_work_shortfall(row["name"], sides, min_share * step_s, result.lead_s, burst)
    if short:
        incident["reasons"].append(f"{result.weak_lead}; {short}")
        return
    incident["confirmed"] = True
    incident["reasons"].append(own_work_text(row, incident, step_s, min_share))


def leave_for_after_run(incident: dict[str, Any]) -> None:
    """The run ends as the incident's capture settles: mark its reduction pending, for the
    process rank 0 starts as it closes (``html.draw_later``, which runs ``stagefrontier
    incident`` on the folder) to confirm and diff it, so that no rank's exit waits for it."""
    incident["reduced"] = "pending"
    incident["reasons"].append(
        "the run ended as the capture settled: its confirmation and op diff are left to a "
        "process of its own started after the run (`stagefrontier incident` on this folder), "
        "so that no rank's exit waits for them"
    )


def _confirm(
    incident: dict[str, Any],
    files: dict[int, str],
    live: list[LiveWindow],
    gates: Any,
    min_share: float,
) -> tuple[Loaded, Confirmation | None]:
    """Confirm the incident against the live windows; returns the traces, each parsed once for
    the confirmation and the op diff, and the confirmation (None when it failed). A weak lead
    (``Confirmation.weak_lead``) is left for ``_judge_own_work`` to say or overturn."""
    first, last = incident["steps"]
    steps = list(range(first, last + 1))
    ranks = sorted(files)
    loaded: Loaded = {}
    result: Confirmation | None = None
    for path in files.values():
        try:
            loaded[Path(path)] = load_for_reduction(Path(path), incident["stage"], steps)
        except Exception:  # the reducer below says what is wrong with it
            logger.debug("stagefrontier: loading %s failed", path, exc_info=True)
    try:
        window = live_slice(live, ranks, steps)
        lead = (incident["leader_rank"], incident["reference_rank"])
        burst = incident.get("lead_block_steps") or 1
        on_top = not incident.get("routed_below_top")
        result = confirm(
            files, window, incident["stage"], gates, loaded, lead, min_share, burst, on_top
        )
        incident.update(
            confirmed=result.confirmed,
            max_share_diff=result.max_share_diff,
            trace_shares=result.trace_shares,
            live_shares=result.live_shares,
        )
        incident["reasons"].extend(result.notes)
        if result.confirmed is False:
            tie = (gates or DEFAULT_GATES).share_tie
            text = not_confirmed_text(result, incident["stage"], tie, on_top)
            if text:  # empty when the lead's own note (in ``notes``) is the only reason
                incident["reasons"].append(text)
    except Exception as exc:
        say_failed(logger, f"confirming incident {incident['id']}", exc, "it stays unconfirmed")
        incident["reasons"].append(f"confirmation failed: {reason(exc)}")
        result = None
    return loaded, result


def not_confirmed_text(
    result: Confirmation, stage: str | None, tie: float = Gates.share_tie, on_top: bool = True
) -> str:
    """Why a capture did not confirm its incident, in words that match what was compared: the
    trace and the live steps name different top stages; or they agree on the top stage, but it
    is not the routed one (asked only ``on_top``: not of a stage routed below the top), or a
    share differs by more than ``tie`` (``Gates.share_tie``). Empty when they agree within
    ``tie``: the suspect's lead in the trace was too small, which ``confirm`` says in its own
    note."""
    diff = result.max_share_diff
    if result.trace_top != result.live_top:
        return (
            f"disagrees: trace top {result.trace_top}, live top {result.live_top}, largest "
            f"share difference {diff}"
        )
    agree = f"the trace agrees with the live steps (top {result.trace_top} in both"
    if stage is not None and result.trace_top != stage and on_top:
        return (
            f"{agree}, largest share difference {diff}), but the routed stage {stage} is not on "
            "top in the captured steps: not confirmed"
        )
    if diff is not None and diff < tie:
        return ""
    return f"{agree}), but a share differs by {diff}, more than the tie tolerance: not confirmed"


def _op_diff(
    incident: dict[str, Any],
    files: dict[int, str],
    loaded: Loaded,
    run_dir: str | os.PathLike[str],
    over: Callable[[str], bool],
) -> tuple[OpTimes, OpTimes | None] | None:
    """The op diff of the incident's stage: the suspect's trace against the reference's (an
    earlier capture's, or the reference rank's), each side run while ``over`` allows. Returns
    the two sides' op times (None when the suspect's was not read)."""
    first, last = incident["steps"]
    steps = list(range(first, last + 1))
    suspect, reference = incident["leader_rank"], incident["reference_rank"]
    if incident["stage"] and suspect in files and not over("the op diff"):
        try:
            mine = stage_op_times(
                files[suspect], incident["stage"], steps, _events(loaded, files[suspect])
            )
            earlier = incident.get("reference_capture")
            has_reference = bool(earlier) or (reference in files and reference != suspect)
            earlier_file = None
            if has_reference and over("the reference's side of the op diff"):
                theirs = None
            elif earlier and (
                earlier_file := reference_file(earlier, run_dir, incident["reasons"])
            ):
                first_ref, last_ref = earlier["steps"]
                theirs = stage_op_times(
                    earlier_file, incident["stage"], range(first_ref, last_ref + 1)
                )
            elif reference in files and reference != suspect:
                theirs = stage_op_times(
                    files[reference], incident["stage"], steps, _events(loaded, files[reference])
                )
            else:
                theirs = None
            incident["op_diff"] = op_diff(mine, theirs)
            return mine, theirs
        except Exception as exc:
            say_failed(logger, f"the op diff of incident {incident['id']}", exc, "it has none")
            incident["reasons"].append(f"op diff failed: {reason(exc)}")
    return None


def _events(loaded: Loaded, path: str) -> list[Any] | None:
    item = loaded.get(Path(path))
    return None if item is None else item[1]


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


def live_windows(window: AnalyzedWindow) -> list[LiveWindow]:
    """The rank columns an analyzed window holds: all of them, or under hierarchical collection
    the rows its node parts carried for a capture request (one block per span of steps)."""
    stages = tuple(window.report.stages)
    if window.summary is None:
        ranks = tuple(w.rank for w in window.merged.ranks)
        return [LiveWindow(window.merged.reference.first_step, ranks, window.d, stages)]
    spans: dict[tuple[int, int], list[int]] = {}
    rows = window.named_rows or {}
    for rank, (first, block) in sorted(rows.items()):
        spans.setdefault((first, block.shape[0]), []).append(rank)
    return [
        LiveWindow(first, tuple(ranks), np.stack([rows[r][1] for r in ranks], axis=1), stages)
        for (first, _), ranks in spans.items()
    ]
