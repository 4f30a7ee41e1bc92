"""What a window's DataLoader worker figures (``window.loader``) say about a data wait,
in the loader's own terms: raise ``num_workers`` or speed up the dataset when the workers are
saturated; look after the workers (pin_memory, transfer, IPC, the main process) when they idle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..analysis.block_lead import BlockLead
from ..analysis.schema import DATA_STAGE

BUSY_SHOWN = 0.5
"""Saturated workers' busy fraction is said when at least this (lower, the window mostly holds
their start-up)."""


def loader_sentence(figures: Mapping[str, Any], rank: int, slow_function: str = "") -> str:
    """One sentence on one rank's workers (empty when the figures hold no batch time).
    ``slow_function``: the worker function a capture found taking the time, if any."""
    workers = int(figures.get("workers", 0))
    if figures.get("hung_s"):
        return (
            f"rank {rank}'s DataLoader {figures.get('note', 'worker hung in one batch')}: the "
            "wait is that batch (a lock, a stuck read, a remote file), not the workers' speed."
        )
    if "per_batch_s" not in figures:
        return ""
    per_batch = float(figures["per_batch_s"]) * 1e3
    need = float(figures["need_every_s"]) * 1e3
    busy = float(figures["busy"])
    who = f"rank {rank}'s {workers} DataLoader worker{'s' if workers != 1 else ''}"
    if figures.get("saturated"):
        fix = f"speed up `{slow_function}`" if slow_function else "make the dataset faster"
        # A window in which workers started (a new epoch) holds their start-up, not work.
        busy_text = f" and are busy {busy:.0%} of the time" if busy >= BUSY_SHOWN else ""
        return (
            f"{who} each take ~{_ms(per_batch)} ms per batch{busy_text}; the step needs a "
            f"batch every ~{_ms(need)} ms: {fix} or raise num_workers (at least "
            f"{figures['workers_needed']})."
        )
    return (
        f"{who} are idle {1 - busy:.0%} of the time (~{_ms(per_batch)} ms per batch, one "
        f"needed every ~{_ms(need)} ms): the wait is after the workers (pin_memory, transfer, "
        "worker-to-main IPC or the main process), not in the dataset."
    )


def window_loader_sentence(record: Mapping[str, Any], top: str, leaders: list[int]) -> str:
    """The sentence for the window's leading rank when the top stage is the data wait."""
    loader = record.get("loader_workers")
    if not isinstance(loader, Mapping) or not loader or top != DATA_STAGE:
        return ""
    for rank in leaders:
        figures = loader.get(str(rank))
        if isinstance(figures, Mapping):
            text = loader_sentence(figures, rank)
            if text:
                return text[0].upper() + text[1:]
    return ""


def block_leader(record: Mapping[str, Any], stage: str) -> tuple[int, int] | None:
    """``(rank, block size)`` when the record's lead over blocks of steps (``block_lead``: a
    DataLoader's workers hand their batches over in bursts) names one rank steadily for
    ``stage``; None otherwise."""
    lead = record.get("block_lead")
    if not isinstance(lead, Mapping) or lead.get("stage") != stage or lead.get("why"):
        return None
    rank, size = lead.get("rank"), lead.get("size")
    return (rank, size) if isinstance(rank, int) and isinstance(size, int) else None


def block_lead_text(lead: BlockLead) -> str:
    """Why a rank leads the data wait over blocks of steps, in the loader's terms."""
    k = lead.size
    return (
        f"rank {lead.rank}'s {k} DataLoader workers hand over their batches {k} at a time, so "
        f"its wait falls on one step in {k}: judged over blocks of {k} steps, it leads "
        f"{lead.stage} alone in {lead.confident_blocks}/{lead.blocks} blocks and switches "
        f"{lead.switches} times"
    )


def _ms(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


def worker_line(incident: dict[str, Any]) -> str:
    """``in its DataLoader workers, `...slow_sample › ...` takes 15 ms per call, 120 ms per
    batch on rank 2; 0.1 ms on rank 1``; empty without a worker op diff or when the suspect's
    workers were not saturated."""
    rows = incident.get("worker_op_diff") or []
    if not rows or not (incident.get("loader") or {}).get("saturated"):
        return ""  # idle workers: their functions are not where the time goes
    top = rows[0]
    per_call = (
        f"{top['suspect_ms_per_call']:.1f} ms per call, " if top["calls_per_batch"] > 1 else ""
    )
    return (
        f"in its DataLoader workers, `{top['name']}` takes {per_call}"
        f"{top['suspect_ms_per_batch']:.1f} ms per batch on rank {incident['leader_rank']}; "
        f"{top['reference_ms_per_batch']:.1f} ms on rank {incident['reference_rank']}"
    )
