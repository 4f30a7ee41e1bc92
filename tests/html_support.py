"""A simulated run's output folder and an incident in it, for the tests of the HTML pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from stagefrontier.formats.incident import new_incident
from stagefrontier.render.incident import write_incident
from stagefrontier.sinks import PacketSink
from stagefrontier.sinks.files import JsonlSink
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall", "residual")
MS = 1_000_000
LONG_OP = "stagefrontier/demo/faults.py(158): delay › <built-in function sleep>" * 3


def simulated_run(
    folder: Path, ranks: int, windows: int, slow: int, stages: tuple[str, ...] = STAGES
) -> Path:
    """``windows`` windows of 20 steps on ``ranks`` ranks, 8 per host; rank ``slow`` waits
    40 ms more for data from the second window on."""
    rng = np.random.default_rng(ranks)
    sinks = [PacketSink(folder), JsonlSink(folder)]
    for w in range(windows):
        parts = []
        for rank in range(ranks):
            d = rng.integers(8 * MS, 12 * MS, size=(20, len(stages)))
            d[:, -1] = 0
            if w >= 1 and rank == slow:
                d[:, 0] += 40 * MS
            parts.append(
                RankWindow(
                    w,
                    20 * w,
                    20 * w + 19,
                    rank,
                    stages,
                    d,
                    d.sum(axis=1),
                    hostname=f"node{rank // 8}",
                    local_rank=rank % 8,
                )
            )
        analyzed = analyze_merged(merge_windows(parts, ranks))
        for sink in sinks:
            sink.write(analyzed)
    return folder


def with_incident(folder: Path, slow: int, **fields: Any) -> dict[str, Any]:
    """An incident on rank ``slow`` written into ``folder`` (``fields`` replace its own)."""
    incident = new_incident("w00001", "window")
    trace = folder / "incidents" / "w00001" / f"rank{slow}.pt.trace.json.gz"
    incident.update(
        window=1,
        steps=[24, 28],
        stage="data.next_wait",
        leader_rank=slow,
        reference_rank=0,
        requested_ranks=[slow, 0],
        ranks=[0, slow],
        captured=True,
        confirmed=True,
        max_share_diff=0.01,
        trace_files={str(slow): str(trace)},
        trace_shares={"data.next_wait": 0.6, "model.backward_cpu_wall": 0.4},
        live_shares={"data.next_wait": 0.61, "model.backward_cpu_wall": 0.39},
        op_diff=[{"name": LONG_OP, "suspect_ms_per_step": 40.1, "reference_ms_per_step": 0.0}],
        capture_step_ms=60.0,
        baseline_step_ms=50.0,
        reasons=["a reason"],
    )
    incident.update(fields)
    write_incident(trace.parent, incident)
    return incident
