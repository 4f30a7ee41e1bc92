"""The job's store dies mid-run (issue 37, item 12): each rank's log holds the library's own
lines, each said once, and none of torch's C++ store warnings; every rank trains on, closes and
exits 0.

Real processes: the store server lives in the test process (a launcher's agent's place), ranks 0
and 1 are processes of their own collecting through it with a profiler router each, and the
server is shut down while they train.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rank_support import job_env

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from store_rank import STORE_RANK  # the rank script the hung-store benchmark runs too

RANK = (
    STORE_RANK
    + """\
steps(20)
print("ready", flush=True)
while not (folder / "store-gone").exists():
    steps(1)
steps(40)  # every thread of the library meets the dead store
timer.close()
print("closed", flush=True)
"""
)

C10_LINE = re.compile(r"^\[[WEI]\d{4} ")
"""The head of a line of torch's C++ log (``[W1128 05:49:55.488 TCPStore.cpp:138] ...``)."""


def test_a_dead_store_is_said_in_the_librarys_words_only(tmp_path: Path) -> None:
    """Before: each rank printed 110 to 124 lines of torch's C++ warnings and stacks (a
    reconnect tried for 10 s, logging each try), its router thread was still in that reconnect
    when the process ended, and both ranks died by SIGABRT ("terminate called without an active
    exception")."""
    from stagefrontier.collect.node_store import loopback_store

    server = loopback_store(2)
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), "2", str(server.port), str(tmp_path), "0.02"],
            env=job_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        for proc in ranks:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        del server  # the only reference: the server shuts down
        (tmp_path / "store-gone").touch()
        done = [proc.communicate(timeout=240) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    for rank, (proc, (out, err)) in enumerate(zip(ranks, done, strict=True)):
        lines = err.splitlines()
        assert proc.returncode == 0, (rank, proc.returncode, err[-3000:])
        assert out == "closed\n", (rank, out)
        assert [line for line in lines if C10_LINE.match(line) or "frame #" in line] == [], err
        assert all(line.startswith("app stagefrontier: ") for line in lines), err
        assert len(set(lines)) == len(lines), err  # each said once
        assert any("collection disabled" in line for line in lines), err
