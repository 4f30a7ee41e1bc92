"""The machine held against the other pytest worker while a test that needs it alone runs.

Under pytest-xdist (``make test PYTEST_WORKERS=2``) two workers share the cores. Most tests do
not mind: their assertions hold at any load. A few compare jobs they run side by side, or start
CPU burners beside a job and read the slowdown they cause (the compare gate's healthy, stalled
and heavier runs; the scale check's flat and hierarchical runs; the whole-job and starved-rank
jobs): they assume the jobs beside them are their own, which another worker's jobs starting and
ending meanwhile break. Such a test module is marked ``machine_to_itself``; each
of its tests (its module's and session's fixtures set up for it included) holds the machine
exclusively, every other test holds it shared, so the marked ones run with no other worker's
test beside them.

Two ``flock`` locks in the temporary directory, named by the run's ``PYTEST_XDIST_TESTRUNUID``:
``machine`` (shared or exclusive) and ``turnstile``, which a test passes through before it takes
``machine`` shared and which an exclusive holder keeps while it waits, so that it waits for the
other worker's running test only, never behind a stream of them. Without xdist nothing is held.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

MARK = "machine_to_itself"


def _lock_dir() -> Path | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        return None
    folder = Path(tempfile.gettempdir()) / f"stagefrontier-tests-{run}"
    folder.mkdir(exist_ok=True)
    return folder


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, mode)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases its lock


@contextlib.contextmanager
def hold_machine(alone: bool) -> Iterator[None]:
    """The machine held for one test: exclusively when ``alone``, else shared."""
    folder = _lock_dir()
    if folder is None:
        yield
        return
    machine = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    with contextlib.ExitStack() as held:
        with _locked(folder / "turnstile", fcntl.LOCK_EX):
            held.enter_context(_locked(folder / "machine", machine))
        yield
