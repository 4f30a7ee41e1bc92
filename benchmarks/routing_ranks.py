"""The rank table of ``routing.py``: which rank the timed collectives name late.

On the rows whose stage ends in DDP's gradient all-reduce (a delay before or inside backward,
or in the communication hook), every rank leaves backward together and the stage matrix's
leader is a near-tie; the buckets timed on every rank (``timer.watch_ddp``, which the demo
calls) name the rank the others waited for. A row's rank is the one its scored windows name
late most often.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.formats.records import read_records

RANK_FAMILIES = ("backward", "backward_compute", "comm")
"""The rows whose stage ends in DDP's all-reduce: the rank comes from the collectives."""


def late_ranks(out_dir: Path, first_step: int, last_step: int) -> list[int | None]:
    """The late rank each scored window's timed collectives name (None: none named)."""
    records = read_records(out_dir / "windows.jsonl")
    return [
        (r.get("communication") or {}).get("late_rank")
        for r in records
        if first_step <= r["first_step"] and r["last_step"] <= last_step
    ]


def named_rank(row: dict[str, Any]) -> int | None:
    """The rank a row's windows name late most often; None when none names one."""
    named = [r for r in row.get("late_ranks", []) if r is not None]
    return max(set(named), key=named.count) if named else None


def rank_table(
    rows: Sequence[dict[str, Any]], titles: dict[str, str], delay_ms: float
) -> list[str]:
    """Per family and rank count: the rows whose collectives name the faulty rank late (the
    rank top-1), against the frontier leader; and the no-fault windows that name a late rank."""
    out = []
    for family in RANK_FAMILIES:
        for ranks in sorted({r["ranks"] for r in rows}):
            group = [r for r in rows if r["family"] == family and r["ranks"] == ranks]
            group = [r for r in group if r["delay_ms"] == delay_ms]
            if not group:
                continue
            n = len(group)
            named = sum(named_rank(r) == r["fault_rank"] for r in group)
            leaders = sum(r["leader"] == r["fault_rank"] for r in group)
            windows = sum(len(r.get("late_ranks", [])) for r in group)
            right = sum(x == r["fault_rank"] for r in group for x in r.get("late_ranks", []))
            out.append(
                [titles[family], ranks, n, f"{named}/{n}", f"{leaders}/{n}",
                 f"{right}/{windows}"]
            )  # fmt: skip
    for r in (r for r in rows if r["family"] == "none"):
        late = [x for x in r.get("late_ranks", []) if x is not None]
        out.append(["No fault", r["ranks"], 1, "-", "-", f"{len(late)} named late"])
    headers = [
        "Scenario",
        "Ranks",
        "Rows",
        "Rank top-1 (collectives)",
        "Frontier leader = faulty rank",
        "Windows naming the faulty rank",
    ]
    intro = (
        "A row's rank top-1 is the rank its scored windows name late most often"
        " (`communication.late_rank`, from the DDP buckets timed on every rank); the frontier"
        " leader is the stage matrix's alone. Target: 9 of 10 rows per family at 4 and 8 ranks"
        " together; no late rank named in a no-fault window."
    )
    return [intro, "", *hc.table(headers, out)]
