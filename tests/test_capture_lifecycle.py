"""A capture's lifecycle on real Gloo ranks: the application's own profiler, a capture asked for
a million steps, a pause in the middle of a capture, and the profiler's cold start. One 2-rank
job runs the three captures in turn (see ``capture_support``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from capture_support import (
    CRASH_FILE,
    PAUSED_STEPS,
    USER_TRACE,
    WARM_FILE,
    CaptureJob,
    run_rank,
)
from stagefrontier.demo.launch import read_windows, run_ranks
from stagefrontier.route.requests import MAX_CAPTURE_STEPS
from trace_support import settled_incidents

PHASES = ("foreign", "capped", "paused")
RANKS = 2


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> CaptureJob:
    out = tmp_path_factory.mktemp("lifecycle")
    job = CaptureJob(out_dir=str(out), phases=PHASES, ranks=RANKS)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=300.0)
    crash = [Path(out, CRASH_FILE.format(rank=r)) for r in range(RANKS)]
    # no file: the rank died before its first line (its stderr above says why)
    stacks = {r: path.read_text() if path.exists() else "no file" for r, path in enumerate(crash)}
    assert codes == {0: 0, 1: 0}, f"rank exit codes {codes} (-11: SIGSEGV); stacks: {stacks}"
    return job


def _incident(job: CaptureJob, phase: str) -> dict[str, Any]:
    suffix = f"-manual{PHASES.index(phase)}"
    (incident,) = [i for i in settled_incidents(job.out_dir) if i["id"].endswith(suffix)]
    return incident


def _traces(job: CaptureJob, incident: dict[str, Any]) -> list[Path]:
    return sorted((Path(job.out_dir) / "incidents" / incident["id"]).glob("*.pt.trace.json*"))


def test_a_profiler_the_application_starts_during_a_capture_is_left_alone(job: CaptureJob) -> None:
    """Before: the capture's stop ended the application's session and both ranks died in the
    application's export_chrome_trace (SIGSEGV). Now the capture is abandoned at the next step,
    the application's profiler runs on and exports its own trace."""
    for rank in range(RANKS):
        trace = json.loads(Path(job.out_dir, USER_TRACE.format(rank=rank)).read_text())
        names = {event.get("name", "") for event in trace["traceEvents"]}
        assert any(name.startswith("aten::") for name in names), sorted(names)[:20]
    incident = _incident(job, "foreign")
    assert not incident["captured"] and _traces(job, incident) == []
    for rank in range(RANKS):
        assert any(
            r.startswith(f"rank {rank} skipped: the application started its own profiler")
            and "abandoned" in r
            for r in incident["reasons"]
        ), incident["reasons"]


def test_a_request_for_a_million_steps_is_capped(job: CaptureJob) -> None:
    """Before: a hand-written request for 10**6 steps profiled the rest of the run."""
    incident = _incident(job, "capped")
    first, last = incident["steps"]
    assert last - first + 1 == MAX_CAPTURE_STEPS
    assert incident["captured"], incident["reasons"]
    assert any(f"capped at {MAX_CAPTURE_STEPS} steps" in r for r in incident["reasons"])


def test_a_pause_during_a_capture_ends_it_with_the_steps_taken(job: CaptureJob) -> None:
    """Before: the profiler kept running through the paused steps and the trace spanned them."""
    incident = _incident(job, "paused")
    first, last = incident["steps"]
    assert last == first + 1  # paused before the capture's third step
    assert incident["captured"], incident["reasons"]
    for rank in range(RANKS):
        assert f"rank {rank} captured only up to step {last}" in incident["reasons"]
        assert any(
            r.startswith(f"rank {rank}: the timer was paused at step {last + 1}")
            for r in incident["reasons"]
        ), incident["reasons"]
    assert PAUSED_STEPS > 0


def test_a_capture_is_one_profiler_session(job: CaptureJob) -> None:
    """Before: a session a step, stopped and started again at each captured step's start; beside
    two CPU burners a rank died of SIGSEGV in 2 of 4 runs of this job, in the capped phase (100
    sessions). Now a capture starts the profiler once, however many steps it covers (the foreign
    phase is left out: the application's own session counts there)."""
    for rank in range(RANKS):
        record = json.loads(Path(job.out_dir, WARM_FILE.format(rank=rank)).read_text())
        sessions = record["sessions"]
        assert (sessions["capped"], sessions["paused"]) == (1, 1), record


def test_the_profiler_is_warm_before_the_first_capture_and_its_cost_is_counted(
    job: CaptureJob,
) -> None:
    """Before: the first capture's profiler start imported torch._inductor on the training
    thread (about 1.3 s, in no step and no self_cost). Now StageTimer imports it where the
    router is attached, and what a capture still costs the training thread is in self_cost."""
    for rank in range(RANKS):
        warm = json.loads(Path(job.out_dir, WARM_FILE.format(rank=rank)).read_text())
        assert warm["inductor_imported_before"] is True, warm
    costs = [w["self_cost"]["capture_s"]["max"] for w in read_windows(job.out_dir)]
    assert any(cost > 0 for cost in costs), costs


def test_a_capture_samples_the_training_threads_stack_without_the_python_tracer(
    job: CaptureJob,
) -> None:
    """Before: the profiler ran its Python tracer (``with_stack``), whose stop converted every
    Python call on the training thread (about a second the step after the capture carried) and
    which hooks every thread. Now the profiler records the ``record_function`` ranges only (no
    operator either: ``record_ops`` is off), and the training thread's sampled stack gives the
    trace its Python events: the job's step function is named, and no builtin call is (the
    tracer records those; a sample of Python frames cannot)."""
    traces = [t for phase in ("capped", "paused") for t in _traces(job, _incident(job, phase))]
    assert len(traces) == 2 * RANKS
    for trace in traces:
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        python = {e["name"] for e in events if e.get("cat") == "python_function"}
        assert any(name.endswith("): train_step") for name in python), sorted(python)[:20]
        assert not [name for name in python if name.startswith("<built-in")], sorted(python)[:20]
        assert any(e.get("name", "").startswith("stagefrontier.step#") for e in events)
        assert not [e["name"] for e in events if e.get("cat") == "cpu_op"]
