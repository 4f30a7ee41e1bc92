"""The trace's writer in a forked child (``route.trace_writer``): what it answers when the write
works, fails, hangs or dies, and where it writes when the process must not fork; that the child
never outlives its parent (killed with it, or ended by its own alarm) and is never written twice.
Each child is a real fork of the test process; each ``make`` writes which process ran it."""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from stagefrontier.route.trace_writer import MAX_FORK_BYTES, _child, _prctl, write_trace

SMALL = 1 << 20  # resident bytes of a process that may fork
ENDS_WITHIN_S = 30.0
"""How long a test waits for a process to end that should end at once (or, by its alarm, after
a second): a bound for a busy machine, not a measure."""
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")


def _writes_its_pid(path: Path) -> Path:
    path.write_text(str(os.getpid()))
    return path


def test_a_child_process_writes_the_trace_and_answers_where_it_is(tmp_path: Path) -> None:
    target = tmp_path / "trace.json.gz"
    written = write_trace(lambda: _writes_its_pid(target), resident_bytes=SMALL)
    assert written.apart and not written.error
    assert written.path == target
    assert int(target.read_text()) != os.getpid()  # another process wrote it
    assert written.cpu_s >= 0.0


def test_a_failed_write_in_the_child_is_answered_in_one_line(tmp_path: Path) -> None:
    def full() -> Path:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    written = write_trace(full, resident_bytes=SMALL)
    assert written.apart and written.path is None
    assert written.error == os.strerror(errno.ENOSPC)


def test_a_child_that_never_ends_is_killed_and_said(tmp_path: Path) -> None:
    def hangs() -> Path:
        time.sleep(60)
        return tmp_path

    written = write_trace(hangs, resident_bytes=SMALL, timeout_s=0.5)
    assert written.path is None
    assert (
        written.error == "the trace writer (a child process) had not finished after 0.5 s: killed"
    )


def test_a_child_that_dies_is_said_with_its_signal(tmp_path: Path) -> None:
    def dies() -> Path:
        os.kill(os.getpid(), signal.SIGKILL)
        return tmp_path

    written = write_trace(dies, resident_bytes=SMALL)
    assert written.path is None
    assert written.error == f"the trace writer (a child process) ended by signal {signal.SIGKILL}"


def test_a_large_process_writes_on_the_calling_thread(tmp_path: Path) -> None:
    """A fork copies the page tables holding the GIL: past ``MAX_FORK_BYTES`` (or where the
    size is unknown) the trace is written here, as without a child."""
    for resident in (MAX_FORK_BYTES + 1, None):
        target = tmp_path / f"trace-{resident}.json.gz"
        written = write_trace(lambda t=target: _writes_its_pid(t), resident_bytes=resident)
        assert not written.apart and written.path == target
        assert int(target.read_text()) == os.getpid()


def test_a_child_the_kernel_reaps_is_not_written_again_here(tmp_path: Path) -> None:
    """SIGCHLD ignored (an application's choice): the kernel reaps the child itself, so the wait
    after the kill at the timeout finds no child. The trace is said failed, not written a second
    time on the calling thread."""
    target = tmp_path / "trace.json.gz"
    caller = os.getpid()

    def hangs() -> Path:
        _writes_its_pid(target)
        if os.getpid() != caller:
            time.sleep(60)
        return target

    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        written = write_trace(hangs, resident_bytes=SMALL, timeout_s=0.5)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert written.apart and written.path is None
    assert (
        written.error == "the trace writer (a child process) had not finished after 0.5 s: killed"
    )
    assert not target.exists() or int(target.read_text()) != caller


def _fork(child: Callable[[], object]) -> int:
    """A real fork of this process that runs ``child`` and ends: its pid."""
    with warnings.catch_warnings():  # the fork of a threaded process: the child only forks again
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            child()
        finally:
            os._exit(0)
    return pid


def _hangs_after_writing_its_pid(pid_file: Path) -> Path:
    pid_file.with_suffix(".tmp").write_text(str(os.getpid()))
    pid_file.with_suffix(".tmp").replace(pid_file)
    time.sleep(600)
    return pid_file


def _state(pid: int) -> tuple[str, int]:
    """A process's state letter (``"gone"`` once reaped) and its exit status (a zombie's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone", 0
    fields = stat.rsplit(")", 1)[1].split()  # the name, in brackets, may hold spaces
    return fields[0], int(fields[-1])


def _wait_for(pid_file: Path) -> int:
    deadline = time.monotonic() + ENDS_WITHIN_S
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the writer child never started"
        time.sleep(0.01)
    return int(pid_file.read_text())


def _until_ended(pid: int) -> tuple[str, int]:
    """Wait (bounded) for ``pid`` to end: ended (zombie) or reaped; its last state."""
    deadline = time.monotonic() + ENDS_WITHIN_S
    while (state := _state(pid))[0] not in ("Z", "gone") and time.monotonic() < deadline:
        time.sleep(0.01)
    return state


@linux_only
def test_a_writer_dies_with_its_parent_killed_by_sigkill(tmp_path: Path) -> None:
    """The rank is SIGKILLed (or OOM-killed) while its writer hangs: the writer, holding copies
    of the rank's sockets, is killed with it (``PR_SET_PDEATHSIG``), not left an orphan."""
    pid_file = tmp_path / "writer.pid"
    parent = _fork(
        lambda: write_trace(
            lambda: _hangs_after_writing_its_pid(pid_file), resident_bytes=SMALL, timeout_s=600
        )
    )
    writer = _wait_for(pid_file)
    try:
        os.kill(parent, signal.SIGKILL)
        os.waitpid(parent, 0)
        state, status = _until_ended(writer)
        assert state in ("Z", "gone"), f"the writer outlived its parent: state {state}"
        assert state == "gone" or os.WTERMSIG(status) == signal.SIGKILL
    finally:
        with suppress(ProcessLookupError):
            os.kill(writer, signal.SIGKILL)


def test_a_writer_no_parent_kills_ends_by_its_own_alarm(tmp_path: Path) -> None:
    """The writer's own body (``_child``) under a parent that never kills it (one stopped, or
    stuck where its timeout never comes): it hangs, and ends by itself, by SIGALRM, when its
    alarm rings (here after 1 s; in a rank ``ALARM_GRACE_S`` after the parent's timeout), having
    said nothing."""
    pid_file = tmp_path / "writer.pid"
    read_end, write_end = os.pipe()
    writer = _fork(
        lambda: _child(
            write_end, lambda: _hangs_after_writing_its_pid(pid_file), _prctl(), os.getppid(), 1
        )
    )
    os.close(write_end)
    try:
        deadline = time.monotonic() + ENDS_WITHIN_S
        while not (ended := os.waitpid(writer, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ended[0] == writer, "the writer did not end by itself"
        assert os.WIFSIGNALED(ended[1]) and os.WTERMSIG(ended[1]) == signal.SIGALRM
        assert os.read(read_end, 1 << 16) == b""  # no answer: it never finished
    finally:
        os.close(read_end)
        with suppress(ProcessLookupError, ChildProcessError):
            os.kill(writer, signal.SIGKILL)
            os.waitpid(writer, 0)


def test_then_runs_in_the_child_after_the_answer_and_never_on_the_calling_thread(
    tmp_path: Path,
) -> None:
    """``then`` (the capture's slice for the reduction) is work for a child, off the rank's GIL:
    a child runs it on the trace it wrote and says it worked (an empty note); a process that
    writes on the calling thread skips it (before, the same write ran it there too)."""
    ran = tmp_path / "then.pid"

    def then(trace: Path) -> str:
        assert trace.is_file()
        ran.write_text(str(os.getpid()))
        return ""

    target = tmp_path / "apart.json.gz"
    written = write_trace(lambda: _writes_its_pid(target), resident_bytes=SMALL, then=then)
    assert written.apart and written.path == target and not written.error and not written.note
    assert int(ran.read_text()) == int(target.read_text()) != os.getpid()
    ran.unlink()
    here = tmp_path / "here.json.gz"
    written = write_trace(
        lambda: _writes_its_pid(here), resident_bytes=MAX_FORK_BYTES + 1, then=then
    )
    assert not written.apart and written.path == here and not written.note
    assert not ran.exists()


def test_a_failure_of_then_is_its_note_and_the_trace_stands(tmp_path: Path) -> None:
    """``then`` runs once the child has answered where the trace is: its failure (said, or
    raised) and a child that dies in the middle of it are the answer's note, never the
    trace's failure."""
    target = tmp_path / "trace.json.gz"

    def dies(trace: Path) -> str:
        os.kill(os.getpid(), signal.SIGKILL)
        return ""

    def raises(trace: Path) -> str:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for then, note in (
        (lambda trace: "ValueError: not a trace", "ValueError: not a trace"),
        (raises, os.strerror(errno.ENOSPC)),
        (dies, f"the trace writer (a child process) ended by signal {signal.SIGKILL}"),
    ):
        written = write_trace(lambda: _writes_its_pid(target), resident_bytes=SMALL, then=then)
        assert written.apart and written.path == target and not written.error
        assert written.note == note
