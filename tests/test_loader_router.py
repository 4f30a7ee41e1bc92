"""DataLoader workers under the profiler router, in real 4-rank Gloo DDP jobs under torchrun
(``loader_job.py``): 2 worker processes per rank, a 120 ms stall on rank 2 either in the dataset
(``slow_sample``, in the workers) or in the main process as each batch arrives (a slow transfer).

The window records carry every rank's worker figures; the router opens one incident by itself
(two workers hand over their batches in pairs, so rank 2 waits on every other step: the router
judges that lead over blocks of two steps), the traces confirm it, and it names the worker
function from the workers' own profiles when they are saturated, or the main process's function
and says the wait is after the workers when they idle. Without a stall, the router opens
nothing over the whole run. Nothing asserts a duration: only which rank, which function, and
which side of the loader.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from rank_support import run_job, torchrun_command
from recorder_support import read_records
from stagefrontier.cli.main import main
from stagefrontier.formats.incident import incident_id_of
from stagefrontier.render.incident import summary_line, write_incident
from trace_support import settled_incidents

RANKS = 4
STALL = 2
WINDOWS = 5  # loader_job.py: 50 steps in windows of 10
JOB = Path(__file__).with_name("loader_job.py")
DEADLINE_S = 300


def run_loader_job(out: Path, mode: str) -> subprocess.CompletedProcess[str]:
    """``loader_job.py`` in ``mode`` on 4 ranks under torchrun, writing to ``out``; asserts it
    ended well and returns what it printed."""
    return run_job(torchrun_command(JOB, str(out), mode, ranks=RANKS), DEADLINE_S)


def _run(tmp_path: Path, mode: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    out = tmp_path / mode
    out.mkdir()
    run_loader_job(out, mode)
    return read_records(out), settled_incidents(out)


def _incident(tmp_path: Path, mode: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A stalled job's records and its one incident, opened by the router and confirmed."""
    records, incidents = _run(tmp_path, mode)
    assert len(incidents) == 1, [i["reasons"] for i in incidents]
    incident = incidents[0]
    assert incident["trigger"] == "window", incident["reasons"]  # the router's own decision
    assert incident["stage"] == "data.next_wait" and incident["leader_rank"] == STALL
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    return records, incident


def test_slow_workers_are_saturated_and_the_incident_names_the_dataset_function(
    tmp_path: Path,
) -> None:
    records, incident = _incident(tmp_path, "workers")
    for record in records:
        figures = record["loader_workers"]
        assert sorted(figures) == [str(r) for r in range(RANKS)], figures
        assert all(f["workers"] == 2 and f["per_batch_s"] > 0 for f in figures.values())
        assert not any(figures[str(r)]["saturated"] for r in range(RANKS) if r != STALL)
        assert all(
            figures[str(STALL)]["busy"] > f["busy"]
            for f in figures.values()
            if f is not figures[str(STALL)]
        )
    opened = next(r for r in records if r["window"] == incident["window"])
    assert opened["loader_workers"][str(STALL)]["saturated"] is True
    top = incident["worker_op_diff"][0]
    assert "slow_sample" in top["name"] and "sleep" in top["name"], top
    assert top["suspect_ms_per_batch"] > top["reference_ms_per_batch"]
    folder = tmp_path / "workers" / "incidents" / incident["id"]
    for rank in incident["ranks"]:
        assert (folder / f"rank{rank}.workers.json").exists()
        assert sorted(p.name for p in folder.glob(f"rank{rank}.worker*.prof")) == [
            f"rank{rank}.worker0.prof",
            f"rank{rank}.worker1.prof",
        ]
    needed = incident["loader"]["workers_needed"]
    assert needed > 2
    assert (
        f"speed up `slow_sample` or raise num_workers (at least {needed})"
        in (incident["loader_advice"])
    )
    assert "slow_sample" in (folder / "incident.md").read_text()
    # The incident line leads with the worker function, before the main process's wait.
    line = summary_line(incident)
    assert " | confirmed | in its DataLoader workers, `" in line and "slow_sample" in line, line
    _reduced_after_the_run_over_any_records_limit(tmp_path / "workers", incident)
    _the_figures_of_the_incidents_own_attempt(tmp_path / "workers", incident)


def _reduced_after_the_run_over_any_records_limit(out: Path, incident: dict[str, Any]) -> None:
    """The same incident reduced after the run (``stagefrontier incident``), its
    ``windows.jsonl`` over the size limit a whole-file read takes (a month-long run's, 100,000
    windows): the records are read one line at a time, so the loader's figures and advice
    come back (before: the file was refused and the incident had none)."""
    size = (out / "windows.jsonl").stat().st_size
    os.environ["STAGEFRONTIER_MAX_RECORDS_BYTES"] = str(size // 4)
    try:
        after = _reduced_again(out / "incidents" / incident["id"], incident)
    finally:
        del os.environ["STAGEFRONTIER_MAX_RECORDS_BYTES"]
    assert after["reduced"] == "after the run", after["reasons"]
    assert after["loader"] == incident["loader"], after.get("loader")
    assert "slow_sample" in after["loader_advice"], after.get("loader_advice")


def _reduced_again(folder: Path, incident: dict[str, Any]) -> dict[str, Any]:
    """``incident`` written back unreduced into its ``folder`` and reduced by ``stagefrontier
    incident``: what it then holds."""
    pending = {**incident, "confirmed": None, "reduced": "pending", "op_diff": []}
    for field in ("worker_op_diff", "loader_advice", "loader"):
        pending.pop(field, None)
    write_incident(folder, pending)
    assert main(["incident", str(folder)]) == 0
    return json.loads((folder / "incident.json").read_text())  # type: ignore[no-any-return]


def _the_figures_of_the_incidents_own_attempt(out: Path, incident: dict[str, Any]) -> None:
    """The run, as if it were a job resumed into a folder whose first attempt had the same
    windows with other loader figures: the incident (now attempt 1's, its id says) takes the
    figures of its own window of attempt 1 (before: the first record of its window index,
    attempt 0's)."""
    records = (out / "windows.jsonl").read_text().splitlines()
    earlier = []
    for line in records:
        record = json.loads(line)
        for figures in record["loader_workers"].values():
            figures["per_batch_s"] *= 3
        earlier.append(json.dumps(record))
    resumed = [json.dumps({**json.loads(line), "attempt": 1}) for line in records]
    (out / "windows.jsonl").write_text("\n".join(earlier + resumed) + "\n")
    folder = out / "incidents" / incident["id"]
    after = _reduced_again(folder, {**incident, "id": incident_id_of(incident["window"], 1)})
    assert after["loader"] == incident["loader"], after.get("loader")


def test_a_slow_transfer_in_the_main_process_reads_as_idle_workers(tmp_path: Path) -> None:
    records, incident = _incident(tmp_path, "transfer")
    for record in records:
        figures = record["loader_workers"]
        assert sorted(figures) == [str(r) for r in range(RANKS)], figures
        assert not any(f["saturated"] for f in figures.values()), figures
    # The time is in the main process: the trace's op diff names the function there.
    assert "receive" in incident["op_diff"][0]["name"], incident["op_diff"][:3]
    assert incident["loader"]["saturated"] is False
    advice = incident["loader_advice"]
    assert "idle" in advice and "not in the dataset" in advice, advice


def test_a_healthy_run_with_workers_opens_no_incident(tmp_path: Path) -> None:
    """The same job without a stall, router on from the first step to the last: every window
    is analyzed with every rank's worker figures, no rank's workers read as saturated, and the
    router opens nothing over the whole run."""
    records, incidents = _run(tmp_path, "none")
    assert [r["window"] for r in records] == list(range(WINDOWS))
    for record in records:
        figures = record["loader_workers"]
        assert sorted(figures) == [str(r) for r in range(RANKS)], figures
        assert all(f["workers"] == 2 and not f.get("saturated") for f in figures.values())
    assert incidents == [], [(i["id"], i["reasons"]) for i in incidents]
