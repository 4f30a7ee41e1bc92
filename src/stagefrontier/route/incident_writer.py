"""Rank 0's incident, once its capture settled: the captured steps' cost, the reduction
(confirmation, op diff, the DataLoader workers' profiles) and the files (``incident.json``,
``.md`` and the page, its figures drawn after the run by a process of their own)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..failures import say_failed
from ..formats.packet import remove_temporaries
from ..render.incident import write_incident
from ..sinks.output_folder import shared_folder
from ..window.merged import AnalyzedWindow, iso_utc
from .capture import incident_dir
from .confirm import LiveWindow
from .html import draw_later, write_html
from .reduction import analyze_traces
from .requests import CaptureRequest
from .worker_profile import worker_findings

logger = logging.getLogger("stagefrontier")


class IncidentWriter:
    """Reduces and writes the incidents of one run folder (``out_dir``) with the router's
    ``config`` (its gates and ``min_share``)."""

    def __init__(self, config: Any, out_dir: str) -> None:
        self.config = config
        self.out_dir = out_dir
        self.pages_pending: list[dict[str, Any]] = []  # incident pages still without figures

    def remove_temporaries(self) -> None:
        """Before this run's first incident: the temporary files of trace exports and incident
        writes that a killed process left in earlier incidents' folders."""
        for folder in sorted(Path(self.out_dir, "incidents").glob("*/")):
            remove_temporaries(folder, "*.tmp")

    def reduce(
        self,
        incident: dict[str, Any],
        local: dict[int, str],
        live: list[LiveWindow],
        windows: Sequence[AnalyzedWindow],
        step_s: float,
    ) -> float:
        """Confirm the incident, diff its traces and its DataLoader workers' profiles, in place;
        returns the CPU seconds all of it took on this thread (the incident's reduction cost).
        The traces' part is budgeted at the captured steps' wall time (``analyze_traces``)."""
        start = time.thread_time()
        steps = incident["steps"][1] - incident["steps"][0] + 1
        step_ms = incident["capture_step_ms"] or step_s * 1e3
        budget = steps * step_ms / 1e3 if math.isfinite(step_ms) else None
        analyze_traces(
            incident, local, live, self.config.gates, self.out_dir, budget, self.config.min_share
        )
        incident["reduced"] = "live"
        worker_findings(incident, [w.record for w in windows], self.config.min_share)
        return time.thread_time() - start

    def write(self, incident: dict[str, Any]) -> None:
        """``incident.json`` and ``.md``, and the page without its figures (drawn after the
        run by a process of their own: ``draw_pending``)."""
        folder = incident_dir(self.out_dir, incident["id"])
        if incident.get("wall_clock"):  # opened, and last written now
            incident["wall_clock"]["end"] = iso_utc(time.time_ns())
        try:
            write_incident(folder, incident)
        except Exception as exc:
            say_failed(logger, f"writing incident {incident['id']}", exc, "it is not on disk")
            return
        try:
            write_html(folder, incident, self.out_dir, figures=False)
        except Exception as exc:
            say_failed(logger, f"writing incident {incident['id']}'s page", exc, "it has none")
        self.pages_pending.append(incident)

    def draw_pending(self) -> None:
        """The run ends: the pages written so far get their figures, after it, within the
        folder's disk budget."""
        folders = [incident_dir(self.out_dir, i["id"]) for i in self.pages_pending]
        draw_later(folders, shared_folder(self.out_dir).budget.budget)
        self.pages_pending.clear()


def capture_cost(
    incident: dict[str, Any], request: CaptureRequest, live: list[LiveWindow], since: int
) -> None:
    """Mean step time of the captured ranks during the capture, and their mean step time in
    the other steps of the same regime: from the first step of the window that opened the
    incident on (``since``: steps from before a stall began would make the capture look
    costly), in the live windows kept. Means both, as the window line's ms/step is: a
    DataLoader's bursts make the steps bimodal (a long wait on one step in two), and their
    median was half the captured steps' mean with nothing changed ("182.3 ms, outside it
    92.8 ms"). Under hierarchical collection rank 0 holds their rows of the captured steps
    only, so there is no ``baseline_step_ms``."""
    ranks = list(request.ranks)
    during: list[float] = []
    outside: dict[int, float] = {}
    captured = range(request.first_step, request.last_step + 1)
    for window in live:
        cols = [window.ranks.index(r) for r in ranks if r in window.ranks]
        if not cols:
            continue
        totals = window.d[:, cols, :].sum(axis=2).mean(axis=1)
        first = window.first_step
        for i, total in enumerate(totals):
            if first + i in captured:
                during.append(float(total))
            elif first + i >= since:
                outside[first + i] = float(total)
    if during:
        incident["capture_step_ms"] = round(float(np.mean(during)) * 1e3, 3)
    if outside:
        incident["baseline_step_ms"] = round(float(np.mean(list(outside.values()))) * 1e3, 3)
        incident["baseline_steps"] = [min(outside), max(outside)]
