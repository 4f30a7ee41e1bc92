"""The demo's sharded modes (``DemoConfig.sharding``): ``zero1`` (DDP with a
``ZeroRedundancyOptimizer``) and ``fsdp2`` (``fully_shard`` on every block and the root), each a
real 2-rank Gloo run of the demo's shape (tests/conftest.py): both train the model the untimed
DDP run trains, and their collectives are timed (DDP's buckets and ZeRO-1's broadcasts; FSDP2's
all-gathers and reduce-scatters), so that a rank late with its data is named at forward's first
all-gather under FSDP2.

Cost: two short runs shared by every test of the file (a module fixture; 10 to 30 s on a loaded
2-core machine). The fault is four times the untimed run's median step (``demo_fault_ms``).
Nothing asserts a duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("torch")

from conftest import DEMO_DEADLINE_S, DEMO_STEPS, DEMO_WINDOW, demo_fault_ms
from rank_support import START_METHOD
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.demo.launch import DemoRun

RANKS = 2
FORWARD, BACKWARD = "model.fwd_loss_cpu_wall", "model.backward_cpu_wall"


@dataclass(frozen=True)
class ShardedRuns:
    zero1: DemoRun
    fsdp2: DemoRun
    untimed: DemoRun


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, untimed_demo: DemoRun) -> ShardedRuns:
    """A healthy ZeRO-1 run, and an FSDP2 run whose rank 1 is late with its data."""

    def run(sharding: str, faults: tuple[Any, ...] = ()) -> DemoRun:
        config = DemoConfig(
            ranks=RANKS,
            steps=DEMO_STEPS,
            window=DEMO_WINDOW,
            out_dir=str(tmp_path_factory.mktemp(sharding)),
            sharding=sharding,
            faults=faults,
            quiet=True,
        )
        return launch(config, deadline_s=DEMO_DEADLINE_S, start_method=START_METHOD)

    late = parse_fault(f"data@1:{demo_fault_ms(untimed_demo, RANKS)}ms")
    return ShardedRuns(run("zero1"), run("fsdp2", (late,)), untimed_demo)


def _timed(window: dict[str, Any]) -> dict[tuple[str, str], list[int]]:
    """The window's timed collectives: (family, stage) -> the buckets, in order."""
    timed: dict[tuple[str, str], list[int]] = {}
    for c in window["communication"]["collectives"]:
        timed.setdefault((c["family"], c["stage"]), []).append(c["bucket"])
    return {where: sorted(buckets) for where, buckets in timed.items()}


def test_both_modes_train_the_model_the_ddp_run_trains(runs: ShardedRuns) -> None:
    """The same data, seed and optimizer: the sharded runs' losses are the DDP run's, to the
    rounding of a different reduction order (faults only sleep)."""
    for run in (runs.zero1, runs.fsdp2):
        assert sorted(run.losses) == list(range(RANKS))
        for rank, losses in run.losses.items():
            assert losses == pytest.approx(runs.untimed.losses[rank], rel=1e-4), rank


def test_zero1_times_ddps_buckets_and_its_broadcasts_every_step(runs: ShardedRuns) -> None:
    windows = runs.zero1.windows
    assert [w["n_steps"] for w in windows] == [DEMO_WINDOW] * (DEMO_STEPS // DEMO_WINDOW)
    for window in windows:
        timed = _timed(window)
        assert timed[("zero_broadcast", "optim.step_cpu_wall")] == [0], timed
        assert ("all_reduce", BACKWARD) in timed, timed
        broadcast = next(
            c for c in window["communication"]["collectives"] if c["family"] == "zero_broadcast"
        )
        buckets = [
            c["nbytes"] for c in window["communication"]["collectives"]
            if c["family"] == "all_reduce"
        ]  # fmt: skip
        assert broadcast["nbytes"] == sum(buckets)  # every parameter, once each


def test_fsdp2_times_its_collectives_and_names_the_rank_late_with_its_data(
    runs: ShardedRuns,
) -> None:
    """Every block and the root are sharded: forward all-gathers each, backward all-gathers and
    reduce-scatters each. Rank 1 sleeps before its forward every step: the other waits for it in
    forward's first all-gather, which names rank 1."""
    for window in runs.fsdp2.windows:
        timed = _timed(window)
        assert set(timed) == {
            ("all_gather", FORWARD), ("all_gather", BACKWARD), ("reduce_scatter", BACKWARD)
        }, timed  # fmt: skip
        assert timed[("all_gather", FORWARD)][0] == 0
        comm = window["communication"]
        late = comm["late"]
        assert comm["late_rank"] == 1, (window["window"], comm)
        assert (late["family"], late["bucket"], late["stage"]) == ("all_gather", 0, FORWARD)
