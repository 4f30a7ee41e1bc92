"""``stagefrontier run`` on two torchrun "nodes" of this machine: two launchers, 2 workers each,
meeting through the c10d rendezvous (``--nnodes 2 --rdzv-backend c10d``), as two hosts would, at
a store the test holds (each agent a client of it).
The job is one job of 4 ranks: global rank 0's node alone writes its folder and prints the
window lines; the other node prints none.

Cost: one job of 21 steps of examples/unmodified/train_ddp.py on 4 workers and 2 launchers (30
to 60 s on a loaded 2-core machine). Nothing asserts a duration.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")

from auto_support import DEADLINE_S, RANKS, RUN_ENV, UNMODIFIED, finished, run_command
from rank_support import rendezvous_endpoint

STEPS = 21  # the first is watched, not timed: two windows of 10


def test_two_nodes_make_one_job_whose_rank_0_alone_reports(tmp_path: Path) -> None:
    outs = [tmp_path / "node-a", tmp_path / "node-b"]
    with rendezvous_endpoint() as endpoint:  # held here: neither agent races the other to host it
        launch = (
            *("--nnodes", "2", "--nproc-per-node", str(RANKS // 2)),
            *("--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-conf", "is_host=0"),
            *("--rdzv-id", "two-nodes"),
        )
        jobs = [
            subprocess.Popen(
                run_command(
                    out,
                    UNMODIFIED / "train_ddp.py",
                    ("--steps", str(STEPS)),
                    router=False,
                    launch=launch,
                ),
                env=RUN_ENV,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for out in outs
        ]
        outputs = [job.communicate(timeout=DEADLINE_S)[0] for job in jobs]
    reporting = [i for i, out in enumerate(outs) if (out / "windows.jsonl").exists()]
    assert len(reporting) == 1, outputs
    node = reporting[0]
    run = finished(outs[node], jobs[node].returncode, outputs[node])
    assert jobs[1 - node].returncode == 0, outputs[1 - node][-6000:]
    assert "Traceback" not in run.output, run.output[-6000:]
    assert [r["n_steps"] for r in run.records] == [10, 10]
    for record in run.records:
        assert record["ranks_present"] == list(range(RANKS))
        # two ranks on each node: local ranks 0 and 1 twice
        assert sorted(record["local_ranks"].values()) == [0, 0, 1, 1], record["local_ranks"]
        assert record["contract_violations"] == 0
    lines = [[line for line in o.splitlines() if line.startswith("window ")] for o in outputs]
    assert [line.split(" | ")[0] for line in lines[node]] == [
        "window 0 steps 0-9",
        "window 1 steps 10-19",
    ], outputs[node][-3000:]
    assert lines[1 - node] == [], outputs[1 - node][-3000:]
