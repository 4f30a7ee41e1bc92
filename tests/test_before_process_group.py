"""A timer built before ``init_process_group`` in a job a launcher started (``WORLD_SIZE`` = 2):
real spawned ranks with the launcher's environment and a real TCPStore.

- The process group is initialized after the timer: collection waits for it, and rank 0's
  ``windows.jsonl`` holds both ranks in every window, exactly as with the timer built after.
- It is never initialized: each rank analyzes its own windows into its own folder; no file is
  written by two ranks.
Either way each rank warns once, saying why.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD, join_gloo
from stagefrontier.demo.launch import run_ranks

RANKS = 2
STEPS = 12
WINDOW = 4
DEADLINE_S = 120.0
FWD = "model.fwd_loss_cpu_wall"


@dataclass(frozen=True)
class Job:
    out_dir: str
    init_process_group: bool


def run_rank(rank: int, job: Job, port: int) -> None:
    """One rank as torchrun would start it, building its timer before the process group."""
    import torch.distributed as dist

    from stagefrontier import CollectConfig, StageTimer, TimerConfig

    os.environ.update(
        WORLD_SIZE=str(RANKS),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    logging.basicConfig(
        filename=str(Path(job.out_dir) / f"log-rank{rank}.txt"),
        level=logging.WARNING,
        format="%(levelname)s %(message)s",
    )
    timer = StageTimer(
        config=TimerConfig(window=WINDOW, collection=CollectConfig(out_dir=job.out_dir))
    )
    if job.init_process_group:
        join_gloo(rank, RANKS, port)
    for _ in range(STEPS):
        with timer.step(), timer.stage(FWD):
            pass
    timer.close()
    if job.init_process_group:
        dist.barrier()
        dist.destroy_process_group()


def _launch(tmp_path: Path, init_process_group: bool) -> Path:
    out = tmp_path / "sf"
    out.mkdir()
    job = Job(str(out), init_process_group)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=DEADLINE_S, start_method=START_METHOD)
    assert all(code == 0 for code in codes.values()), codes
    return out


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _warnings(out: Path, rank: int) -> list[str]:
    lines = (out / f"log-rank{rank}.txt").read_text().splitlines()
    return [line for line in lines if line.startswith("WARNING ")]


def test_collection_waits_for_a_process_group_made_after_the_timer(tmp_path: Path) -> None:
    out = _launch(tmp_path, init_process_group=True)
    records = _records(out / "windows.jsonl")
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 3), (4, 7), (8, 11)]
    for record in records:
        assert record["world_size"] == RANKS
        assert record["ranks_present"] == [0, 1]
        assert record["gather_ok"]
    assert not list(out.glob("rank-*"))
    for rank in range(RANKS):
        (warning,) = _warnings(out, rank)
        assert "built before torch.distributed.init_process_group (WORLD_SIZE=2)" in warning
        assert "until the first window boundary" in warning


def test_ranks_without_a_process_group_write_one_folder_each(tmp_path: Path) -> None:
    out = _launch(tmp_path, init_process_group=False)
    assert not (out / "windows.jsonl").exists()
    for rank in range(RANKS):
        records = _records(out / f"rank-{rank}" / "windows.jsonl")
        assert [r["window"] for r in records] == [0, 1, 2]
        assert {r["pids"]["0"] for r in records} == {records[0]["pids"]["0"]}  # one process
        assert all(r["world_size"] == 1 for r in records)
        built_early, still_none = _warnings(out, rank)
        assert "built before torch.distributed.init_process_group" in built_early
        assert "still not initialized at the first window boundary" in still_none
        assert str(out / "rank-<rank>") in still_none
    pids = {_records(out / f"rank-{rank}" / "windows.jsonl")[0]["pids"]["0"] for rank in (0, 1)}
    assert len(pids) == RANKS  # each folder written by its own rank
