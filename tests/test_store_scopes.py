"""Two StageTimers in one process (training and evaluation), on real Gloo ranks collecting
through the store: each keeps its own windows. Before, both timers' ranks wrote the same store
keys, and every window of both lost rank 1 ("missing" or "different schema"). And two timers of
one process writing one out_dir are refused."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stagefrontier import StageTimer, TimerSettingError
from stagefrontier.demo.launch import read_windows, run_ranks

RANKS = 2
STEPS = 20
TRAIN = ["data.next_wait", "model.fwd_loss_cpu_wall"]
EVAL = ["eval.fwd_cpu_wall"]


def _rank(rank: int, out_dir: str, port: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig
    from stagefrontier.demo.train import leave_process_group

    store = dist.TCPStore("127.0.0.1", port, RANKS, is_master=False)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=RANKS, timeout=timedelta(seconds=60)
    )

    def config(name: str) -> CollectConfig:
        # No collective in the loop keeps the ranks together: on a loaded machine one rank can
        # run more than 10 s behind the other, and rank 0 would then rightly report it missing.
        # The wait is a deadline for a lagging rank, not a cost when both keep up.
        return CollectConfig(mode="store", out_dir=f"{out_dir}/{name}", timeout_s=120.0, log=False)

    train = StageTimer(TRAIN, window=5, collect=config("train"))
    evaluate = StageTimer(EVAL, window=5, collect=config("eval"))
    x = torch.randn(64, 64)
    for _ in range(STEPS):
        with train.step():
            with train.stage(TRAIN[0]):
                y = x @ x
            with train.stage(TRAIN[1]):
                y = y @ x
        with evaluate.step(), evaluate.stage(EVAL[0]):
            y = x @ x
    train.close()
    evaluate.close()
    leave_process_group()


def test_a_training_and_an_evaluation_timer_keep_every_rank(tmp_path: Path) -> None:
    codes = run_ranks(_rank, RANKS, str(tmp_path), deadline_s=240.0)
    assert codes == {0: 0, 1: 0}
    for name, stages in (("train", TRAIN), ("eval", EVAL)):
        windows = read_windows(tmp_path / name)
        assert len(windows) == STEPS // 5, name
        for w in windows:
            assert w["ranks_present"] == [0, 1], (name, w.get("reasons"))
            assert w["stages"][: len(stages)] == stages


def test_two_timers_of_one_process_may_not_write_one_out_dir(tmp_path: Path) -> None:
    first = StageTimer(window=5, collect="local", out_dir=tmp_path, log=False)
    try:
        with pytest.raises(TimerSettingError, match=r"out_dir .* is written by another StageTimer"):
            StageTimer(window=5, collect="local", out_dir=tmp_path / ".", log=False)
    finally:
        first.close()
    StageTimer(window=5, collect="local", out_dir=tmp_path, log=False).close()  # free again
