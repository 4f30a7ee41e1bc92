"""A failure the library catches is one line in the user's log, with its reason and what the
run does instead, never a traceback: on the collector's analysis thread, on the router's thread
(its jobs keep running: a manual capture still opens its incident), in an incident's
confirmation. A repeat at every window or poll is said once. No module logs a traceback."""

from __future__ import annotations

import ast
import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier.analysis.gates import Gates
from stagefrontier.collect.base import BackgroundWorker
from stagefrontier.formats.incident import new_incident
from stagefrontier.route.confirm import LiveWindow
from stagefrontier.route.reduction import analyze_traces
from test_route_inputs import store  # noqa: F401  (the fixture: a loopback TCPStore)
from trace_support import settled_incidents

SRC = Path(__file__).resolve().parents[1] / "src" / "stagefrontier"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.levelno > logging.DEBUG and r.exc_info]
    assert not loud, [r.getMessage() for r in loud]


def test_no_module_logs_a_traceback() -> None:
    """Every ``except`` that logs says it through ``failures.say_failed``: no
    ``logger.exception`` and no ``exc_info`` at a level above DEBUG anywhere in the package."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            method = node.func.attr
            traced = any(k.arg == "exc_info" for k in node.keywords)
            if method == "exception" or (traced and method != "debug"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found


def test_the_analysis_thread_says_a_failing_window_once_and_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="stagefrontier")
    handled: list[int] = []
    done = threading.Event()

    def handle(item: int) -> None:
        if item < 3:
            raise ValueError(f"window {item} is\nmalformed")
        handled.append(item)
        done.set()

    def after_last() -> None:
        raise OSError(28, "No space left on device")

    worker = BackgroundWorker("stagefrontier-test", handle, 8, 30.0, after_last)
    for item in range(4):
        assert worker.offer(item)
    assert done.wait(30)
    worker.close()
    assert handled == [3]  # the windows after the failing ones are processed
    assert _warnings(caplog) == [
        "stagefrontier: background window processing failed (ValueError: window 0 is "
        "malformed); that window is lost, the next ones are processed",
        "stagefrontier: clean-up after the last window failed (OSError: [Errno 28] No space "
        "left on device); the run goes on",
    ]
    repeats = [r for r in caplog.records if "window 1 is malformed" in r.getMessage()]
    assert [r.levelno for r in repeats] == [logging.DEBUG]
    _no_traceback(caplog)


def test_an_unreadable_trace_leaves_the_incident_unconfirmed_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stagefrontier")
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": "not a list"}))
    stages = ("data.next_wait", "model.fwd_loss_cpu_wall")
    live = [LiveWindow(10, (0,), np.full((5, 1, 2), 0.01), stages)]
    incident = new_incident("w00001", "window")
    incident.update(steps=[10, 12], stage=stages[0], leader_rank=0, reference_rank=0)
    analyze_traces(incident, {0: str(trace)}, live, Gates(), tmp_path)
    assert incident["confirmed"] is None
    failed = [r for r in incident["reasons"] if r.startswith("confirmation failed: ")]
    assert len(failed) == 1 and "\n" not in failed[0], incident["reasons"]
    (line,) = [w for w in _warnings(caplog) if "confirming incident w00001" in w]
    assert line.endswith("; it stays unconfirmed"), line
    _no_traceback(caplog)


def test_a_failing_router_job_is_one_line_and_the_router_goes_on(
    tmp_path: Path,
    store: Any,  # noqa: F811  (the fixture imported above)
    caplog: pytest.LogCaptureFixture,
) -> None:
    from stagefrontier.route import list_incidents
    from test_route_inputs import job, train_until

    caplog.set_level(logging.INFO, logger="stagefrontier")
    timer = job(tmp_path, store)
    runtime = timer._router

    def broken() -> None:
        raise KeyError("route/request")

    try:
        for _ in range(3):
            runtime._jobs.put(broken)
        runtime.request_capture([0], 2, None)
        train_until(timer, lambda: bool(list_incidents(tmp_path)), then=5)
    finally:
        timer.close()
    assert [w for w in _warnings(caplog) if "router thread job" in w] == [
        "stagefrontier: a router thread job failed (KeyError: 'route/request'); the router goes on"
    ]
    (incident,) = settled_incidents(tmp_path)
    assert incident["trigger"] == "manual"
    _no_traceback(caplog)
