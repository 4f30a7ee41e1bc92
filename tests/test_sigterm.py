"""A SIGTERM (torchrun ending a job after a failed rank, Slurm's time limit, a preemption) closes
every open timer before the process ends (issue 37, item 4): on by default, passed on to the
handler that was there before, and safe while a profiler runs.

Each case is a real process that signals itself at a known step and then keeps training: the
signal, not the script, must end it. The last case is a real 2-rank Gloo job whose rank 0 the
test signals while it waits in a collective.
"""

from __future__ import annotations

import json
import linecache
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.environment import SIGTERM
from trace_support import manual_incident

TRAIN = textwrap.dedent("""\
    import ctypes, logging, os, signal, sys, threading, time

    logging.basicConfig(format="%(message)s", level=logging.INFO)
    logging.getLogger("stagefrontier").setLevel(logging.INFO)
    out, case = sys.argv[1], sys.argv[2]
    MUTEX = ctypes.create_string_buffer(64)  # all zeros: PTHREAD_MUTEX_INITIALIZER in glibc


    def waiting_in(tid, mutex):  # thread tid waits in the futex of mutex (its first word)
        try:
            with open(f"/proc/{tid}/task/{tid}/syscall") as f:
                fields = f.read().split()
        except OSError:
            return False
        return len(fields) > 1 and int(fields[1], 16) == ctypes.addressof(mutex)


    def wait_in_c(tid):  # until thread tid (a process's main thread) waits in its C lock
        end = time.monotonic() + 60
        while time.monotonic() < end and not waiting_in(tid, MUTEX):
            time.sleep(0.01)


    def hang_in_c():  # lock a locked mutex: the calling thread stays in this C call for good
        libc = ctypes.CDLL(None)
        libc.pthread_mutex_lock(ctypes.byref(MUTEX))
        if case == "stuck":
            def signal_when_waiting():
                wait_in_c(os.getpid())
                os.kill(os.getpid(), signal.SIGTERM)
            threading.Thread(target=signal_when_waiting, daemon=True).start()
        libc.pthread_mutex_lock(ctypes.byref(MUTEX))


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
    if case == "stuck":  # the main thread waits in one C call that never returns
        hang_in_c()
        print("the C call returned", flush=True)
    if case in ("forked", "forked-timer"):  # the handler installed, then a child forked
        child = os.fork()
        if child == 0:
            if case == "forked":  # a DataLoader worker hung in C
                hang_in_c()
            else:  # a child that trains with a timer of its own, then is signalled
                own = StageTimer(config=TimerConfig(stages=("data.next_wait",), window=5,
                    collection=CollectConfig("local", out_dir=os.path.join(out, "child"),
                    regression=None, log=False)))
                timer = own
                for _ in range(12):
                    step()
                os.kill(os.getpid(), signal.SIGTERM)
                end = time.monotonic() + 60
                while time.monotonic() < end:
                    step()
            os._exit(0)
        if case == "forked":
            wait_in_c(child)
            os.kill(child, signal.SIGTERM)
        status, end = None, time.monotonic() + 60
        while status is None and time.monotonic() < end:
            pid, status = os.waitpid(child, os.WNOHANG)
            if not pid:
                status = time.sleep(0.05)
        if status is None:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            print("the child outlived its SIGTERM", flush=True)
        elif os.WIFSIGNALED(status):
            print("the child ended by signal", os.WTERMSIG(status), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        step()
    print("the signal did not end the process")
""")


def _signalled(
    folder: Path, case: str, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRAIN, str(folder), case],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if k != SIGTERM.name}, **env},
        timeout=timeout,
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


def test_a_main_thread_stuck_in_a_c_call_still_ends_by_sigterm(tmp_path: Path) -> None:
    """Before: Python runs a handler only between bytecodes, so a main thread waiting in one C
    call (here a locked mutex; in a job, a collective waiting for a dead peer) ignored SIGTERM
    until the launcher's SIGKILL. Now a watcher thread woken by the signal's wakeup byte closes
    the timer and ends the process by SIGTERM (it would be by the close deadline and a second;
    a minute here only tells "ended" from "stuck")."""
    try:
        done = _signalled(tmp_path, "stuck", timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not end a process stuck in a C call") from None
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "the C call returned" not in done.stdout
    assert _steps(tmp_path) == [(0, 0, 4), (1, 5, 9), (2, 10, 11)]
    assert CLOSING in done.stderr
    assert "Traceback" not in done.stderr


def test_a_forked_worker_hung_in_c_ends_on_sigterm_and_the_parent_is_untouched(
    tmp_path: Path,
) -> None:
    """Before: a child forked after the handler was installed (a DataLoader worker) inherited
    it, so one hung in a C call ignored the ``terminate()`` of its loader. Now the child gets
    SIGTERM's default action back at the fork, and its signal does not reach the parent's
    watcher: the parent trains on and closes on its own SIGTERM."""
    done = _signalled(tmp_path, "forked")
    assert "the child ended by signal 15" in done.stdout, done.stdout + done.stderr
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert _steps(tmp_path) == [(0, 0, 4), (1, 5, 9), (2, 10, 11)]
    assert done.stderr.count(CLOSING) == 1, done.stderr


def test_a_child_forked_after_the_handler_closes_its_own_timer_on_sigterm(tmp_path: Path) -> None:
    """Before: a child forked after the handler was installed (``mp.start_processes`` with
    fork, Lightning's ``ddp_fork``) inherited the parent's handler and list of timers: the
    timer it built never installed one, and a SIGTERM ended it without writing its window
    being recorded. Now it installs its own and closes only its own timer."""
    done = _signalled(tmp_path, "forked-timer")
    assert "the child ended by signal 15" in done.stdout, done.stdout + done.stderr
    assert _steps(tmp_path / "child") == [(0, 0, 4), (1, 5, 9), (2, 10, 11)]
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert _steps(tmp_path) == [(0, 0, 4), (1, 5, 9), (2, 10, 11)]
    assert done.stderr.count(CLOSING) == 2, done.stderr


def test_a_close_during_a_window_hand_off_says_the_window_is_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: SIGTERM's close, on its own thread, read a hand-off the training thread had left
    half done: here the buffer already fresh and the window index moved on, but the steps not
    yet reset, so it wrote a window 1 of steps 5 to 9, all zeros. Now the hand-off is flagged
    while it runs and the close says that window is lost. The training thread runs the real
    hand-off and is held, by a trace function of its own, just before it resets the steps."""
    monkeypatch.setenv(SIGTERM.name, "0")  # no handler in the test's process
    collect = CollectConfig("local", out_dir=tmp_path, regression=None, log=False)
    timer = StageTimer(config=TimerConfig(stages=("data.next_wait",), window=5, collection=collect))
    held, release = threading.Event(), threading.Event()

    def hold_before_the_steps_reset(frame: FrameType, event: str, arg: object) -> Any:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        if event == "line" and line == "self._n = 0":
            held.set()
            release.wait(120)
        return hold_before_the_steps_reset

    def train() -> None:
        def trace(frame: FrameType, event: str, arg: object) -> Any:
            return hold_before_the_steps_reset if "hand_off" in frame.f_code.co_name else None

        sys.settrace(trace)
        for _ in range(5):
            with timer.step(), timer.stage("data.next_wait"):
                time.sleep(0.001)
        sys.settrace(None)

    training = threading.Thread(target=train)
    training.start()
    try:
        assert held.wait(120), "the training thread never reached its hand-off"
        with caplog.at_level(logging.WARNING, logger="stagefrontier"):
            timer._close(process_ends=True)
        assert _steps(tmp_path) == []
        assert "window being handed off as the process ends is lost" in caplog.text
    finally:
        release.set()
        training.join(120)


IN_THE_COLLECTIVE = "in-the-collective"
"""The marker rank 0 writes once its main thread is inside the all-reduce's C call."""
ENDED_BOUND_S = 60.0
"""Tells a rank that ended from one stuck until SIGKILL: the close deadline (30 s) and a second
are what an end by SIGTERM takes at most; the rest is for a loaded machine."""


def _main_thread_inside_the_all_reduce() -> bool:
    """Whether the main thread's innermost Python frame is ``all_reduce`` at its wait for the
    collective's end (``work.wait()``, where Gloo blocks): read holding the GIL, which that
    thread gave up inside the call, and a peer that never joins keeps it there. Not the line
    before, the call that starts the collective (``group.allreduce(...)``): it returns at once,
    and the GIL passes at the end of a call with the frame still on its line, so a frame seen
    there may be back in bytecode, where the signal runs Python's handler instead (4 runs of 30
    signalled it there)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None or frame.f_code.co_name != "all_reduce":
        return False
    return ".wait(" in linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def _say_when_inside_the_all_reduce(marker: Path) -> None:
    while not _main_thread_inside_the_all_reduce():
        time.sleep(0.01)
    marker.touch()


def _gloo_rank(rank: int, folder: str, port: int) -> None:
    """Rank 0 enters an all-reduce that rank 1, alive, never joins."""
    from rank_support import join_gloo, log_to_file

    out = Path(folder)
    log = out / f"rank{rank}.log"
    stderr = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(stderr, 2)  # a traceback lands there too
    os.close(stderr)
    log_to_file(log)
    join_gloo(rank, 2, port, timeout_s=300)
    import torch
    import torch.distributed as dist

    collect = CollectConfig("local", out_dir=out, regression=None, log=False)
    timer = StageTimer(config=TimerConfig(stages=("data.next_wait",), window=5, collection=collect))
    for _ in range(12):
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.002)
    if rank == 1:
        time.sleep(600)  # alive, never joining: ended by the test
        return
    watch = threading.Thread(
        target=_say_when_inside_the_all_reduce, args=(out / IN_THE_COLLECTIVE,), daemon=True
    )
    watch.start()
    dist.all_reduce(torch.ones(4))
    (out / "the-collective-returned").touch()


def test_a_rank_waiting_in_a_gloo_collective_ends_by_sigterm(tmp_path: Path) -> None:
    """The case the watcher is for, in a real job: rank 0 waits in an all-reduce that rank 1,
    alive, never joins (Gloo's wait, a C call), and a SIGTERM (a preemption, a launcher ending
    the job) comes once rank 0's main thread is inside that call. Before: rank 0 stayed in the
    collective until killed, its window being recorded lost. Now it writes that window and ends
    by SIGTERM (``STAGEFRONTIER_SIGTERM=0``: it ends at once, without the window). The signal
    is sent once the rank says its main thread is inside the call (its frame, read from another
    thread of the rank), never after a sleep: a rank still starting on a loaded machine is not
    taken for one that ignores the signal."""
    pytest.importorskip("torch")
    from rank_support import started_ranks

    with started_ranks([_gloo_rank, _gloo_rank], str(tmp_path)) as ranks:
        marker = tmp_path / IN_THE_COLLECTIVE
        deadline = time.monotonic() + 240
        while not marker.exists() and ranks[0].is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        log = tmp_path / "rank0.log"
        assert marker.exists(), f"rank 0 never reached its collective: {log.read_text()}"
        ranks[0].terminate()  # SIGTERM
        ranks[0].join(ENDED_BOUND_S)
        assert ranks[0].exitcode == -signal.SIGTERM, "SIGTERM did not end rank 0 in its collective"
        assert ranks[1].is_alive()  # the peer never joined: rank 0 was still waiting for it
    text = log.read_text()
    assert not (tmp_path / "the-collective-returned").exists()
    assert _steps(tmp_path / "rank-0") == [(0, 0, 4), (1, 5, 9), (2, 10, 11)], text
    assert "SIGTERM while the main thread is inside a C call" in text
    assert "Traceback" not in text
