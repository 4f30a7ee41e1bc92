"""A data stall that begins mid-run in a DataLoader's workers, in a real 4-rank Gloo DDP job
under torchrun (``loader_job.py late``), with the live regression check on and the window lines
logged, as a job runs by default.

The window lines and the incident tell one story: the router's decision is made (no exception
from its thread, no traceback in the job's output), the line of every stalled window names the
rank the router captures and says it leads over blocks of its two workers' batches, and the
capture's step time is compared with steps of the same regime (none from before the stall).
Nothing asserts a duration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from recorder_support import read_records
from stagefrontier.route import list_incidents

RANKS = 4
STALL = 2
LATE_FROM = 20  # loader_job.py: the first slow step
JOB = Path(__file__).with_name("loader_job.py")
DEADLINE_S = 300
LINE = re.compile(r"window (\d+) steps (\d+)-(\d+) \|.*")


def test_a_stall_in_the_workers_reads_as_one_story(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={RANKS}",
        "--max-restarts=0",
        str(JOB),
        str(tmp_path),
        "late",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    # No exception from a background thread reached the job's output.
    assert "Traceback" not in output and "SideEvidenceError" not in output, output[-6000:]

    records = {r["window"]: r for r in read_records(tmp_path)}
    incidents = list_incidents(tmp_path)
    # The first incident opened on a window of the stall (the job's router has no cooldown: an
    # incident of the start-up windows, while the workers start, does not hold it back).
    stalled = [i for i in incidents if records[i["window"]]["first_step"] >= LATE_FROM]
    assert stalled, [i["reasons"] for i in incidents]
    incident = stalled[0]
    # The router's own decision on a window (its lead judged over the workers' bursts).
    assert incident["trigger"] == "window", incident["reasons"]
    assert incident["stage"] == "data.next_wait" and incident["leader_rank"] == STALL
    assert incident["captured"], incident["reasons"]

    lines = {int(m.group(1)): m.group(0) for m in LINE.finditer(done.stderr)}
    assert sorted(lines) == sorted(records), (sorted(lines), sorted(records))
    # Every stalled window's line names the rank the router captured, with its workers.
    for index, record in records.items():
        if record["first_step"] < LATE_FROM + 2 * 2:  # before the stall (and its first blocks)
            continue
        line = lines[index]
        assert record["top1"] == "data.next_wait", line
        assert f"led by rank {STALL}" in line, line
        assert "No single rank leads" not in line and "on any rank" not in line, line
        assert f"rank {STALL}'s 2 dataloader workers" in line.lower(), line

        lead = record["block_lead"]  # the lead over blocks of the two workers' batches
        assert lead is not None and lead["size"] == 2, lead
        assert lead["why"] or lead["rank"] == STALL, lead

    opened = records[incident["window"]]

    # The capture is compared with steps of the stalled regime only.
    first, last = incident["baseline_steps"]
    assert LATE_FROM <= opened["first_step"] <= first <= last, (incident["baseline_steps"], opened)
    page = tmp_path / "incidents" / incident["id"] / "incident.md"
    assert "since the window that opened it" in page.read_text()
