"""Instruction counts of marked stretches of a Python process, under valgrind's callgrind.

A wall-clock or thread-CPU ratio on a shared machine moves with the load; the number of
instructions a stretch of code executes does not. ``count(argv)`` runs ``argv`` (a Python
command) under callgrind with instrumentation off until the child asks for it, so its imports
run at valgrind's uninstrumented speed, and returns the instructions executed in each stretch the
child marked, in order.

In the child, ``Marks.load()`` gives the marks: ``marks.start()`` turns the instrumentation on
(once, before the first stretch), and each ``marks.mark()`` ends one stretch and starts the next
(a callgrind dump, which also zeroes the counters): the first stretch runs from ``start()`` to
the first mark. The marks are callgrind's client requests,
compiled at run time into a small shared library (a C compiler and valgrind's headers are
needed); outside valgrind they do nothing.

Only the instructions of user space are counted, every thread of the process together.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

LIBRARY_ENV = "STAGEFRONTIER_BENCH_MARKS"
"""Where the child finds the compiled marks (set by ``count``)."""

_SOURCE = """
#include <valgrind/callgrind.h>
void marks_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void marks_mark(void) { CALLGRIND_DUMP_STATS; }
"""
_TOTALS = re.compile(r"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


class Marks:
    """The child's side (see the module doc); every call is a no-op outside valgrind."""

    def __init__(self, library: ctypes.CDLL | None) -> None:
        self._library = library

    @classmethod
    def load(cls) -> Marks:
        path = os.environ.get(LIBRARY_ENV)
        return cls(ctypes.CDLL(path) if path else None)

    def start(self) -> None:
        if self._library is not None:
            self._library.marks_start()

    def mark(self) -> int:
        """End the current stretch (its count is read by the parent); returns 0, so it can
        stand where a clock is called."""
        if self._library is not None:
            self._library.marks_mark()
        return 0


def missing() -> str | None:
    """Why instructions cannot be counted here (valgrind, a C compiler or callgrind's header is
    missing), or None."""
    if shutil.which("valgrind") is None:
        return "valgrind is not installed"
    if shutil.which("cc") is None:
        return "no C compiler (cc) to build callgrind's client requests"
    if not Path("/usr/include/valgrind/callgrind.h").exists():
        return "callgrind's header (valgrind/callgrind.h) is not installed"
    return None


def count(argv: Sequence[str], timeout_s: float = 3600.0) -> list[int]:
    """Run the Python command ``argv`` (without the interpreter) under callgrind; the
    instructions of each stretch the child marked, in order (what runs after its last mark is
    not counted). Raises ``RuntimeError`` saying why when the child fails."""
    with tempfile.TemporaryDirectory(prefix="stagefrontier-callgrind-") as tmp:
        work = Path(tmp)
        library = work / "marks.so"
        source = work / "marks.c"
        source.write_text(_SOURCE)
        subprocess.run(
            ["cc", "-O1", "-shared", "-fPIC", "-o", str(library), str(source)],
            check=True,
            capture_output=True,
        )
        out = work / "callgrind.out"
        env = dict(os.environ, **{LIBRARY_ENV: str(library)})
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                "--dump-line=no",
                f"--callgrind-out-file={out}",
                sys.executable,
                *argv,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"the counted child failed (exit {done.returncode}): {tail}")
        dumps = sorted(work.glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        return [_total(p.read_text(errors="replace")) for p in dumps]


def _total(text: str) -> int:
    found = _TOTALS.search(text)
    return int(found.group(1)) if found else 0
