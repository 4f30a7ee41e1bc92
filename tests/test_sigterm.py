"""A SIGTERM (torchrun ending a job after a failed rank, Slurm's time limit, a preemption) closes
every open timer before the process ends (issue 37, item 4): on by default, passed on to the
handler that was there before, and safe while a profiler runs.

Each case is a real process that signals itself at a known step and then keeps training: the
signal, not the script, must end it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.environment import SIGTERM
from trace_support import manual_incident

TRAIN = textwrap.dedent("""\
    import logging, os, signal, sys, time

    logging.basicConfig(format="%(message)s", level=logging.INFO)
    logging.getLogger("stagefrontier").setLevel(logging.INFO)
    out, case = sys.argv[1], sys.argv[2]
    if case == "chained":  # the application's own handler, installed before the timer
        def own(signum, frame):
            print("the application's handler ran", flush=True)
            os._exit(3)
        signal.signal(signal.SIGTERM, own)
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    router = None
    if case == "capturing":
        from datetime import timedelta
        import torch.distributed as dist

        store = dist.TCPStore(
            "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30),
            wait_for_workers=False,
        )
        router = ProfilerRouter(steps=40, store=store, max_captures=10)
    collect = CollectConfig("local", out_dir=out, regression=None, log=False)
    timer = StageTimer(
        config=TimerConfig(stages=("data.next_wait",), window=5, collection=collect, router=router)
    )

    pace = 0.02 if case == "capturing" else 0.002  # the router's thread polls every 50 ms

    def step():
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(pace)

    for _ in range(12):
        step()
    if case == "capturing":  # SIGTERM three steps into a running capture
        capture = timer._router.capture
        coordinator = timer._router.coordinator
        asked = 0
        end = time.monotonic() + 120
        while capture._prof is None and time.monotonic() < end:
            if coordinator.open is None and coordinator.captures == asked:
                router.request_capture([0])  # again when a loaded machine let one go by
                asked += 1
            step()
        for _ in range(3):
            step()
        print("capturing:", capture._prof is not None, "asked:", asked, flush=True)
    if case == "profiled":  # the application's profiler, its Python tracer on
        import torch

        prof = torch.profiler.profile(with_stack=True)
        prof.start()
        for _ in range(4):
            torch.ones(8).sum()
            step()
    os.kill(os.getpid(), signal.SIGTERM)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        step()
    print("the signal did not end the process")
""")


def _signalled(folder: Path, case: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRAIN, str(folder), case],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != SIGTERM.name}, **env},
        timeout=240,
    )


def _windows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "windows.jsonl"
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _steps(folder: Path) -> list[tuple[int, int, int]]:
    return [(r["window"], r["first_step"], r["last_step"]) for r in _windows(folder)]


CLOSING = "stagefrontier: SIGTERM: closing 1 open timer(s) first"


def test_sigterm_writes_the_window_being_recorded_then_ends_the_process(tmp_path: Path) -> None:
    """Before: off unless ``STAGEFRONTIER_SIGTERM=1``: SIGTERM ended the process at once, and
    the last two steps (the window being recorded) were never written."""
    done = _signalled(tmp_path, "plain")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "did not end" not in done.stdout
    assert _steps(tmp_path) == [(0, 0, 4), (1, 5, 9), (2, 10, 11)]
    assert CLOSING in done.stderr
    assert "Traceback" not in done.stderr


def test_stagefrontier_sigterm_0_leaves_the_signal_alone(tmp_path: Path) -> None:
    done = _signalled(tmp_path, "plain", **{SIGTERM.name: "0"})
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert (2, 10, 11) not in _steps(tmp_path)
    assert CLOSING not in done.stderr


def test_the_handler_found_is_called_after_the_timers_close(tmp_path: Path) -> None:
    """Before: a handler the application installed first was left alone, and nothing of the
    window being recorded was written. Now the timer closes first, then that handler runs
    (here it ends the process with status 3)."""
    done = _signalled(tmp_path, "chained")
    assert done.returncode == 3, done.stderr
    assert "the application's handler ran" in done.stdout
    assert _steps(tmp_path)[-1] == (2, 10, 11)
    assert CLOSING in done.stderr


def test_a_sigterm_during_a_capture_drops_it_without_touching_the_profiler(
    tmp_path: Path,
) -> None:
    """Before: the handler closed the timer on the interrupted training thread, which stopped
    the running capture's profiler from inside a signal handler (the handler was made opt-in
    after a rank crashed with SIGSEGV in such a job). Now the close runs on a thread of its
    own while the handler waits: the capture is dropped with the reason, its session left to
    end with the process, and the windows are written."""
    pytest.importorskip("torch")
    done = _signalled(tmp_path, "capturing")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "capturing: True" in done.stdout, done.stdout
    assert _steps(tmp_path)[:3] == [(0, 0, 4), (1, 5, 9), (2, 10, 14)]
    last = int(done.stdout.split("asked:")[1]) - 1  # the request captured
    assert list((tmp_path / "incidents").glob(f"*-manual{last}")), done.stderr
    incident = json.loads((manual_incident(tmp_path, last) / "incident.json").read_text())
    assert not incident["captured"]
    assert "rank 0's process was ended by SIGTERM during the capture" in " ".join(
        incident["reasons"]
    )
    assert not list(manual_incident(tmp_path, last).glob("*.pt.trace.json*"))
    assert "Traceback" not in done.stderr


def test_a_sigterm_while_the_applications_profiler_traces_python_ends_the_process_cleanly(
    tmp_path: Path,
) -> None:
    """The application's own ``torch.profiler`` with ``with_stack=True`` (its Python tracer
    hooks every thread) runs as the signal comes: the timer closes (its collector on a thread
    of its own), and the process ends by the signal, not by SIGSEGV."""
    pytest.importorskip("torch")
    done = _signalled(tmp_path, "profiled")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert _steps(tmp_path) == [(0, 0, 4), (1, 5, 9), (2, 10, 14), (3, 15, 15)]
    assert CLOSING in done.stderr
    assert "Traceback" not in done.stderr
