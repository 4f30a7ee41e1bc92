"""Gradient accumulation with the batch fetched through ``timer.fetch`` between forward and
backward of every microstep (nanoGPT's loop, ``router_paths_job.py --path accum``), in a real
4-rank Gloo DDP job under torchrun with a 120 ms data stall on rank 2 in steps 16 to 47 (then,
after two healthy windows, the forward stall that ``test_router_paths`` reads from the same job).

Each microstep's fetch is that microstep's own wait: every stalled window carries the data wait
in all four microsteps, none of them holds most of it, and the window line does not say "most
of it in microstep 0". The router's capture names each wait range for the step the live record
charges it to, so the trace and the live steps still agree (confirmed).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

pytest.importorskip("torch")

from conftest import PathRun
from recorder_support import read_records
from router_paths_support import STALLS
from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.render.text import window_details

DATA = "data.next_wait"
MICROSTEPS = 4


def test_each_microsteps_fetch_is_charged_to_its_own_microstep(
    router_path_runs: Callable[[str], PathRun],
) -> None:
    """Reads the same job as ``test_router_paths[accumulation-*]`` (``router_path_runs``)."""
    out, incidents = router_path_runs("accum")
    start, end = STALLS["data"]
    stalled = [r for r in read_records(out) if start < r["first_step"] < end]
    assert stalled
    for record in stalled:
        total = record["semantic_shares"][DATA]
        parts = [record["shares"][f"{DATA}[{k}]"] for k in range(MICROSTEPS)]
        assert record["top1"] == DATA, record["semantic_shares"]
        assert all(0 < part <= total / 2 for part in parts), (record["window"], parts, total)
        line = window_details(WindowReport.from_dict(record), record)
        assert "most of it in microstep" not in line, line
    # the data stall's incident, then the forward stall's
    assert len(incidents) == len(STALLS), [(i["id"], i["reasons"]) for i in incidents]
    incident = min(incidents, key=lambda i: i["window"])
    assert incident["stage"] == DATA and incident["leader_rank"] == 2
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
