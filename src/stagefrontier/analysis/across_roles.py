"""Which role bounds the step, as far as the per-role reports can say.

Roles do not share stage boundaries, so no frontier runs across them, and every role of a
synchronous pipeline spends the same wall time per step: its exposed time cannot rank roles.
What separates the role the others wait for is *where* each role's time goes. A role whose
leading stage is its own work (data, optimizer, any stage outside the pipeline's ``pp.*``
communication) holds the step; a role whose leading stage is pipeline communication may be
waiting for another role there. So:

- exactly one role leads with a stage outside ``pp.*``: that role bounds the step;
- every role leads with a ``pp.*`` stage: open, because such a stage times a role's own compute
  and its wait for the other roles together, and the CPU-wall matrix cannot split them;
- several roles lead outside ``pp.*``: open, each holds its own share.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import PIPELINE_PREFIX
from .window_report import WindowReport


@dataclass(frozen=True)
class RoleBound:
    """The role that bounds the step (None when the window cannot say) and why."""

    role: str | None
    reason: str


def is_pipeline_stage(stage: str) -> bool:
    return stage.startswith(PIPELINE_PREFIX)


def bounding_role(report: WindowReport) -> RoleBound | None:
    """The across-roles reading of a mixed window; None when it has no role reports."""
    if not report.role_reports:
        return None
    tops = {
        role: rep.top1
        for role, rep in report.role_reports.items()
        if rep.top1 is not None and rep.shares_defined
    }
    if len(tops) < len(report.role_reports):
        return RoleBound(None, "a role has no exposed time to rank its stages")
    own = {role: top for role, top in tops.items() if not is_pipeline_stage(top)}
    if len(own) == 1:
        role, top = next(iter(own.items()))
        others = ", ".join(r for r in tops if r != role)
        return RoleBound(
            role,
            f"{role} leads with its own stage {top}, while {others} lead(s) with pipeline "
            "communication, where a role waits for the others",
        )
    if not own:
        return RoleBound(
            None,
            f"every role leads with pipeline communication ({PIPELINE_PREFIX}*), which times a "
            "role's own compute and its wait for the other roles together: the stage times "
            "cannot tell which role the others wait for",
        )
    return RoleBound(
        None,
        f"roles {', '.join(own)} each lead with their own stage ({', '.join(own.values())}): "
        "no single role holds the others",
    )
