"""The trace's writer in a forked child (``route.trace_writer``): what it answers when the write
works, fails, hangs or dies, and where it writes when the process must not fork. Each child is a
real fork of the test process; each ``make`` writes which process ran it."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

from stagefrontier.route.trace_writer import MAX_FORK_BYTES, write_trace

SMALL = 1 << 20  # resident bytes of a process that may fork


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
