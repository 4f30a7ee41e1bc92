"""How the router's path tests launch their job (``router_paths_job.py``, 4 real Gloo ranks under
torchrun): its shape, its faults, and ``run_path_job``, which runs it once and returns its
incidents. ``conftest.router_path_runs`` runs the job with both stalls once per session and path
for every test that asserts on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rank_support import run_job, torchrun_command
from trace_support import settled_incidents

JOB = Path(__file__).resolve().parent / "router_paths_job.py"
RANKS = 4
STEPS = 128
WINDOW = 8
STALLS = {"data": (16, 48), "forward": (64, 96)}
"""Each stall's steps in the one job that serves both: two healthy windows, rank 2's data stall
for four windows, two healthy windows, rank 1's forward stall for four windows, then four healthy
windows, in which the forward stall's capture runs and settles while the run goes on (a run that
ended two windows after the stall left its reduction to the after-run process at a load of 50,
and ended inside its capture at 70). The router's cooldown (``router_paths_job.router``) covers
the four windows after an incident, so neither stall can open a second one; the other windows
open nothing."""
STALL_FROM = STALLS["data"][0]
DEADLINE_S = 420


def _span(fault: str) -> str:
    return "{}:{}".format(*STALLS[fault])


WORKERS_STEPS = 48
"""The workers job's steps: its stall lasts the whole run, and 48 steps give it six windows."""
FAULTS = {
    "stalls": (
        *("--steps", str(STEPS)),
        *("--data-rank", "2", "--data-steps", _span("data")),
        *("--forward-rank", "1", "--forward-steps", _span("forward")),
    ),
    # 2 DataLoader workers, which read the stall's steps when they fork: from step 0; 120 ms a
    # sample, so each worker's 480 ms a batch outlasts two steps even on a loaded machine
    "workers": (
        *("--steps", str(WORKERS_STEPS)),
        *("--data-rank", "2", "--data-steps", f"0:{WORKERS_STEPS}"),
        *("--workers", "2", "--sample-ms", "120"),
    ),
}


def run_path_job(out: Path, path: str, fault: str) -> list[dict[str, Any]]:
    """One torchrun job timing data through ``path`` with ``fault`` (a key of ``FAULTS``), its
    output in ``out``; returns its incidents once settled."""
    run_job(
        torchrun_command(
            JOB,
            *("--path", path, "--out", str(out), "--window", str(WINDOW)),
            *FAULTS[fault],
            ranks=RANKS,
        ),
        DEADLINE_S,
    )
    return settled_incidents(out)
