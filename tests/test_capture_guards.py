"""A rank's capture (``route.capture.RankCapture``) in one process, driven by a real StageTimer
and the real profiler: what it does when the application's own profiler comes and goes, when it
outgrows its memory budget, and when a request asks for more steps than the cap."""

from __future__ import annotations

import gzip
import json
import mmap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.route import trace_writer
from stagefrontier.route.capture import RankCapture
from stagefrontier.route.requests import MAX_CAPTURE_STEPS, CaptureRequest, CaptureStatus
from stagefrontier.route.trace_slice import load_for_reduction, slice_path

STAGE = "data.next_wait"


class Rank:
    """A timer with a capture attached as the router attaches it; the router thread's jobs
    (export, answers) run when ``drain`` is called."""

    def __init__(
        self, out_dir: Path, max_trace_bytes: int = 200 << 20, record_ops: bool = False
    ) -> None:
        collection = CollectConfig(mode="local", out_dir=out_dir, log=False)
        self.timer = StageTimer(config=TimerConfig(window=10, collection=collection))
        self.jobs: list[Callable[[], None]] = []
        self.answers: list[CaptureStatus] = []
        self.capture = RankCapture(
            self.timer.instrumentation,
            out_dir=str(out_dir),
            with_stack=False,
            max_trace_bytes=max_trace_bytes,
            record_ops=record_ops,
            submit=self.jobs.append,
            answer=self.answers.append,
        )
        self.timer._router = SimpleNamespace(
            on_step=self.capture.on_step,
            on_step_started=self.capture.on_step_started,
            on_step_end=self.capture.on_step_end,
            on_pause=self.capture.on_pause,
            close=lambda join_s, process_ends=False: self.capture.finish(self.timer._step_index),
        )

    def arm(self, steps: int) -> CaptureRequest:
        first = self.timer._step_index + 1
        request = CaptureRequest(f"t{len(self.answers)}", (0,), first, steps)
        self.capture.arm(request)
        return request

    def run(self, steps: int, before: Callable[[int], None] = lambda step: None) -> None:
        model = torch.nn.Linear(8, 8)
        for _ in range(steps):
            before(self.timer._step_index)
            with self.timer.step(), self.timer.stage(STAGE):
                model(torch.randn(4, 8)).sum().backward()

    def drain(self) -> list[CaptureStatus]:
        while self.jobs:
            self.jobs.pop(0)()
        return self.answers


def test_a_profiler_the_application_starts_and_stops_inside_a_capture(tmp_path: Path) -> None:
    """The application profiles one step inside the capture: its trace is whole, the capture
    is abandoned without stopping anything, and the next capture works."""
    rank = Rank(tmp_path)
    request = rank.arm(steps=6)

    def profile_one_step(step: int) -> None:
        if step == request.first_step + 2:
            with torch.profiler.profile() as user:
                torch.randn(16, 16).sum()
            user.export_chrome_trace(str(tmp_path / "user.json"))

    rank.run(10, profile_one_step)
    (answer,) = rank.drain()
    assert answer.state == "skipped"
    assert answer.reason.startswith("the application started its own profiler during the capture")
    assert json.loads((tmp_path / "user.json").read_text())["traceEvents"]
    assert not torch.autograd.profiler._is_profiler_enabled
    again = rank.arm(steps=2)
    rank.run(4)
    rank.timer.close()
    second = rank.drain()[1]
    assert second.state == "captured" and second.id == again.id, second
    assert Path(second.path).exists()


def test_a_capture_stops_once_the_process_outgrew_its_budget(tmp_path: Path) -> None:
    """Before: only the exported file was checked, after the profiler had held every event of
    every step in memory. Now a capture whose process grows past max_trace_mb stops there.

    The growth is a fresh anonymous mapping with every page written: resident and new by
    construction (a 16 MiB ``bytes`` could reuse heap that an earlier test freed but the
    allocator kept, and the process did not grow: the capture then ran all 20 steps). The
    first profiled step maps megabytes of the profiler's code in (file pages, not counted:
    counted, they stopped the capture before its first step)."""
    rank = Rank(tmp_path, max_trace_bytes=4 << 20)
    request = rank.arm(steps=20)
    kept: list[mmap.mmap] = []

    def grow(step: int) -> None:
        if step == request.first_step + 3:
            pages = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            for offset in range(0, len(pages), mmap.PAGESIZE):
                pages[offset] = 1  # every page written: resident
            kept.append(pages)

    rank.run(25, grow)
    rank.timer.close()
    (answer,) = rank.drain()
    assert answer.state == "captured", answer
    assert answer.last_step == request.first_step + 2 < request.last_step
    assert "over the 4 MiB budget (max_trace_mb)" in answer.reason
    assert not rank.timer._capture
    kept[0].close()


def test_a_request_for_more_steps_than_the_cap_is_capped_on_the_rank(tmp_path: Path) -> None:
    """A request written into the store by hand, past every check: the rank caps it."""
    rank = Rank(tmp_path)
    request = rank.arm(steps=10**6)
    rank.run(MAX_CAPTURE_STEPS + 10)
    (answer,) = rank.drain()
    assert answer.state == "captured", answer
    assert answer.last_step == request.first_step + MAX_CAPTURE_STEPS - 1
    assert answer.reason == f"1000000 steps asked: capped at {MAX_CAPTURE_STEPS} steps"
    rank.timer.close()


def test_a_pause_ends_a_running_capture_and_skips_one_not_started(tmp_path: Path) -> None:
    rank = Rank(tmp_path)
    request = rank.arm(steps=6)

    def pause(step: int) -> None:
        if step == request.first_step + 2:
            rank.timer.pause()

    rank.run(5, pause)
    (answer,) = rank.drain()
    assert answer.state == "captured" and answer.last_step == request.first_step + 1
    assert answer.reason.startswith(f"the timer was paused at step {request.first_step + 2}")
    waiting = rank.arm(steps=3)
    rank.run(3)  # paused through the request's first step
    rank.timer.close()
    skipped = rank.drain()[1]
    assert skipped.id == waiting.id and skipped.state == "skipped"
    assert skipped.reason == f"the timer on rank 0 was paused at step {waiting.first_step}"


def test_the_sessions_json_is_written_off_the_training_thread(tmp_path: Path) -> None:
    """Before: the stopped session's JSON (Kineto's writer, holding the GIL) was written on the
    training thread in the step after the capture. Now that step only stops the session: the
    JSON is the router thread's job (handed over as the next step starts, once the step after
    has ended: ``test_router_trust`` shows where it is written), and no capture starts on the
    rank until it is done."""
    rank = Rank(tmp_path)
    request = rank.arm(steps=2)
    rank.run(4)  # the lead-in, the two captured steps and the step after: the session stopped
    assert not rank.jobs and rank.timer._capture  # held until the next step's start
    folder = tmp_path / "incidents" / request.id
    assert not folder.exists() or not any(folder.iterdir())  # nothing written yet
    waiting = rank.arm(steps=2)  # the next step hands the export over; it is not done yet
    rank.run(3)
    answer, skipped = rank.drain()
    assert answer.state == "captured" and answer.id == request.id, answer
    assert Path(answer.path).exists() and answer.export_cpu_s > 0
    trace = Path(answer.path)  # and beside it its slice for the reduction (``trace_slice``)
    assert sorted(p.name for p in folder.iterdir()) == sorted([trace.name, slice_path(trace).name])
    assert skipped.id == waiting.id and skipped.state == "skipped"
    assert skipped.reason == (
        "rank 0 is still writing the trace of its last capture (a writer may take up to 120 s)"
    )
    again = rank.arm(steps=2)  # written: the next capture runs
    rank.run(4)
    rank.timer.close()
    assert rank.drain()[2].id == again.id and rank.answers[2].state == "captured"


def test_a_trace_written_on_the_router_thread_gets_no_slice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that may not fork (here every process counts as too large: a real one over
    ``MAX_FORK_BYTES`` of anonymous memory, common in training) writes its trace on the router
    thread. Before, that write also cut the trace's slice there, parsing the trace under the
    rank's GIL; now the slice is a forked writer's only: the trace is kept alone, and rank 0's
    reduction parses it, as before slices."""
    monkeypatch.setattr(trace_writer, "MAX_FORK_BYTES", -1)
    rank = Rank(tmp_path)
    request = rank.arm(steps=2)
    rank.run(4)
    rank.timer.close()
    (answer,) = rank.drain()
    assert answer.state == "captured" and answer.id == request.id, answer
    trace = Path(answer.path)
    assert [p.name for p in trace.parent.iterdir()] == [trace.name]
    steps = range(answer.first_step, answer.last_step + 1)
    assert load_for_reduction(trace, STAGE, steps)[1]  # read from the trace itself


def test_a_process_ending_by_a_signal_writes_no_held_trace(tmp_path: Path) -> None:
    """SIGTERM (``drop``) after a capture stopped, its trace held for the next step's start:
    the export is discarded, not handed to the router thread (whose writer, a fork, must not
    start while the process ends), and the capture is answered skipped with the reason."""
    rank = Rank(tmp_path)
    request = rank.arm(steps=2)
    rank.run(4)  # the lead-in, the two captured steps and the step after: the session stopped
    assert not rank.jobs and rank.timer._capture  # held until the next step's start
    rank.capture.drop("rank 0's process was ended by SIGTERM during the capture")
    (answer,) = rank.drain()
    assert answer.id == request.id and answer.state == "skipped", answer
    assert answer.reason == (
        "rank 0's process was ended by SIGTERM during the capture: its trace was not written"
    )
    folder = tmp_path / "incidents" / request.id
    assert not folder.exists() or not any(folder.iterdir())  # nothing was written


def _captured_names(rank: Rank, steps: int) -> tuple[CaptureRequest, Any, list[dict[str, Any]]]:
    """Arm a capture of ``steps`` steps, run it and its stop, export it: the request, the
    stopped session and the trace's events."""
    sessions: list[object] = []
    new_session = rank.capture._new_session

    def noted() -> object:
        sessions.append(new_session())
        return sessions[-1]

    rank.capture._new_session = noted  # type: ignore[method-assign]
    request = rank.arm(steps=steps)
    rank.run(steps + 2)  # the lead-in, the captured steps and the step after: the session stopped
    (session,) = sessions
    rank.timer.close()  # no step follows: the trace's export is handed over
    answer = rank.drain()[0]
    assert answer.state == "captured" and answer.id == request.id, answer
    with gzip.open(answer.path, "rt") as trace:
        return request, session, json.load(trace)["traceEvents"]


def test_the_stop_on_the_training_thread_skips_the_sessions_post_processing(
    tmp_path: Path,
) -> None:
    """Before: the profiler's stop on the training thread also turned every recorded op into
    a Python-visible event, which a capture never reads (only the trace is exported, on the
    router thread). Now the session is started trace-only: the stopped session holds no such
    events, and the trace still holds every op (``record_ops`` on) and the step's ranges."""
    request, session, events = _captured_names(Rank(tmp_path, record_ops=True), steps=2)
    assert session.profiler.kineto_results.events() == []
    names = [event.get("name", "") for event in events]
    assert "aten::addmm" in names and STAGE in names
    assert {f"stagefrontier.step#{request.first_step + i}" for i in range(2)} <= set(names)


def test_the_default_capture_records_the_ranges_and_no_operator(tmp_path: Path) -> None:
    """Before: every capture recorded each operator (about 2,000 a step of the demo's model),
    and the profiler's stop on the training thread processed each one (1.8 µs apiece: more
    than a step for the router's 6 steps). Now, unless ``record_ops``, the session records
    the ``record_function`` ranges only: the steps' and the stage's ranges are in the trace,
    no operator is."""
    request, session, events = _captured_names(Rank(tmp_path), steps=2)
    assert session.profiler.kineto_results.events() == []
    names = {event.get("name", "") for event in events}
    assert STAGE in names
    assert {f"stagefrontier.step#{request.first_step + i}" for i in range(2)} <= names
    assert [e["name"] for e in events if e.get("cat") == "cpu_op"] == []
    assert not any(name.startswith("aten::") for name in names), sorted(names)
