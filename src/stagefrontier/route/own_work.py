"""The suspect's own work in its stage: where the stage's time cannot confirm a lead.

In a stage that a collective synchronizes (backward, with DDP's gradient all-reduce), every
rank leaves the stage together: the ranks that arrived early wait inside it for the late one, so
the stage's time, and every share, is the same on every rank and no comparison of them can name
the late rank. What the late rank did that the others did not is in its own work: the op diff's
self time per step inside the stage, where waits on the collective count on the waiting ranks,
not on the late one. A lead there by the same material share of the step the router asks of any
lead (``decide.MIN_SHARE``) confirms the incident, when the stage's time does not already hold
it: the lead in own work must exceed the lead in the stage's time by that share too (where a
collective synchronizes the stage, the reference waited about as long as the suspect worked
more, and the stage's times are alike; where none does, a difference in own work is a
difference in the stage's time, and a larger one in a single function is the steps' noise
spread over functions). And as a lead in the stage's time must, it holds over the captured
steps (``own_work_shortfall``): above their noise and in every block of a few steps, so that
one step the suspect's process lost to the machine (an operator's self time is wall time)
confirms nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .confirm import lead_shortfall
from .opdiff import OpTimes


def own_work_lead(
    op_rows: Sequence[dict[str, Any]],
    step_s: float | None,
    min_share: float,
    stage_lead_s: float | None = None,
) -> dict[str, Any] | None:
    """The op diff's entry by which the suspect's own work exceeds the reference's by at least
    ``min_share`` of the step (its largest difference), and by that much more than the
    suspect's lead in the stage's own time (``stage_lead_s``, when it leads there); None when
    none does, or without a step or a reference to measure it by."""
    if not op_rows or not step_s or step_s <= 0:
        return None
    top = max(op_rows, key=lambda row: float(row["diff_ms_per_step"]))
    waited_ms = float(top["diff_ms_per_step"]) - max(stage_lead_s or 0.0, 0.0) * 1e3
    if waited_ms < min_share * step_s * 1e3:
        return None
    return top


def own_work_text(
    row: dict[str, Any], incident: dict[str, Any], step_s: float, min_share: float
) -> str:
    """``confirmed by rank 1's own work in model.backward_cpu_wall: `f` takes 99.7 ms/step
    there against 0.0 ms on rank 0, 31% of the 322 ms step (at least 10%); the stage's own time
    is alike on both, as where a collective makes the ranks that arrived early wait for it``."""
    return (
        f"confirmed by rank {incident['leader_rank']}'s own work in {incident['stage']}: "
        f"`{row['name']}` takes {float(row['suspect_ms_per_step']):.1f} ms/step there against "
        f"{float(row['reference_ms_per_step']):.1f} ms on rank {incident['reference_rank']}, "
        f"{float(row['diff_ms_per_step']) / (step_s * 1e3):.0%} of the {step_s * 1e3:.0f} ms "
        f"step (at least {min_share:.0%}); the stage's own time is alike on both, as where a "
        "collective makes the ranks that arrived early wait for the late one"
    )


def own_work_shortfall(
    key: str,
    sides: tuple[OpTimes, OpTimes | None],
    floor_s: float,
    stage_lead_s: float | None = None,
    burst: int = 1,
) -> str:
    """Why the suspect's lead in its own work in ``key`` (the op diff's entry) is no
    confirmation over the captured steps (empty when it is one): each step's own-work lead,
    less the suspect's mean lead in the stage's time, must clear ``floor_s`` on average, above
    the steps' noise and in every block of about four steps (``confirm.lead_shortfall``; whole
    multiples of ``burst``). ``sides``: the suspect's and the reference's op times (the
    reference's None when its side was not read: nothing then confirms)."""
    mine, theirs = sides
    if theirs is None:
        return "the reference's own work was not read"
    common = set(theirs.step_ids)
    steps = [step for step in mine.step_ids if step in common]
    if not steps:
        return "the two traces share no captured step"
    own, other = mine.by_step.get(key, {}), theirs.by_step.get(key, {})
    diffs = np.array([own.get(s, 0.0) - other.get(s, 0.0) for s in steps], dtype=np.float64)
    excess, why = lead_shortfall(diffs - max(stage_lead_s or 0.0, 0.0), steps, floor_s, burst)
    if not why:
        return ""
    return (
        f"its own work in `{key}` leads by {excess.shift_s * 1e3:.1f} ms/step over "
        f"{len(steps)} steps, {why}"
    )
