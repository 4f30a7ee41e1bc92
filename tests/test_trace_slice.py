"""A capture's slice for the reduction (``route.trace_slice``) as its writer, a forked child,
leaves it: cut after the child has said where the trace is, so that a child killed while it
cuts keeps the trace; the cut's failure said by the parent in one line, never logged by the
child; whatever a killed cut left removed with the slice. Each child is a real fork of the test
process (``route.trace_writer``)."""

from __future__ import annotations

import gzip
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from stagefrontier.formats.packet import atomic_file
from stagefrontier.route.trace_slice import drop_slice, remove_slice, slice_path, write_slice
from stagefrontier.route.trace_writer import write_trace

SMALL = 1 << 20  # resident bytes of a process that may fork
STAGE = "data.next_wait"


def _not_json(path: Path) -> Path:
    path.write_bytes(gzip.compress(b'{"traceEvents": [not json'))
    return path


def test_a_writer_killed_while_cutting_keeps_the_trace_and_leaves_nothing_of_the_slice(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the cut ran inside the trace's write, so a writer killed while cutting (at the
    timeout, or here by a signal, the slice half written) answered nothing: the parent called
    the capture failed, deleted the whole trace and left the slice's temporary file. Now the
    trace's path is on the pipe before the cut starts: the trace stands, the note says why the
    slice is missing, and ``drop_slice`` removes the temporary file and says it in one line."""
    trace = tmp_path / "rank2.pt.trace.json.gz"

    def killed_while_cutting(path: Path) -> str:
        with atomic_file(slice_path(path)) as out:
            out.write(b'{"stage": "data.next_wait", "events": [')
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return ""

    written = write_trace(lambda: _not_json(trace), resident_bytes=SMALL, then=killed_while_cutting)
    assert written.apart and written.path == trace and not written.error
    assert written.note == f"the trace writer (a child process) ended by signal {signal.SIGKILL}"
    (left,) = (p.name for p in tmp_path.iterdir() if p != trace)
    assert left.startswith(".rank2.pt.trace.slice.json.") and left.endswith(".tmp")
    with caplog.at_level("WARNING", logger="stagefrontier"):
        drop_slice(trace, written.note)
    assert [p.name for p in tmp_path.iterdir()] == [trace.name]
    assert [r.getMessage() for r in caplog.records] == [
        "stagefrontier: cutting the trace for the reduction failed (the trace writer (a child "
        f"process) ended by signal {signal.SIGKILL}); rank 0 parses the trace"
    ]


def test_a_failed_cut_is_said_by_the_parent_not_logged_by_the_child(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the child logged the failed cut itself (a handler's lock held by another thread
    at the fork blocks it; the line goes to the parent's stream from another process). Now
    ``write_slice`` logs nothing and returns why: the child sends it on the pipe, and the
    parent says it in one line. A handler on the process's stderr shows what the child wrote."""
    trace = tmp_path / "rank0.pt.trace.json.gz"
    handler = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("stagefrontier")
    logger.addHandler(handler)
    try:
        capfd.readouterr()
        written = write_trace(
            lambda: _not_json(trace),
            resident_bytes=SMALL,
            then=lambda path: write_slice(path, STAGE, range(3, 8)),
        )
        assert capfd.readouterr().err == ""  # the child wrote nothing to the stream
    finally:
        logger.removeHandler(handler)
    assert written.apart and written.path == trace and not written.error
    assert written.note.startswith("TraceFormatError: ") and "\n" not in written.note
    assert [p.name for p in tmp_path.iterdir()] == [trace.name]  # no slice, not even a part
    with caplog.at_level("WARNING", logger="stagefrontier"):
        drop_slice(trace, written.note)
    (line,) = (r.getMessage() for r in caplog.records)
    assert line == (
        f"stagefrontier: cutting the trace for the reduction failed ({written.note}); "
        "rank 0 parses the trace"
    )


def test_remove_slice_removes_the_slice_and_what_a_killed_cut_left(tmp_path: Path) -> None:
    """The slice and any temporary file of one are removed; other files, another trace's slice
    among them, are left."""
    trace = tmp_path / "rank1.pt.trace.json.gz"
    other = tmp_path / "rank11.pt.trace.json.gz"
    for path in (trace, other):
        path.write_bytes(b"")
        slice_path(path).write_bytes(b"{}")
        slice_path(path).with_name(f".{slice_path(path).name}.0123456789ab.tmp").write_bytes(b"{")
    remove_slice(trace)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            trace.name,
            other.name,
            slice_path(other).name,
            f".{slice_path(other).name}.0123456789ab.tmp",
        ]
    )
    remove_slice(trace)  # nothing left to remove: no error
