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

from rank_support import START_METHOD
from stagefrontier import CollectConfig, StageTimer, TimerConfig, TimerSettingError
from stagefrontier.demo.launch import read_windows, run_ranks
from stagefrontier.formats.incident import read_incident

RANKS = 2
STEPS = 20
TRAIN = ["data.next_wait", "model.fwd_loss_cpu_wall"]
EVAL = ["eval.fwd_cpu_wall"]


def _rank(rank: int, payload: tuple[str, bool], port: int) -> None:
    """``payload``: the job's folder, and whether rank 1 disables its training timer."""
    out_dir, disabled = payload
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

    train = StageTimer(
        config=TimerConfig(
            stages=TRAIN, window=5, collection=config("train"), enabled=not (disabled and rank == 1)
        )
    )
    evaluate = StageTimer(config=TimerConfig(stages=EVAL, window=5, collection=config("eval")))
    x = torch.randn(64, 64)
    for step in range(STEPS):
        with train.step():
            with train.stage(TRAIN[0]):
                y = x @ x
            with train.stage(TRAIN[1]):
                y = y @ x
        with evaluate.step(), evaluate.stage(EVAL[0]):
            y = x @ x
        if step % 5 == 4:
            # Rank 0 may run at most a window ahead: four windows ahead (a rank 1 that started
            # late, or was descheduled) fill rank 0's hand-off queue, and it then rightly stops
            # waiting for rank 1's window.
            dist.barrier()
    train.close()
    evaluate.close()
    leave_process_group()


@pytest.mark.parametrize("disabled", [False, True], ids=["enabled", "rank1-train-disabled"])
def test_a_training_and_an_evaluation_timer_keep_every_rank(tmp_path: Path, disabled: bool) -> None:
    """With ``disabled``, rank 1 builds its training timer with ``enabled=False``: its
    evaluation timer must still meet rank 0's (before, it took the first key scope, rank 0's
    training timer's, and every window of both timers lost rank 1 for the wrong reason)."""
    payload = (str(tmp_path), disabled)
    codes = run_ranks(_rank, RANKS, payload, deadline_s=240.0, start_method=START_METHOD)
    assert codes == {0: 0, 1: 0}
    for name, stages in (("train", TRAIN), ("eval", EVAL)):
        windows = read_windows(tmp_path / name)
        assert len(windows) == STEPS // 5, name
        for w in windows:
            if disabled and name == "train":
                assert w["ranks_present"] == [0], (name, w.get("reasons"))
                why = [r for v in w["reasons"].values() for r in v]
                assert any("their timers are disabled" in r for r in why), why
            else:
                assert w["ranks_present"] == [0, 1], (name, w.get("reasons"))
            assert w["stages"][: len(stages)] == stages


MAX_STEPS = 3000
"""The scoped job's ranks step until rank 0 sees the routed training timer's incident written (a
loaded machine decides how long that takes, not this count)."""
TIMERS = ("hier-train", "hier-eval", "routed-train", "routed-eval")


def _scoped_rank(rank: int, out_dir: str, port: int) -> None:
    """Four timers on each rank: a training and an evaluation timer collecting hierarchically
    (both ranks on one node), and a training and an evaluation timer collecting through the
    store, each with a profiler router of its own. Rank 0 asks the routed training timer's
    router for a capture of rank 1, and the ranks step together until its incident is
    written."""
    os.environ.update(
        OMP_NUM_THREADS="1", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(RANKS), GROUP_RANK="0"
    )
    import time

    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter
    from stagefrontier.demo.train import leave_process_group

    store = dist.TCPStore("127.0.0.1", port, RANKS, is_master=False)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=RANKS, timeout=timedelta(seconds=300)
    )

    def timer(name: str, router: ProfilerRouter | None = None) -> StageTimer:
        mode = "hierarchical" if name.startswith("hier") else "store"
        config = CollectConfig(
            mode=mode, out_dir=f"{out_dir}/{name}", timeout_s=120.0, log=False, regression=None
        )
        stages = TRAIN if name.endswith("train") else EVAL
        return StageTimer(
            config=TimerConfig(stages=stages, window=5, collection=config, router=router)
        )

    asked = ProfilerRouter(steps=2, max_captures=1, capture_timeout_s=300.0)
    timers = [
        timer("hier-train"),
        timer("hier-eval"),
        timer("routed-train", asked),
        timer("routed-eval", ProfilerRouter(max_captures=0, capture_timeout_s=300.0)),
    ]
    incidents = Path(out_dir, "routed-train", "incidents")
    x = torch.randn(64, 64)
    done = torch.zeros(1)
    for step in range(MAX_STEPS):
        for t in timers:
            with t.step():
                for stage in t.stages:
                    with t.stage(stage):
                        time.sleep(0.002)
        if rank == 0 and step == 5:
            asked.request_capture([1])
        if rank == 0:
            done[0] = float(step >= 10 and any(incidents.glob("*/incident.json")))
        dist.broadcast(done, src=0)
        if done[0]:
            break
    for t in timers:
        t.close()
    del x
    leave_process_group()


def test_timers_collecting_hierarchically_or_with_routers_keep_their_keys_apart(
    tmp_path: Path,
) -> None:
    """Before, two hierarchical timers published their node stores' addresses under one
    job-store key (one timer's member then sent its windows to the other timer's node store),
    and two timers' routers read one request key (the evaluation timer's router captured the
    training timer's request into its own folder)."""
    codes = run_ranks(
        _scoped_rank, RANKS, str(tmp_path), deadline_s=570.0, start_method=START_METHOD
    )
    assert codes == {0: 0, 1: 0}
    for name in TIMERS:
        stages = TRAIN if name.endswith("train") else EVAL
        windows = read_windows(tmp_path / name)
        assert windows, name
        for w in windows:
            assert w["missing_ranks"] == [] and w["gather_ok"], (name, w["reasons"])
            assert w["stages"][: len(stages)] == stages
    [incident] = [read_incident(p) for p in (tmp_path / "routed-train" / "incidents").iterdir()]
    assert incident["captured"] and incident["ranks"] == [1], incident["reasons"]
    assert not (tmp_path / "routed-eval" / "incidents").exists()


def test_two_timers_of_one_process_may_not_write_one_out_dir(tmp_path: Path) -> None:
    first = StageTimer(
        config=TimerConfig(
            window=5, collection=CollectConfig(mode="local", out_dir=tmp_path, log=False)
        )
    )
    try:
        with pytest.raises(TimerSettingError, match=r"out_dir .* is written by another StageTimer"):
            StageTimer(
                config=TimerConfig(
                    window=5,
                    collection=CollectConfig(mode="local", out_dir=tmp_path / ".", log=False),
                )
            )
    finally:
        first.close()
    StageTimer(
        config=TimerConfig(
            window=5, collection=CollectConfig(mode="local", out_dir=tmp_path, log=False)
        )
    ).close()  # free again


def test_stagefrontier_capture_asks_the_router_it_names(tmp_path: Path) -> None:
    """A training and an evaluation timer of one process, each with a router:
    ``stagefrontier capture --router 1`` reaches the second one (the evaluation timer's), and
    its incident is written in that timer's folder only."""
    import subprocess
    import sys
    import time

    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
    )

    def timer(name: str, stages: list[str]) -> StageTimer:
        config = CollectConfig("local", out_dir=tmp_path / name, regression=None, log=False)
        router = ProfilerRouter(steps=2, store=store, max_captures=1, capture_timeout_s=120.0)
        return StageTimer(
            config=TimerConfig(stages=stages, window=5, collection=config, router=router)
        )

    train, evaluate = timer("train", TRAIN), timer("eval", EVAL)
    cli = subprocess.Popen(
        [sys.executable, "-m", "stagefrontier.cli", "capture", "--store",
         f"127.0.0.1:{store.port}", "--ranks", "0", "--steps", "2", "--wait", "300",
         "--router", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:  # until the command ends (a loaded machine may take many steps to start it)
        while cli.poll() is None:
            for t in (train, evaluate):
                with t.step():
                    for stage in t.stages:
                        with t.stage(stage):
                            time.sleep(0.002)
    finally:
        train.close()
        evaluate.close()
        out, _ = cli.communicate(timeout=60)
    assert cli.returncode == 0, out
    folder = Path(out.strip())
    assert folder.parent == (tmp_path / "eval" / "incidents").resolve()
    assert read_incident(folder)["captured"]
    assert not (tmp_path / "train" / "incidents").exists()
