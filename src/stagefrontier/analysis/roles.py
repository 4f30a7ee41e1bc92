"""Role groups: which ranks are replicas of each other, and how a role's report names ranks.

With pipeline, tensor or expert parallelism the ranks of one role (say pipeline stage 1) are
homogeneous replicas that wait on each other at the same boundaries, while ranks of different
roles do not. The analyzer therefore runs once per role on that role's columns; this module
checks the role list, forms the groups, slices the side evidence for a group and writes the
group's rank positions back as the window's rank positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from ..errors import RolesError, StageFrontierError
from .accounting import FloatArray
from .evidence import StageLocalization
from .side import SideEvidence

UNKNOWN_ROLE = ""
"""The role of a rank that did not say which role it plays, in a window where others did."""


def check_roles(
    roles: Sequence[str | None] | None, n_ranks: int, expected: Sequence[str] = ()
) -> list[str] | None:
    """One role name per rank (``None`` or ``""`` for a rank whose role is unknown).

    Raises RolesError for a single string, a set, a list of the wrong length, or a role that is
    not among ``expected`` (the job's full role set, when known)."""
    if roles is None:
        return None
    if isinstance(roles, str):
        raise RolesError("roles must be a sequence with one role per rank, not a single string")
    if isinstance(roles, (set, frozenset, dict)):
        raise RolesError("roles must be in rank order (a list or tuple), not an unordered set")
    role_list = [UNKNOWN_ROLE if x is None else str(x) for x in roles]
    if len(role_list) != n_ranks:
        raise RolesError(f"{len(role_list)} roles given for {n_ranks} ranks: need one per rank")
    strange = sorted({x for x in role_list if x != UNKNOWN_ROLE} - set(expected))
    if expected and strange:
        raise RolesError(
            f"role(s) {strange} are not among the job's roles {sorted(expected)}: "
            "the role list and the role set disagree"
        )
    return role_list


def role_groups(roles: Sequence[str] | None) -> dict[str, list[int]]:
    """Rank positions per known role, in role-name order; empty unless two or more groups
    (known roles, or one known role beside ranks of unknown role) make the window mixed."""
    if roles is None or len(set(roles)) < 2:
        return {}
    groups: dict[str, list[int]] = {}
    for position, role in enumerate(roles):
        if role != UNKNOWN_ROLE:
            groups.setdefault(role, []).append(position)
    return dict(sorted(groups.items()))


def group_side(side: SideEvidence, cols: list[int], wall_fraction: float) -> SideEvidence:
    """The side evidence restricted to one group's rank positions.

    Per-rank arrays are sliced. The overlap error is a window total without a per-rank split,
    so each group keeps the window's overlap fraction (``wall_fraction`` is the group's part of
    the window's rank-summed wall). Collection facts (missing ranks, notes) concern every
    group; the job's role set is the whole window's business.
    """
    idx = np.asarray(cols)
    ref = side.no_stall_reference_s
    return replace(
        side,
        event_ms=None if side.event_ms is None else np.asarray(side.event_ms)[:, idx],
        event_state=None if side.event_state is None else np.asarray(side.event_state)[:, idx],
        no_stall_reference_s=ref if ref is None or np.ndim(ref) == 1 else np.asarray(ref)[idx],
        overlap_error_s=side.overlap_error_s * wall_fraction,
        expected_roles=(),
        collectives=None,  # a collective spans the roles' ranks: read on the whole window
    )


def wall_fractions(arr: FloatArray, groups: dict[str, list[int]]) -> dict[str, float]:
    """Each group's part of the window's rank-summed step time."""
    per_rank = arr.sum(axis=(0, 2))
    total = float(per_rank.sum())
    return {
        role: float(per_rank[cols].sum()) / total if total > 0 else 0.0
        for role, cols in groups.items()
    }


def checked_rank_ids(
    ranks: Sequence[int], width: int, error: type[StageFrontierError]
) -> npt.NDArray[np.int64]:
    """``ranks`` as an int array: one distinct rank number in ``[0, 2**31)`` per column of a
    window ``width`` columns wide; raises ``error`` otherwise."""
    try:
        ids = np.asarray(ranks)
    except (TypeError, ValueError) as exc:
        raise error(f"ranks must be a list of rank numbers: {exc}") from None
    if ids.shape != (width,) or (width and ids.dtype.kind not in "iu"):
        raise error(f"ranks must list one rank number per column: {width} needed")
    ids = ids.astype(np.int64)
    if width and (ids.min() < 0 or ids.max() >= 1 << 31 or np.unique(ids).size != width):
        raise error("ranks must be distinct rank numbers in [0, 2**31)")
    return ids


def renumbered(loc: StageLocalization, ranks: Sequence[int]) -> StageLocalization:
    """``loc`` with every rank position (leader, tie set, leading ranks) read through ``ranks``:
    a group's positions become the positions of those ranks in the whole window."""
    return replace(
        loc,
        leader_rank=None if loc.leader_rank is None else ranks[loc.leader_rank],
        tied_ranks=[ranks[r] for r in loc.tied_ranks],
        leading_ranks=[ranks[r] for r in loc.leading_ranks],
    )
