"""Running unmodified training scripts under ``stagefrontier run`` (4 real Gloo ranks on
torchrun's launcher) and, in one process, under ``python -m stagefrontier.run`` or the
environment switch."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rank_support import job_env, run_job
from recorder_support import read_records
from trace_support import settled_incidents

ROOT = Path(__file__).resolve().parents[1]
UNMODIFIED = ROOT / "examples" / "unmodified"
SCRIPTS = ROOT / "tests" / "data" / "scripts"
ODD_LOOPS = SCRIPTS / "odd_loops.py"
RANKS = 4
WINDOW = 10
DEADLINE_S = 420.0
RUN_ENV = job_env()


@dataclass
class AutoRun:
    """One finished ``stagefrontier run`` job: its output folder, what it printed, rank 0's
    window records and its incidents (settled)."""

    out: Path
    output: str
    records: list[dict[str, Any]]
    incidents: list[dict[str, Any]]


STANDALONE = ("--standalone", "--nproc-per-node", str(RANKS))
"""torchrun's options for one node of ``RANKS`` workers."""


def run_command(
    out: Path,
    script: Path,
    args: tuple[str, ...],
    *,
    router: bool,
    options: tuple[str, ...] = (),
    launch: tuple[str, ...] = STANDALONE,
) -> list[str]:
    """``stagefrontier run --out OUT --window 10 [--router] OPTIONS LAUNCH --max-restarts=0
    SCRIPT ARGS`` (LAUNCH: torchrun's options, one node of 4 workers by default)."""
    return [
        sys.executable,
        "-m",
        "stagefrontier.cli",
        "run",
        "--out",
        str(out),
        "--window",
        str(WINDOW),
        *(["--router"] if router else []),
        *options,
        *launch,
        "--max-restarts=0",
        str(script),
        *args,
    ]


def finished(out: Path, returncode: int, output: str) -> AutoRun:
    """The run in ``out``, once it ended (asserts it ended well)."""
    assert returncode == 0, output[-6000:]
    return AutoRun(out, output, read_records(out), settled_incidents(out))


def run_unmodified(out: Path, script: str, *args: str, router: bool = True) -> AutoRun:
    """``stagefrontier run`` (``run_command``) on a script of examples/unmodified."""
    command = run_command(out, UNMODIFIED / script, args, router=router)
    done = run_job(command, DEADLINE_S, env=RUN_ENV, check=False)
    return finished(out, done.returncode, done.stdout + done.stderr)


def run_one_process(
    argv: list[str], env: dict[str, str], python: str | Path = sys.executable
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` in one process (no launcher), with ``env`` added to the environment."""
    return run_job([str(python), *argv], DEADLINE_S, env=job_env(**env), check=False)
