"""The profiler router on every path StageFrontier offers for timing data, in real 4-rank Gloo
DDP jobs under torchrun (``router_paths_job.py``).

Each path's job runs 128 steps in windows of 8 (``router_paths_support.STALLS``): two healthy
windows, four of a 120 ms stall in the job file's own ``slow_sample`` (data, rank 2), two healthy
windows, four of a 120 ms stall in its ``slow_forward`` (forward, rank 1), four healthy. The healthy
windows open nothing; each stall opens exactly one incident within three windows of its start,
confirmed by the traces, whose op diff names the stalled function first; with gradient
accumulation (4 microsteps, each batch fetched through ``timer.fetch`` inside the microstep loop,
the next one prefetched) too.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from conftest import PathRun
from recorder_support import read_records
from router_paths_support import RANKS, STALLS, WINDOW, run_path_job
from stagefrontier.render.incident import write_incident
from stagefrontier.route.offline import reduce_offline

EXPECTED = {  # fault -> (stage, suspect rank, the function the op diff names)
    "data": ("data.next_wait", 2, "slow_sample"),
    "forward": ("model.fwd_loss_cpu_wall", 1, "slow_forward"),
}


def _needs(module: str) -> Any:
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed"
    )


PATHS = [
    pytest.param("iter", id="iter"),
    pytest.param("fetch", id="fetch"),
    pytest.param("lightning", id="lightning", marks=_needs("lightning")),
    pytest.param("hf", id="hf", marks=_needs("transformers")),
    pytest.param("accum", id="accumulation"),
]


@pytest.mark.parametrize("fault", ["data", "forward"])
@pytest.mark.parametrize("path", PATHS)
def test_a_stall_opens_one_confirmed_incident_naming_the_function(
    router_path_runs: Callable[[str], PathRun], path: str, fault: str
) -> None:
    _, incidents = router_path_runs(path)
    stage, suspect, function = EXPECTED[fault]
    # One incident per stall, in the order of the stalls; this test reads its own stall's.
    assert len(incidents) == len(STALLS), [(i["id"], i["stage"], i["reasons"]) for i in incidents]
    assert all(i["window"] is not None for i in incidents), incidents
    incident = sorted(incidents, key=lambda i: i["window"])[list(STALLS).index(fault)]
    first_window = STALLS[fault][0] // WINDOW
    # The healthy windows before the stall open nothing; the stall opens one within three.
    assert first_window <= incident["window"] <= first_window + 2, incident["window"]
    assert incident["stage"] == stage
    assert incident["leader_rank"] == suspect
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    top = incident["op_diff"][0]
    assert function in top["name"], incident["op_diff"][:3]
    assert top["suspect_ms_per_step"] > 100 > 10 > top["reference_ms_per_step"]
    cost = incident["router_cpu_s"]
    assert set(cost["export"]) == {str(r) for r in incident["ranks"]}
    assert cost["reduction"] > 0


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("lightning", id="lightning", marks=_needs("lightning")),
        pytest.param("hf", id="hf", marks=_needs("transformers")),
    ],
)
def test_the_callbacks_find_the_dataloader_and_profile_its_workers(
    tmp_path: Path, path: str
) -> None:
    """The callbacks find the Trainer's DataLoader (2 workers) by themselves: every window
    carries every rank's worker figures, and a stall in rank 2's dataset opens an incident,
    confirmed, whose worker op diff and advice name ``slow_sample``."""
    out = tmp_path / "out"
    incidents = run_path_job(out, path, "workers")
    records = read_records(out)
    assert records
    for record in records:
        figures = record["loader_workers"]
        assert sorted(figures) == [str(r) for r in range(RANKS)], figures
        assert all(f["workers"] == 2 for f in figures.values()), figures
    timed = [r["loader_workers"] for r in records if "per_batch_s" in r["loader_workers"]["2"]]
    assert timed and any(figures["2"]["saturated"] for figures in timed)
    # The first incident; the stall lasts the whole run, so another may open after the cooldown.
    seen = [[r.get(k) for k in ("window", "top1", "lead", "block_lead", "labels")] for r in records]
    assert incidents, f"no incident opened; the windows said {seen}"
    incident = min(incidents, key=lambda i: i["window"])
    assert incident["trigger"] == "window" and incident["leader_rank"] == 2
    assert incident["stage"] == "data.next_wait"
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    top = incident["worker_op_diff"][0]
    assert "slow_sample" in top["name"], incident["worker_op_diff"][:3]
    assert "slow_sample" in incident["loader_advice"], incident["loader_advice"]
    # The same incident, had the run ended as its capture settled: the after-run process
    # (``stagefrontier incident``) diffs the workers' profiles too (it had left them out).
    folder = out / "incidents" / incident["id"]
    pending = {**incident, "confirmed": None, "reduced": "pending", "op_diff": []}
    for field in ("worker_op_diff", "loader_advice", "loader"):
        pending.pop(field, None)
    write_incident(folder, pending)
    after, reduced = reduce_offline(folder)
    assert reduced and after["reduced"] == "after the run", after["reasons"]
    assert "slow_sample" in after["worker_op_diff"][0]["name"], after["worker_op_diff"][:3]
    assert "slow_sample" in after["loader_advice"], after["loader_advice"]
