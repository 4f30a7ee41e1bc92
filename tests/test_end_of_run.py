"""The end of a run with an incident just closed, on real Gloo ranks around the job's real
TCPStore (``end_of_run_support``): rank 0 settles the incident as its timer closes, leaves its
reduction to the process it starts after the run, and that process confirms it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed")

from end_of_run_support import CLOSE_FILE, LOG_FILE, STAGE, SUSPECT, EndJob, run_rank
from rank_support import START_METHOD
from stagefrontier.demo.launch import run_ranks
from stagefrontier.formats.incident import list_incidents
from stagefrontier.render.incident import summary_line

RANKS = 3
AFTER_RUN_WAIT_S = 300.0
"""How long the test waits for the after-run process (it starts as the job ends)."""


def test_a_reduction_pending_at_close_is_done_by_the_after_run_process(tmp_path: Path) -> None:
    """Before: rank 0 confirmed and op-diffed the traces on its router thread as its timer
    closed (1.5 s under load in the demo), and its close waited for it. Now the incident is
    written pending, with no reduction on the job's threads, and the process rank 0 starts as
    it closes reduces it: its record ends confirmed (or not), saying it was reduced after the
    run."""
    job = EndJob(out_dir=str(tmp_path), ranks=RANKS)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=400.0, start_method=START_METHOD)
    assert codes == dict.fromkeys(range(RANKS), 0), f"rank exit codes {codes}"
    for rank in range(RANKS):
        assert json.loads(Path(job.out_dir, CLOSE_FILE.format(rank=rank)).read_text()) >= 0
    end = time.monotonic() + AFTER_RUN_WAIT_S
    incidents = list_incidents(job.out_dir)
    while time.monotonic() < end and [i["confirmed"] for i in incidents] == [None]:
        time.sleep(0.5)  # until the after-run process has reduced it (or rank 0 had)
        incidents = list_incidents(job.out_dir)
    assert len(incidents) == 1
    incident = incidents[0]
    assert incident["captured"], incident["reasons"]
    assert (incident["stage"], incident["leader_rank"]) == (STAGE, SUSPECT)
    assert incident.get("reduced") == "after the run", incident["reasons"]
    assert isinstance(incident["confirmed"], bool), incident["reasons"]
    assert incident["trace_shares"] and incident["op_diff"], incident["reasons"]
    pending = [r for r in incident["reasons"] if "left to a process of its own" in r]
    assert len(pending) == 1, incident["reasons"]
    assert "reduced after the run by `stagefrontier incident`" in incident["reasons"][-1]
    # rank 0 spent no CPU on a reduction: the job's threads never ran one
    assert not (incident.get("router_cpu_s") or {}).get("reduction"), incident["router_cpu_s"]
    assert "not reduced yet" not in summary_line(incident)
    # the line rank 0 logged as it settled claims no confirmation that had not happened
    log = Path(job.out_dir, LOG_FILE).read_text(encoding="utf-8")
    settled = [line for line in log.splitlines() if "incident w" in line and " | " in line]
    assert len(settled) == 1, log
    assert "not reduced yet" in settled[0] and "confirmed" not in settled[0], settled[0]


def test_a_router_thread_busy_past_the_close_bound_is_said_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a closing timer waited up to ``capture_timeout_s`` + 60 s for its router thread.
    Now it waits its part of the close deadline and goes on, saying so in one line (the thread
    is kept busy here by a job of its own queue that outlasts a deadline shortened to 1 s)."""
    import logging
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.deadline import DEADLINE_VARIABLE

    caplog.set_level(logging.INFO, logger="stagefrontier")
    monkeypatch.setenv(DEADLINE_VARIABLE, "1")
    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    router = ProfilerRouter(store=store)
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig("local", out_dir=tmp_path, regression=None),
            router=router,
        )
    )
    with timer.step(), timer.stage("data.next_wait"):
        pass
    runtime = router._attached.runtime
    assert runtime is not None
    release = threading.Event()
    runtime._jobs.put(lambda: release.wait(60))
    timer.close()
    release.set()
    runtime._thread.join(60)
    busy = [r for r in caplog.records if "router thread was still busy" in r.getMessage()]
    assert len(busy) == 1 and busy[0].levelno == logging.WARNING, caplog.text
    assert "\n" not in busy[0].getMessage() and busy[0].exc_info is None
    assert not runtime._thread.is_alive()
