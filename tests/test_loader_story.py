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

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from recorder_support import read_records
from stagefrontier.render.headline import HEADLINE_MAX
from test_loader_router import run_loader_job
from trace_support import settled_incidents

STALL = 2
LATE_FROM = 20  # loader_job.py: the first slow step
LINE = re.compile(r"window (\d+) steps (\d+)-(\d+) \|.*")


def test_a_stall_in_the_workers_reads_as_one_story(tmp_path: Path) -> None:
    done = run_loader_job(tmp_path, "late")
    output = done.stdout + done.stderr
    # No exception from a background thread reached the job's output.
    assert "Traceback" not in output and "SideEvidenceError" not in output, output[-6000:]

    records = {r["window"]: r for r in read_records(tmp_path)}
    incidents = settled_incidents(tmp_path)
    # The first incident opened on a window of the stall (the job's router has no cooldown: an
    # incident of the start-up windows, while the workers start, does not hold it back).
    stalled = [i for i in incidents if records[i["window"]]["first_step"] >= LATE_FROM]
    assert stalled, [i["reasons"] for i in incidents]
    incident = stalled[0]
    # Opened by the router's lead over the workers' bursts or by the live regression check,
    # whichever judges the stalled window first: both name the stalled rank, and which one is
    # first depends on how a busy machine spreads the blocks of that window.
    assert incident["trigger"] in ("window", "regression"), incident["reasons"]
    assert incident["stage"] == "data.next_wait" and incident["leader_rank"] == STALL
    # Confirmed: by the traces, or, where the main thread's wait is missing from the few
    # captured steps (the workers' bursts, the capture's own pace), by the workers' own
    # profile. Before, such an incident stayed "not confirmed".
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]

    found = [(int(m.group(1)), m.group(0)) for m in LINE.finditer(done.stderr)]
    heads = {index: text for index, text in found if "| labels " not in text}
    lines = {index: text for index, text in found if "| labels " in text}  # details, at DEBUG
    assert sorted(lines) == sorted(heads) == sorted(records), (sorted(lines), sorted(records))
    assert all(len(text) <= HEADLINE_MAX for text in heads.values()), heads
    # Each stalled window's line states the lead over the workers' blocks whenever that lead is
    # steady (the judgment the router acts on), with the worker count; the window the router
    # acted on names its suspect.
    for index, record in records.items():
        if record["first_step"] < LATE_FROM + 2 * 2:  # before the stall (and its first blocks)
            continue
        line, lead = lines[index], record["block_lead"]
        assert record["top1"] == "data.next_wait", line
        assert lead is not None and lead["size"] == 2, lead
        if lead["why"]:  # a load spike on another rank broke the lead in this window
            continue
        assert f"led by rank {lead['rank']}" in line, line
        assert "No single rank leads" not in line and "on any rank" not in line, line
        assert f"rank {lead['rank']}'s 2 dataloader workers" in line.lower(), line
    opened = records[incident["window"]]
    assert f"led by rank {STALL}" in lines[incident["window"]], lines[incident["window"]]
    assert f"led by rank {STALL}" in heads[incident["window"]], heads[incident["window"]]
    assert opened["block_lead"]["rank"] == STALL or opened["block_lead"]["why"], opened

    # The capture is compared with steps of the stalled regime only.
    first, last = incident["baseline_steps"]
    assert LATE_FROM <= opened["first_step"] <= first <= last, (incident["baseline_steps"], opened)
    page = tmp_path / "incidents" / incident["id"] / "incident.md"
    assert "since the window that opened it" in page.read_text()
