"""One CSV row per window; needs only the standard library."""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path
from typing import Any

from ..analysis.window_metrics import NO_LEADER
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")

CSV_FIELDS = (
    "window",
    "first_step",
    "last_step",
    "steps",
    "ranks",
    "exposed_ms_per_step",
    "top1",
    "top1_share",
    "leader_rank",
    "labels",
    "regression_ms_per_step",
    "regression_stage",
    "self_cost_fraction",
)
"""The fixed leading columns; one ``share:<stage>`` column per stage follows."""


class CsvSink:
    """One row per window in a CSV file: the fixed :data:`CSV_FIELDS` (labels joined by ``;``,
    ``leader_rank`` empty where no single rank leads), then ``share:<stage>`` per stage in schema
    order (empty where the window's shares are undefined). The header is written when the file is
    new or empty; the columns are fixed by the first window written, and a stage that appears
    later is left out with a warning. Needs nothing beyond the standard library.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: Any = None
        self._writer: csv.DictWriter[str] | None = None
        self._stage_columns: list[str] = []
        self._warned: set[str] = set()

    def write(self, window: AnalyzedWindow) -> None:
        m = window.metrics
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = self.path.open("a", encoding="utf-8", newline="")
            self._stage_columns = [f"share:{s}" for s in m.stages]
            self._writer = csv.DictWriter(
                self._file,
                fieldnames=[*CSV_FIELDS, *self._stage_columns],
                restval="",
                extrasaction="ignore",
            )
            if new:
                self._writer.writeheader()
        row: dict[str, Any] = {
            "window": m.window,
            "first_step": m.first_step,
            "last_step": m.last_step,
            "steps": m.n_steps,
            "ranks": m.n_ranks,
            "exposed_ms_per_step": f"{m.exposed_ms_per_step:.6g}",
            "top1": m.top1 or "",
            "top1_share": "" if m.top1_share is None else f"{m.top1_share:.6g}",
            "leader_rank": "" if m.leader_rank == NO_LEADER else m.leader_rank,
            "labels": ";".join(m.labels),
            "regression_ms_per_step": f"{m.regression_ms_per_step:.6g}",
            "regression_stage": m.regression_stage or "",
            "self_cost_fraction": f"{m.self_cost_fraction:.6g}",
        }
        for stage, share in m.shares.items():
            column = f"share:{stage}"
            if column not in self._stage_columns and column not in self._warned:
                self._warned.add(column)
                logger.warning("stagefrontier: %s has no column in %s; left out", stage, self.path)
            row[column] = f"{share:.6g}"
        self._writer.writerow(row)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None
