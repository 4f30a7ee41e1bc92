"""``stagefrontier run`` on an unmodified DDP script whose optimizer is ZeRO-1
(``ZeroRedundancyOptimizer``: tests/data/scripts/train_sharded.py --zero1), 2 real Gloo ranks
on torchrun's launcher: ZeRO's ``step`` runs its local optimizer's ``step`` inside it, and the
hooks time the outer one as the step's one optimizer, its parameter broadcasts included
(``timer.watch_zero``), and DDP's gradient buckets (``timer.watch_ddp``).

Cost: one job of 21 steps on 2 ranks (10 to 30 s on a loaded 2-core machine). Nothing asserts a
duration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from auto_support import DEADLINE_S, RUN_ENV, SCRIPTS, finished, run_command
from rank_support import run_job

RANKS = 2
PARAMETER_BYTES = (16 * 64 + 64 + 64 * 2 + 2) * 4  # the script's two linear layers, float32


def test_a_zero1_optimizer_is_one_optimizer_and_its_broadcasts_are_timed(tmp_path: Path) -> None:
    launch = ("--standalone", "--nproc-per-node", str(RANKS))
    command = run_command(
        tmp_path,
        SCRIPTS / "train_sharded.py",
        ("--steps", "21", "--zero1"),
        router=False,
        launch=launch,
    )
    done = run_job(command, DEADLINE_S, env=RUN_ENV, check=False)
    run = finished(tmp_path, done.returncode, done.stdout + done.stderr)
    assert "Traceback" not in run.output and "optimizers step" not in run.output, run.output
    # the first step is watched, not timed: two windows of 10
    assert [r["n_steps"] for r in run.records] == [10, 10], run.output[-3000:]
    sums = {line.split("parameter sum ")[1] for line in run.output.splitlines() if "sum " in line}
    assert len(sums) == 1, run.output  # the ranks still train one model
    for record in run.records:
        assert record["ranks_present"] == list(range(RANKS))
        assert record["contract_violations"] == 0
        timed = {
            (c["family"], c["stage"], c["nbytes"]) for c in record["communication"]["collectives"]
        }
        assert ("zero_broadcast", "optim.step_cpu_wall", PARAMETER_BYTES) in timed, timed
        assert ("all_reduce", "model.backward_cpu_wall", PARAMETER_BYTES) in timed, timed
