"""A stopped capture's trace written by a forked copy of the rank's process, off its GIL.

Two parts of writing a trace hold the GIL from start to end: Kineto's JSON writer (a C++ call
torch binds without releasing it) and turning the sampled Python stacks into events. On the
router thread they stalled the training thread's Python for their whole run: in the step after
the capture, beside two busy processes on two cores, 130 to 140 ms of that step's 335 ms on
each captured rank, and through the next collective every rank's step. A forked child has the
stopped session, the samples and the trace under way as the parent had them at the fork, and a
GIL of its own: it writes the whole trace (``make``) and says on a pipe where it is or why it
failed; the router thread waits for its exit in short sleeps, the GIL free. Once it has said where
the trace is, the child may do more work on it (``then``: the trace's slice for the reduction),
whose failure it says on the pipe too (``Written.note``): that work can no longer lose the trace,
even when the child is killed in the middle of it.

Forking copies the parent's page tables while holding its GIL (about 10 ms per GiB resident),
so a process over ``MAX_FORK_BYTES`` writes on the router thread, as does a platform without
``fork`` or a fork that fails; ``Written.apart`` says which ran. There only ``make`` runs: ``then``
is work worth doing off the rank's GIL only, so it is skipped. The child runs no signal
handler of the application's, no garbage collection (no finalizer of the parent's objects runs
twice) and never returns into the parent's code: it ends with ``os._exit``, flushing nothing it
inherited (its answer goes through the pipe only). A child that has not ended after
``WRITE_TIMEOUT_S`` is killed and the trace reported failed, with that reason; an answer the
child gave in full is trusted over how it ended (killed during ``then``, the trace stands and
the note gives the reason).

The child holds copies of every descriptor the parent had (its Gloo sockets, its store client, a
node leader's listening store): it must not outlive the parent. On Linux the kernel kills it when
the parent's thread that forked it ends (``PR_SET_PDEATHSIG``: a parent killed, even by SIGKILL
or the OOM killer, takes its writer with it), and the child sets its own alarm for a little
after that timeout (``ALARM_GRACE_S``), so it ends by itself where the parent is stopped or
stuck.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import math
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from ..render.escape import first_line

logger = logging.getLogger("stagefrontier")

MAX_FORK_BYTES = 4 << 30
"""A process with more anonymous memory resident than this writes its trace on the router
thread: its fork would hold the GIL for tens of milliseconds."""
WRITE_TIMEOUT_S = 120.0
"""The longest a child may take to write a trace before it is killed."""
ALARM_GRACE_S = 30.0
"""The child's own alarm rings this long after its parent's timeout: the parent's kill, which
names the timeout, comes first; the alarm ends a child whose parent is stopped or stuck."""
POLL_FIRST_S = 0.002
POLL_MOST_S = 0.05
"""The router thread looks for the child's exit first after this, then at growing intervals up
to ``POLL_MOST_S`` (each look is a ``waitpid`` call: the waits between are GIL-free sleeps)."""
MESSAGE_BYTES = 1 << 16
PR_SET_PDEATHSIG = 1
"""``prctl``'s option (linux/prctl.h): the signal the kernel sends a process when its parent
(the thread that forked it) ends."""


@dataclass(frozen=True)
class Written:
    """Where the trace is (None when it failed), why it failed, the CPU seconds its writing
    took (the child's, or the router thread's), whether a child wrote it, and why the child's
    further work on the trace (``then``) did not finish: empty when it did, or did not run."""

    path: Path | None
    error: str
    cpu_s: float
    apart: bool
    note: str = ""


class _Message(msgspec.Struct):
    path: str
    error: str


def export_failure(exc: BaseException) -> str:
    """Why a trace's write failed, in one line (the system's words for an OSError)."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else first_line(exc)


def anonymous_resident_bytes() -> int | None:
    """This process's resident anonymous memory, its heap (Linux ``/proc``: resident less
    shared); None where it cannot be read. The file pages of its libraries are left out: the
    kernel maps them in as code first runs (the first profiled step's, megabytes of them) and
    may evict them under memory pressure, and neither is memory the profiler holds."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            fields = statm.read().split()
        return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def write_trace(
    make: Callable[[], Path],
    *,
    resident_bytes: int | None,
    timeout_s: float = WRITE_TIMEOUT_S,
    then: Callable[[Path], str] | None = None,
) -> Written:
    """Run ``make`` (it writes the trace and returns its path, or raises) in a forked child when
    this process may fork cheaply (``resident_bytes`` at most ``MAX_FORK_BYTES``), else here.
    In a child only, once it has answered where the trace is: ``then`` on that path (why it
    failed, in one line; empty when it worked), within the same ``timeout_s``."""
    if hasattr(os, "fork") and resident_bytes is not None and resident_bytes <= MAX_FORK_BYTES:
        try:
            return _in_child(make, then, timeout_s)
        except OSError as exc:  # no process or pipe to be had: written here, as without fork
            logger.debug("stagefrontier router: forking the trace writer failed: %s", exc)
    return _here(make)


def _here(make: Callable[[], Path]) -> Written:
    start = time.thread_time()
    try:
        path: Path | None = make()
        error = ""
    except Exception as exc:
        path, error = None, export_failure(exc)
    return Written(path, error, time.thread_time() - start, apart=False)


def _in_child(
    make: Callable[[], Path], then: Callable[[Path], str] | None, timeout_s: float
) -> Written:
    read_end, write_end = os.pipe()
    parent = os.getpid()
    prctl = _prctl()  # looked up here: the child must not take the dynamic loader's lock
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns that a fork of a threaded process may deadlock in the child: this
            # child runs only the trace's writer, and one that hangs is killed (``_wait``).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(read_end)
            alarm_s = math.ceil(timeout_s + ALARM_GRACE_S)
            _child(write_end, make, prctl, parent, alarm_s, then)
        os.close(write_end)
        write_end = -1
        status, cpu_s = _wait(pid, timeout_s)
        os.set_blocking(read_end, False)
        try:
            data = os.read(read_end, MESSAGE_BYTES)
        except BlockingIOError:
            data = b""
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    answer, _, then_said = data.partition(b"\n")
    why = status or "the trace writer (a child process) gave no answer"
    try:  # a whole answer stands, however the child ended after giving it
        message = msgspec.json.decode(answer, type=_Message)
    except msgspec.DecodeError:
        return Written(None, why, cpu_s, apart=True)
    path = Path(message.path) if message.path else None
    note = ""
    if then is not None and path is not None:
        try:
            note = msgspec.json.decode(then_said.rstrip(b"\n"), type=str)
        except msgspec.DecodeError:  # ended (killed at the timeout) before ``then`` was done
            note = why
    return Written(path, message.error, cpu_s, apart=True, note=note)


def _child(
    write_end: int,
    make: Callable[[], Path],
    prctl: Any,
    parent: int,
    alarm_s: int,
    then: Callable[[Path], str] | None = None,
) -> NoReturn:
    """In the forked child: write the trace, say how it went (one line), run ``then`` on the
    trace and say how that went (a second line), end (never returns; by SIGALRM after
    ``alarm_s`` seconds at the latest)."""
    code = 1
    try:
        _end_with(prctl, parent)
        gc.disable()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            signal.signal(signum, signal.SIG_DFL)
        signal.alarm(alarm_s)
        try:
            message = _Message(str(make()), "")
        except Exception as exc:
            message = _Message("", export_failure(exc))
        os.write(write_end, msgspec.json.encode(message) + b"\n")
        if then is not None and message.path:
            try:
                note = then(Path(message.path))
            except Exception as exc:
                note = export_failure(exc)
            os.write(write_end, msgspec.json.encode(note) + b"\n")
        code = 0
    finally:
        os._exit(code)


@functools.cache
def _prctl() -> Any:
    """The C library's ``prctl`` (None off Linux, or where no C library can be loaded)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _end_with(prctl: Any, parent: int) -> None:
    """The child is killed when its parent ends (with ``prctl``; elsewhere its alarm alone ends
    it); a parent that ended before the request took effect left the child: it ends now."""
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _wait(pid: int, timeout_s: float) -> tuple[str, float]:
    """Wait for the child ``pid`` to end: why it failed (empty when it exited cleanly) and the
    CPU seconds it ran; a child still running after ``timeout_s`` is killed."""
    deadline = time.monotonic() + timeout_s
    pause = POLL_FIRST_S
    while True:
        try:
            done, status, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:  # reaped by the application (SIGCHLD ignored): read its answer
            return "", 0.0
        if done:
            cpu_s = usage.ru_utime + usage.ru_stime
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                return "", cpu_s
            code = os.waitstatus_to_exitcode(status)
            how = f"by signal {-code}" if code < 0 else f"with exit code {code}"
            return f"the trace writer (a child process) ended {how}", cpu_s
        if time.monotonic() > deadline:
            return (
                f"the trace writer (a child process) had not finished after {timeout_s:g} s: "
                "killed",
                _kill(pid),
            )
        time.sleep(pause)
        pause = min(pause * 2, POLL_MOST_S)


def _kill(pid: int) -> float:
    """Kill the child ``pid`` and reap it: the CPU seconds it ran (0 where it was reaped
    elsewhere: SIGCHLD ignored, or the application's own wait, between the last look and here)."""
    try:
        os.kill(pid, signal.SIGKILL)
        _, _, usage = os.wait4(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        return 0.0
    return usage.ru_utime + usage.ru_stime
