"""A router that a busy job can trust, on real Gloo ranks around the job's real TCPStore (one
3-rank job with two manual captures, see ``router_trust_support``): no single store read turns a
rank's router off (the request key deleted while a rank reads it; reads that fail for a while),
no capture is requested whose suspect is its own reference,
and a capture stops its profiler a step at a time and states what it cost each rank's training
thread. Also ``read_key`` on each kind of c10d store."""

from __future__ import annotations

import gzip
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

from rank_support import START_METHOD
from router_trust_support import (
    CAPTURES,
    FLAKY_READS,
    LOG_FILE,
    SCHEDULE_FILE,
    WRITERS_FILE,
    RaceJob,
    run_rank,
)
from stagefrontier.demo.launch import run_ranks
from stagefrontier.render.incident import summary_line
from stagefrontier.route import list_incidents
from stagefrontier.route.capture import LEAD_IN_STEPS
from stagefrontier.route.requests import REQUEST_KEY, RequestChannel, read_key
from trace_support import settled_incidents

RANKS = 3
FIGURES_WAIT_S = 180.0
"""How long the test waits for the drawing process (it starts as the job ends)."""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> RaceJob:
    job = RaceJob(out_dir=str(tmp_path_factory.mktemp("race")), ranks=RANKS)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=400.0, start_method=START_METHOD)
    assert codes == dict.fromkeys(range(RANKS), 0), f"rank exit codes {codes}"
    return job


def _log(job: RaceJob, rank: int) -> str:
    return Path(job.out_dir, LOG_FILE.format(rank=rank)).read_text(encoding="utf-8")


def _schedule(job: RaceJob, rank: int) -> dict[str, Any]:
    path = Path(job.out_dir, SCHEDULE_FILE.format(rank=rank))
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_a_request_deleted_while_a_rank_reads_it_leaves_its_router_on(job: RaceJob) -> None:
    """Before: the read was a ``check`` then a ``get``; rank 0 deleted the key between them (the
    first incident closed), the ``get`` waited the store's 30 s timeout, and rank 1 logged
    "router store unavailable, router off" and never answered the second capture."""
    assert _schedule(job, 1)["held"] == 1  # the schedule ran: the key went during the read
    incidents = sorted(settled_incidents(job.out_dir), key=lambda i: i["id"])
    assert len(incidents) == CAPTURES
    for incident in incidents:
        assert incident["captured"], incident["reasons"]
        assert incident["ranks"] == list(range(RANKS))
    log = _log(job, 1)
    assert "router off" not in log and "WARNING" not in log, log


def test_a_capture_whose_suspect_is_its_own_reference_is_never_requested(job: RaceJob) -> None:
    """Rank 0's coordinator in the running job is handed a regression's plan naming rank 1 as
    both suspect and reference: it opens no incident, writes no request for any rank to read,
    and says why in one line. Before the refusal it wrote a request for rank 1 and opened an
    incident whose op diff compared the rank with itself."""
    refusal = _schedule(job, 0)["refusal"]
    assert refusal["opened"] is False, refusal
    assert refusal["captures_before"] == refusal["captures_after"] == CAPTURES, refusal
    # the last capture's request, of every rank, may not be deleted yet; none is for rank 1 alone
    assert refusal["request_ranks"] in (None, list(range(RANKS))), refusal
    assert "suspect rank 1 would be its own reference" in _log(job, 0)
    assert len(list_incidents(job.out_dir)) == CAPTURES


def test_failed_reads_back_off_and_are_said_once(job: RaceJob) -> None:
    """Before: the first failed read turned rank 2's router off for the rest of the run. Now
    it reads again later, says so in one line, and answers the next capture."""
    assert _schedule(job, 2)["raised"] == FLAKY_READS
    log = _log(job, 2)
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, log
    assert "reading the capture request failed" in warnings[0]
    assert "backing off" in warnings[0]
    assert f"injected store failure 1 of {FLAKY_READS}" in warnings[0]
    assert f"readable again after {FLAKY_READS} failed read(s)" in log
    second = max(settled_incidents(job.out_dir), key=lambda i: i["id"])
    assert second["captured"] and 2 in second["ranks"], second["reasons"]


def test_a_capture_is_one_profiler_session_whose_trace_holds_every_captured_step(
    job: RaceJob,
) -> None:
    """A capture starts and stops the profiler once on each rank (a session a step, stopped and
    restarted at every step's start, lost a rank to SIGSEGV on a loaded machine), and the rank's
    one trace file holds every captured step, its lead-in included, with no part left behind."""
    for rank in range(RANKS):
        assert _schedule(job, rank)["sessions"] == CAPTURES
    for incident in settled_incidents(job.out_dir):
        folder = Path(job.out_dir, "incidents", incident["id"])
        assert sorted(p.name for p in folder.glob("*.tmp")) == []  # no part left behind
        first, last = incident["steps"]
        for rank in range(RANKS):
            with gzip.open(folder / f"rank{rank}.pt.trace.json.gz", "rt") as handle:
                events = json.load(handle)["traceEvents"]
            ranges = {e["name"] for e in events if e["name"].startswith("stagefrontier.step#")}
            steps = {f"stagefrontier.step#{n}" for n in range(first - LEAD_IN_STEPS, last + 1)}
            assert ranges == steps, (rank, sorted(ranges))


def test_a_trace_is_written_by_another_process_after_the_step_after_the_capture(
    job: RaceJob,
) -> None:
    """Before: the router thread wrote the session's JSON (Kineto's writer holds the GIL
    throughout) and built the sampled stacks' events in the rank's own process, during the
    step after the capture, whose Python waited for both. Now a forked child writes the trace,
    forked only once the step after the capture has ended."""
    captured = sorted(settled_incidents(job.out_dir), key=lambda i: i["id"])
    for rank in range(RANKS):
        lines = Path(job.out_dir, WRITERS_FILE.format(rank=rank)).read_text().splitlines()
        writers = [tuple(map(int, line.split())) for line in lines]
        assert len(writers) == len(captured) == CAPTURES, (rank, writers)
        for (pid, step), incident in zip(writers, captured, strict=True):
            assert pid != _schedule(job, rank)["pid"], (rank, writers)
            assert step >= incident["steps"][1] + 2, (rank, step, incident["steps"])


def test_the_incident_line_states_the_captures_cost_on_every_training_thread(
    job: RaceJob,
) -> None:
    """Before: the line gave only the router threads' CPU, while the window line showed the
    capture's (larger) time on the training thread. Now each captured rank's answer carries the
    capture's time on its training thread, and the line states it for every rank."""
    for incident in settled_incidents(job.out_dir):
        spent = incident["training_thread_s"]
        assert sorted(spent) == [str(r) for r in range(RANKS)]
        assert all(value > 0 for value in spent.values())
        line = summary_line(incident)
        assert "on rank 0's training thread" in line, line
        for rank in range(1, RANKS):
            assert f"ms on rank {rank}'s" in line, line
        assert "of CPU off the training threads (trace writers: " in line, line


def test_the_incident_line_states_the_jobs_cost_of_the_capture_in_two_figures(
    job: RaceJob,
) -> None:
    """The line states what the capture cost the job in its two measures, each summed over
    the ranks: the captured ranks' training-thread time (wall time) and the router threads'
    CPU (each rank's trace export and rank 0's reduction). Before, it added the two into one
    "s in all", a sum of wall and CPU seconds."""
    for incident in settled_incidents(job.out_dir):
        router = incident["router_cpu_s"]
        assert sorted(router["export"]) == [str(r) for r in range(RANKS)], router
        training_s = sum(incident["training_thread_s"].values())
        cpu_s = sum(router["export"].values()) + router["reduction"]
        line = summary_line(incident)
        assert "in all" not in line, line
        assert f"({training_s:.2f} s of training-thread time), and {cpu_s:.2f} s of CPU" in line


def test_a_capture_without_a_stage_names_the_stage_its_lead_was_judged_in(job: RaceJob) -> None:
    """Before: a manual capture names no stage, and its unconfirmed verdict read "rank 0's lead
    over rank 1 in None is under the material share of the step". The lead is judged in the
    trace's top stage, and the verdict names it."""
    incidents = settled_incidents(job.out_dir)
    # the first capture is asked for at the job's first steps, before any window is analyzed
    assert any(incident["stage"] is None for incident in incidents), incidents
    for incident in incidents:
        line = summary_line(incident)
        assert " in None " not in line, line
        if "is under the material share of the step" in line:
            judged = incident["stage"] or max(
                incident["trace_shares"], key=incident["trace_shares"].__getitem__
            )
            assert f"in {judged} is under" in line, line


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_the_incident_figures_are_drawn_after_the_run_by_a_process_of_their_own(
    job: RaceJob,
) -> None:
    """Before: rank 0 drew every incident's figures as its timer closed (importing matplotlib,
    reading the run's windows: seconds under load), and every rank's exit waited for it at the
    job's last collective. Now no rank imports matplotlib; a process of their own adds the
    figures to each page after the run."""
    for rank in range(RANKS):
        assert not _schedule(job, rank)["matplotlib"], rank
    pages = [
        Path(job.out_dir, "incidents", incident["id"], "incident.html")
        for incident in settled_incidents(job.out_dir)
    ]
    end = time.monotonic() + FIGURES_WAIT_S
    while time.monotonic() < end and not all(_drawn(page) for page in pages):
        time.sleep(0.5)
    assert all(_drawn(page) for page in pages), [page.read_text()[-400:] for page in pages]


def _drawn(page: Path) -> bool:
    return page.read_text(encoding="utf-8").count("data:image/png;base64,") == 2


def test_read_key_reads_a_value_or_none_without_waiting_on_every_store(tmp_path: Path) -> None:
    """``read_key`` is one request that never waits for the key: on a TCP, a file and a hash
    store, through a prefix, a key absent, present, then deleted."""
    import torch.distributed as dist

    from stagefrontier.collect.node_store import loopback_store

    stores = {
        "tcp": loopback_store(world_size=1, timeout_s=2.0),
        "file": dist.FileStore(str(tmp_path / "store"), 1),
        "hash": dist.HashStore(),
    }
    for kind, store in stores.items():
        channel = RequestChannel(prefix="p", open_raw=lambda store=store: store)
        assert channel.read(REQUEST_KEY) is None, kind
        channel.write(REQUEST_KEY, b'{"id": "w1"}')
        assert channel.read(REQUEST_KEY) == b'{"id": "w1"}', kind
        channel.delete(REQUEST_KEY)
        assert channel.read(REQUEST_KEY) is None, kind
        assert not channel.conn().check([REQUEST_KEY]), kind  # the read wrote nothing
        assert read_key(store, "never/written") is None, kind
