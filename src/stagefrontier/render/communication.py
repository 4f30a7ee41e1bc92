"""What the collectives say, in words: a late rank or a slow collective.

The window record's ``communication`` (``analysis.collectives``) holds the reading; these turn
it into the verdict's finding and next step when it concerns the stage that holds the step back
(a late rank into backward's buckets, or a bucket's all-reduce that got slower on every rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.collective_names import (
    ALL_GATHER,
    DEFAULT_FAMILY,
    OWN_PREFIX,
    REDUCE_SCATTER,
    ZERO_BROADCAST,
    ddp_family,
)
from ..analysis.schema import semantic_stage


def _reading(record: Mapping[str, Any], top: str | None, key: str) -> Mapping[str, Any] | None:
    """The record's ``late`` or ``slow`` collective when it ran in the top stage."""
    comm = record.get("communication")
    found = comm.get(key) if isinstance(comm, Mapping) else None
    if not isinstance(found, Mapping) or top is None:
        return None
    stage = found.get("stage")
    return found if isinstance(stage, str) and semantic_stage(stage) == top else None


SHARDED_WORDS = {
    ALL_GATHER: "all-gather",
    REDUCE_SCATTER: "reduce-scatter",
    ZERO_BROADCAST: "parameter broadcast",
}
"""FSDP2's and ZeRO-1's families in words; any other family is DDP's or the program's own."""


def _ddp(c: Mapping[str, Any]) -> bool:
    return ddp_family(str(c.get("family", DEFAULT_FAMILY)))


def bucket_text(c: Mapping[str, Any], plain_stage: str) -> str:
    """``backward's last gradient bucket``, ``backward's gradient bucket 3``, ``forward's
    first all-gather``, ``optimizer step's parameter broadcast`` or ``forward's
    loss_all_reduce``."""
    if not _ddp(c):
        return f"{plain_stage}'s {_which(c)}"
    which = "last gradient bucket" if c.get("last_bucket") else f"gradient bucket {c['bucket']}"
    return f"{plain_stage}'s {which}"


def family_text(c: Mapping[str, Any]) -> str:
    """``all-reduce``, the collective of the user's hook by its name (``fp16_compress_hook's
    collective``), ``all-gather``, ``reduce-scatter``, ``parameter broadcast``, or the name
    the program gave its own (``loss_all_reduce``)."""
    family = str(c.get("family", DEFAULT_FAMILY))
    if family in SHARDED_WORDS:
        return SHARDED_WORDS[family]
    if family.startswith(OWN_PREFIX):
        return family[len(OWN_PREFIX) :]
    return "all-reduce" if family == DEFAULT_FAMILY else f"{family}'s collective"


def before_first_layer(c: Mapping[str, Any]) -> bool:
    """An FSDP2 rank late into its step's first all-gather was late before the model's first
    layer ran: in its data loading or the start of its forward."""
    return c.get("family") == ALL_GATHER and c.get("bucket") == 0


def size_text(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MB"
    return f"{nbytes / 1024:.0f} KB"


def late_rank(record: Mapping[str, Any], top: str | None) -> Mapping[str, Any] | None:
    """The late collective of the top stage (its ``late_rank`` and ``lateness_ms``), if any."""
    return _reading(record, top, "late")


def late_lead(record: Mapping[str, Any], top: str | None) -> str:
    """``rank 1 late into its last bucket``: the leader the collectives name for the top stage,
    where every rank's share of it is alike (DDP's all-reduce makes the early ranks wait inside
    it for the late one); empty when they name none."""
    late = late_rank(record, top)
    return "" if late is None else f"rank {late['late_rank']} late into its {_which(late)}"


def _which(c: Mapping[str, Any]) -> str:
    """``last bucket``, ``bucket 3``, ``first all-gather``, ``all-gather 2`` (the second in
    its stage), ``parameter broadcast`` or ``loss_all_reduce``."""
    if _ddp(c):
        return "last bucket" if c.get("last_bucket") else f"bucket {c['bucket']}"
    what, order = family_text(c), int(c.get("bucket", 0))
    if c.get("family") not in (ALL_GATHER, REDUCE_SCATTER):
        return what if order == 0 else f"{what} {order + 1}"
    return f"first {what}" if order == 0 else f"{what} {order + 1}"


def late_finding(c: Mapping[str, Any], plain_stage: str, full: bool) -> str:
    """``rank 1 reaches backward's last gradient bucket ~100 ms after the others, which wait for
    it in all-reduce`` (``full``), or ``rank 1 late ~100 ms into its last bucket`` (``rank 2
    late ~97 ms at first all-gather``) for the headline."""
    lateness = f"~{c['lateness_ms']:.0f} ms"
    if not full:  # DDP's buckets are the rank's own; the others' collectives are named
        into = f"into its {_which(c)}" if _ddp(c) else f"at {_which(c)}"
        return f"rank {c['late_rank']} late {lateness} {into}"
    where = bucket_text(c, plain_stage)
    return (
        f"rank {c['late_rank']} reaches {where} {lateness} after the others, which wait for it "
        f"in {_the(family_text(c))} (measured in the collective, not inferred)"
    )


def starved_note(record: Mapping[str, Any], top: str | None, plain_stage: str) -> str:
    """``Rank 2 reaches backward's last gradient bucket ~90 ms after the others, but it waited
    ~85 ms per step longer for a CPU than they did: the machine held it back, not its code, so
    it is not named late``; empty when no rank of the top stage was held back for a CPU."""
    c = _reading(record, top, "starved")
    if c is None:
        return ""
    return (
        f"Rank {c['starved_rank']} reaches {bucket_text(c, plain_stage)} "
        f"~{c['starved_lateness_ms']:.0f} ms after the others, but it waited "
        f"~{c['cpu_wait_ms']:.0f} ms per step longer for a CPU than they did: the machine held "
        "it back, not its code, so it is not named late."
    )


def _the(what: str) -> str:
    return f"the {what}" if what in SHARDED_WORDS.values() else what


def slow_collective(record: Mapping[str, Any], top: str | None) -> Mapping[str, Any] | None:
    """The slow collective of the top stage, if any."""
    return _reading(record, top, "slow")


def slow_finding(c: Mapping[str, Any], full: bool) -> str:
    """``every rank reaches the all-reduce of bucket 3 (4.0 MB) within 2 ms, and it takes 140
    ms against 20 ms in windows 0-2: the collective or the network is slow, not a rank``, or
    ``slow bucket 3: 140 vs 20 ms`` for the headline (short: a slowdown of the whole job
    adds its flag and next step to it)."""
    which = f"bucket {c['bucket']}" if _ddp(c) else _which(c)
    if not full:
        took = f"{c['transfer_ms']:.0f} vs {c['baseline_ms']:.0f} ms"
        return f"slow {which}: {took}"
    named = f"the {family_text(c)} of {which}" if _ddp(c) else f"the {which}"
    what = f"{named} ({size_text(int(c['nbytes']))})"
    took = f"{c['transfer_ms']:.0f} ms against {c['baseline_ms']:.0f} ms"
    first, last = c["baseline_windows"]
    return (
        f"every rank reaches {what} within {c['spread_ms']:.0f} ms, and it takes {took} in "
        f"windows {first}-{last}: the collective or the network is slow, not a rank"
    )


SLOW_NEXT = "check the network and the collective"
"""The next step after a slow collective: no rank to profile."""


def communication_short(record: Mapping[str, Any], top: str | None, plain_stage: str) -> str:
    """The headline's words for the top stage's late rank or slow collective; empty when the
    collectives say nothing of it."""
    late = late_rank(record, top)
    if late is not None:
        return late_finding(late, plain_stage, full=False)
    slow = slow_collective(record, top)
    return "" if slow is None else slow_finding(slow, full=False)
