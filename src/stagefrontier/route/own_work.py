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
spread over functions)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
