"""The profiler router on every path StageFrontier offers for timing data, in real 4-rank Gloo
DDP jobs under torchrun (``router_paths_job.py``).

Each job runs 48 steps in windows of 8: two healthy windows, then a 120 ms stall in the job
file's own ``slow_sample`` (data, rank 2) or ``slow_forward`` (forward, rank 1) until the end.
The healthy windows open nothing; the stall opens exactly one incident, confirmed by the traces,
whose op diff names the stalled function first. With gradient accumulation (4 microsteps, each
batch fetched through ``timer.fetch`` inside the microstep loop, the next one prefetched) the
incident opens within three windows of the stall's start.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from rank_support import run_job, torchrun_command
from recorder_support import read_records
from stagefrontier.render.incident import write_incident
from stagefrontier.route.offline import reduce_offline
from trace_support import settled_incidents

JOB = Path(__file__).resolve().parent / "router_paths_job.py"
RANKS = 4
STEPS = 48
WINDOW = 8
STALL_FROM = 16
DEADLINE_S = 420
FAULTS = {
    "data": ("--data-rank", "2", "--data-steps", f"{STALL_FROM}:{STEPS}"),
    "forward": ("--forward-rank", "1", "--forward-steps", f"{STALL_FROM}:{STEPS}"),
    # 2 DataLoader workers, which read the stall's steps when they fork: from step 0; 120 ms a
    # sample, so each worker's 480 ms a batch outlasts two steps even on a loaded machine
    "workers": (
        *("--data-rank", "2", "--data-steps", f"0:{STEPS}"),
        *("--workers", "2", "--sample-ms", "120"),
    ),
}
EXPECTED = {  # fault -> (stage, suspect rank, the function the op diff names)
    "data": ("data.next_wait", 2, "slow_sample"),
    "forward": ("model.fwd_loss_cpu_wall", 1, "slow_forward"),
}


def _needs(module: str) -> Any:
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None, reason=f"{module} is not installed"
    )


def _run(out: Path, path: str, fault: str) -> list[dict[str, Any]]:
    """One torchrun job; returns its incidents."""
    run_job(
        torchrun_command(
            JOB,
            *("--path", path, "--out", str(out), "--steps", str(STEPS), "--window", str(WINDOW)),
            *FAULTS[fault],
            ranks=RANKS,
        ),
        DEADLINE_S,
    )
    return settled_incidents(out)


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
    tmp_path: Path, path: str, fault: str
) -> None:
    incidents = _run(tmp_path / "out", path, fault)
    stage, suspect, function = EXPECTED[fault]
    assert len(incidents) == 1, [(i["id"], i["stage"], i["reasons"]) for i in incidents]
    incident = incidents[0]
    first_window = STALL_FROM // WINDOW
    # The healthy windows before the stall open nothing; the stall opens one within three.
    assert incident["window"] is not None
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
    incidents = _run(out, path, "workers")
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
