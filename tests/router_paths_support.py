"""How the router's path tests launch their job (``router_paths_job.py``, 4 real Gloo ranks under
torchrun): its shape, its faults, and ``run_path_job``, which runs it once and returns its
incidents. ``conftest.router_path_runs`` runs each (path, fault) pair once per session for every
test that asserts on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rank_support import run_job, torchrun_command
from trace_support import settled_incidents

JOB = Path(__file__).resolve().parent / "router_paths_job.py"
RANKS = 4
STEPS = 48
WINDOW = 8
STALL_FROM = 16
DEADLINE_S = 420
FAULTS = {
    "data": ("--data-rank", "2", "--data-steps", f"{STALL_FROM}:{STEPS}"),
    "forward": ("--forward-rank", "1", "--forward-steps", f"{STALL_FROM}:{STEPS}"),
    # 2 DataLoader workers, which read the stall's steps when they fork: from step 0; 120 ms a
    # sample, so each worker's 480 ms a batch outlasts two steps even on a loaded machine
    "workers": (
        *("--data-rank", "2", "--data-steps", f"0:{STEPS}"),
        *("--workers", "2", "--sample-ms", "120"),
    ),
}


def run_path_job(out: Path, path: str, fault: str) -> list[dict[str, Any]]:
    """One torchrun job timing data through ``path`` with ``fault`` (a key of ``FAULTS``), its
    output in ``out``; returns its incidents once settled."""
    run_job(
        torchrun_command(
            JOB,
            *("--path", path, "--out", str(out), "--steps", str(STEPS), "--window", str(WINDOW)),
            *FAULTS[fault],
            ranks=RANKS,
        ),
        DEADLINE_S,
    )
    return settled_incidents(out)
