"""The timed collectives' families and their names in words: DDP's buckets, FSDP2's all-gathers
and reduce-scatters, ZeRO-1's broadcasts and the program's own (``analysis.collectives``)."""

from __future__ import annotations

DEFAULT_FAMILY = "all_reduce"
"""The family of DDP's default bucket all-reduce (a user's hook is named by its function, a
program's own collective by the name it gave ``timer.collective``)."""
ALL_GATHER, REDUCE_SCATTER = "all_gather", "reduce_scatter"
"""FSDP2's families: their ``bucket`` is their order in the stage and step, not DDP's."""
OWN_PREFIX = "own:"
"""The family of a program's own collective: ``own:`` and the name given ``timer.collective``."""
ZERO_BROADCAST = "zero_broadcast"
"""ZeRO-1's parameter broadcasts at the end of its ``step``, one collective per step."""


def ddp_family(family: str) -> bool:
    """A DDP bucket's collective (DDP's all-reduce or the user's communication hook), whose
    ``bucket`` is DDP's own."""
    sharded = (ALL_GATHER, REDUCE_SCATTER, ZERO_BROADCAST)
    return family not in sharded and not family.startswith(OWN_PREFIX)


def collective_name(family: str, bucket: int) -> str:
    """A collective for the labels' reasons: ``user_hook of bucket 1`` (DDP's buckets),
    ``all_gather no. 1`` (FSDP2's, by order in the stage), ``loss_all_reduce`` (the program's
    own, the first of that name in the stage), ``zero_broadcast``."""
    if family in (ALL_GATHER, REDUCE_SCATTER):
        return f"{family} no. {bucket + 1}"
    if family == ZERO_BROADCAST or family.startswith(OWN_PREFIX):
        name = family.removeprefix(OWN_PREFIX)
        return name if bucket == 0 else f"{name} no. {bucket + 1}"
    return f"{family} of bucket {bucket}"
