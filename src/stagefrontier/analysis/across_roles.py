"""Which role bounds the step, as far as the per-role reports can say.

Roles do not share stage boundaries, so no frontier runs across them, and every role of a
synchronous pipeline spends the same wall time per step: exposed time cannot rank roles (on the
pipeline runs of ``benchmarks/pipeline.py`` the roles' exposed times differ by a few percent at
most, fault or not, and not in the slowed role's favour). What separates the role the others
wait for is *where* its time goes. A role whose top stage is its own work (data, optimizer: any
stage not named after a parallelism dimension, see ``COMMUNICATION_PREFIXES``) holds the step;
a role whose top stage is communication may be waiting there for another role. So:

- exactly one role's top stage is its own work: that role bounds the step;
- every role's top stage is communication: open. A ``pp.*`` stage times a role's own compute
  inside the schedule together with its wait for the other roles, so a slower stage and the
  stages waiting for it look the same;
- several roles' top stages are their own work: open, each holds its own share.

What separates a compute stall is each rank's own compute inside the schedule compared with a
healthy run: ``benchmarks/pipeline.py`` measures it with a probe around the stage module's
forward. Probes stay outside the analyzer's input, so that reading is not made here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import COMMUNICATION_PREFIXES
from .window_report import WindowReport


@dataclass(frozen=True)
class RoleBound:
    """The role that bounds the step (None when the window cannot say) and why."""

    role: str | None
    reason: str


def is_communication(stage: str) -> bool:
    return stage.startswith(COMMUNICATION_PREFIXES)


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
    own = {role: top for role, top in tops.items() if not is_communication(top)}
    if len(own) == 1:
        role, top = next(iter(own.items()))
        return RoleBound(
            role,
            f"its top stage {top} is its own work, while the other roles' top stages are "
            "communication, where they wait",
        )
    if not own:
        return RoleBound(
            None,
            "every role's top stage is communication; pipeline stages (pp.*) time a role's "
            "compute and its wait for the other roles together, so stage times cannot tell "
            "which role the others wait for",
        )
    return RoleBound(
        None,
        f"roles {', '.join(own)} each lead with their own work ({', '.join(own.values())})",
    )
