"""Rank 0's DataLoader figures of a window, from the worker counts each rank's window carries
(counted by ``record.loader_workers``): a worker's time per batch, how busy the workers were,
how often the step needs a batch, whether they are saturated, and the data wait's lead over
blocks of the workers' batches."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.block_lead import BlockLead, block_lead, unsteady_lead
from ..analysis.gates import Gates
from ..analysis.schema import DATA_STAGE
from ..analysis.window_report import WindowReport

SATURATED_BUSY = 0.8
"""Workers busy this fraction of the window or more supply as fast as they can: saturated."""


def loader_figures(
    raw: dict[str, Any], wall_s: float, data_wait_s: float, steps: int
) -> dict[str, Any]:
    """A rank's loader figures for the window record, from its counts (``WorkerCounters.read``)
    and its window's step time: ``per_batch_s`` a worker's time per batch, ``busy`` the workers'
    busy fraction, ``need_every_s`` the step's own time per batch (data wait excluded), whether
    the workers are ``saturated`` (busy nearly all the time, or all of them together supplying
    a batch less often than the step needs one), and ``workers_needed`` to supply a batch that
    often (more than there are, when they are saturated). None of these when a worker hung in a
    batch (``hung_s``): the window then measures the hang, not the workers' speed."""
    out = dict(raw)
    workers, batches = int(raw.get("workers", 0)), int(raw.get("batches", 0))
    span = float(raw.get("span_s", 0.0))
    if not workers or not batches or span <= 0 or raw.get("hung_s"):
        return out
    per_batch = float(raw.get("finished_busy_s", raw["busy_s"])) / batches
    consumed = int(raw.get("consumed", 0)) or steps
    need = max(wall_s - data_wait_s, 0.0) / max(consumed, 1)
    busy = min(float(raw["busy_s"]) / (workers * span), 1.0)
    saturated = busy >= SATURATED_BUSY or (need > 0 and per_batch > workers * need)
    needed = max(1, math.ceil(per_batch / need)) if need > 0 else None
    if saturated and needed is not None:
        needed = max(needed, workers + 1)
    out.update(
        per_batch_s=per_batch,
        busy=busy,
        need_every_s=need,
        saturated=saturated,
        workers_needed=needed,
    )
    return out


def loader_record(ranks: Sequence[Any], data_stage: str) -> dict[str, dict[str, Any]]:
    """``{rank: figures}`` for the ranks whose window carries loader counts."""
    out: dict[str, dict[str, Any]] = {}
    for w in ranks:
        if not w.loader:
            continue
        column = w.stages.index(data_stage) if data_stage in w.stages else None
        data = float(w.durations_ns[:, column].sum()) * 1e-9 if column is not None else 0.0
        out[str(w.rank)] = loader_figures(w.loader, float(w.wall_ns.sum()) * 1e-9, data, w.n_steps)
    return out


def loader_block_lead(
    ranks: Sequence[Any],
    d: npt.NDArray[np.float64],
    stages: Sequence[str],
    stage: str,
    leader: int | None,
    gates: Gates,
    positions: Sequence[int] | None = None,
) -> BlockLead | None:
    """The data wait's lead over blocks of as many steps as the leading rank has DataLoader
    workers (``analysis.block_lead``), among the merged ``ranks`` at ``positions`` (all by
    default); None when ``stage`` is not the data wait, the leader has fewer than two workers,
    the window is too short for enough blocks, or ``d`` holds no rank columns (node
    summaries)."""
    if stage != DATA_STAGE or leader is None or d.shape[1] != len(ranks):
        return None
    loader = next((w.loader for w in ranks if w.rank == leader), None) or {}
    workers = loader.get("workers")
    if not isinstance(workers, int) or workers < 2:
        return None
    cols = list(range(len(ranks))) if positions is None else list(positions)
    rank_ids = [ranks[i].rank for i in cols]
    return block_lead(d[:, cols, :], stages, rank_ids, stage, workers, gates)


def data_block_lead(
    ranks: Sequence[Any],
    d: npt.NDArray[np.float64],
    report: WindowReport,
    gates: Gates,
    positions: Sequence[int] | None = None,
) -> BlockLead | None:
    """The data wait's lead over its DataLoader's bursts (``loader_block_lead``) where a
    window's lead is read from it: the data wait on top, or below a top stage that no rank
    leads steadily step by step (a backward every rank shares, slowed by a busy machine, over
    one rank's slow workers). None otherwise, and where ``loader_block_lead`` gives none."""
    top = report.top1
    data = report.semantic_localization.get(DATA_STAGE)
    if top is None or not report.shares_defined or data is None:
        return None
    if top != DATA_STAGE:
        n = report.n_steps
        top_loc = report.semantic_localization[top]
        if not unsteady_lead(top_loc, n, report.exposed_s / n, gates, top):
            return None
    return loader_block_lead(
        ranks, d, report.stages, DATA_STAGE, data.leader_rank, gates, positions
    )
