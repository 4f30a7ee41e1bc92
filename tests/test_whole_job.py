"""A slowdown of the whole job is named as such in the window line and never captured; and a
capture whose suspect is its own reference cannot be requested.

The slowdown is spread over every stage of every rank: from step 60 of a healthy 4-rank Gloo DDP
run on, each rank sleeps 30 ms in each of four stages of every step (data, forward, backward and
the callbacks), as when every part of the job waits on the same slower resource. Sleeps make it
the same size however busy the machine is (a CPU-burning neighbour's effect shrinks as the
machine's other load grows; ``benchmarks/false_alarms.py`` measures that one).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stagefrontier.analysis.regression import regression_text
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.route import list_incidents

STEPS = 120
WINDOW = 20
SPREAD = tuple(
    parse_fault(f"{kind}@all:30ms,from=60")
    for kind in ("data", "forward", "backward", "callback_host")
)
"""From step 60: three healthy windows make the baseline."""


def test_a_slowdown_of_every_stage_and_rank_is_the_whole_jobs_and_opens_no_incident(
    tmp_path: Path,
) -> None:
    out = tmp_path / "spread"
    run = launch(
        DemoConfig(
            ranks=4,
            steps=STEPS,
            window=WINDOW,
            faults=SPREAD,
            out_dir=str(out),
            collect_timeout_s=10.0,
            quiet=True,
            router=True,
        ),
        deadline_s=400.0,
    )
    records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
    assert len(records) == STEPS // WINDOW == len(run.windows)
    flagged = [r["regression"] for r in records if r.get("regression")]
    assert flagged, "the slowed windows were not flagged"
    assert [f["kind"] for f in flagged] == ["whole_job"] * len(flagged), flagged
    line = regression_text(flagged[0])
    assert "the whole job slowed" in line and "the cause is outside the training code" in line
    assert "host" in flagged[0] and "load_average" in flagged[0]["host"]["now"]
    assert list_incidents(out) == [], [i["reasons"] for i in list_incidents(out)]


def test_a_capture_whose_suspect_is_its_own_reference_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0's coordinator, on a real c10d store: a decision naming rank 1 as both suspect
    and reference writes no request and opens no incident; it says why in one line."""
    from torch.distributed import TCPStore

    from stagefrontier import ProfilerRouter
    from stagefrontier.route.coordinator import Coordinator
    from stagefrontier.route.decide import Decision
    from stagefrontier.route.policy import Plan
    from stagefrontier.route.requests import REQUEST_KEY, RequestChannel

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))
    channel = RequestChannel(store, prefix="refusal/")
    coordinator = Coordinator(
        ProfilerRouter(), out_dir=str(tmp_path), channel=channel, current_step=lambda: 40
    )
    decision = Decision("data.next_wait", 1, 1, 0.5, 4, ("every rank grew alike",))
    with caplog.at_level(logging.INFO, logger="stagefrontier"):
        coordinator._open(Plan(decision, "regression", [1]))
    assert coordinator.open is None and coordinator.captures == 0
    assert channel.read(REQUEST_KEY) is None
    assert not (tmp_path / "incidents").exists()
    said = [r.getMessage() for r in caplog.records]
    assert any("would be its own reference" in m for m in said), said
