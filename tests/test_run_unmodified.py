"""``stagefrontier run --out DIR --router --standalone --nproc-per-node 4 SCRIPT`` on training
scripts with no StageFrontier in them (examples/unmodified), 4 real Gloo ranks on torchrun's
launcher: the stages come from PyTorch's hooks, and a stall is routed to its stage and rank and
confirmed by an incident naming the function that stalls.

Cost: the two stalled jobs are session fixtures (tests/conftest.py), 30 to 40 s each on a
loaded 2-core machine; the healthy job with accumulation, the two Lightning jobs and the two
Hugging Face jobs 25 to 50 s each (the Hugging Face data stall is the latest one added).
Nothing asserts a duration. The whole matrix (every script healthy and stalled):
benchmarks/run_matrix.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from auto_support import RANKS, AutoRun, run_unmodified

AUTO_STAGES = [
    "data.next_wait",
    "model.fwd_loss_cpu_wall",
    "model.backward_cpu_wall",
    "optim.step_cpu_wall",
    "step.other_cpu_wall",
]


STALLS = pytest.mark.parametrize(
    "stall, stage, rank, function",
    [
        ("data@2", "data.next_wait", 2, "slow_sample"),
        ("forward@1", "model.fwd_loss_cpu_wall", 1, "slow_forward"),
    ],
    ids=["data", "forward"],
)
"""A stall on one rank, its stage and the script's function it runs in."""


def _led_by(run: AutoRun, stage: str, rank: int) -> int:
    """How many windows of ``run`` put ``stage`` on top, led by ``rank``."""
    return sum(r["top1"] == stage and r["leaders"][stage] == rank for r in run.records)


def _clean(run: AutoRun) -> None:
    """Every rank in every window, the stage contract kept, no traceback in the job's output."""
    assert "Traceback" not in run.output, run.output[-6000:]
    assert run.records, run.output[-3000:]
    for record in run.records:
        assert record["ranks_present"] == list(range(RANKS)), record["missing_ranks"]
        assert record["contract_violations"] == 0


def test_a_forward_stall_is_routed_to_rank_1_and_confirmed(forward_stall_run: AutoRun) -> None:
    run = forward_stall_run
    _clean(run)
    assert run.records[0]["stages"] == AUTO_STAGES
    # 49 steps timed: the first is watched to learn the loop's shape
    assert sum(r["n_steps"] for r in run.records) == 49
    assert _led_by(run, "model.fwd_loss_cpu_wall", 1) > len(run.records) / 2, [
        (r["top1"], r["leaders"]) for r in run.records
    ]
    confirmed = [i for i in run.incidents if i["confirmed"]]
    assert confirmed, [i["reasons"] for i in run.incidents]
    incident = confirmed[0]
    assert incident["stage"] == "model.fwd_loss_cpu_wall" and incident["leader_rank"] == 1
    assert "slow_forward" in incident["op_diff"][0]["name"], incident["op_diff"][:3]


def test_a_data_stall_in_the_workers_is_routed_to_rank_2_and_confirmed(
    data_stall_run: AutoRun,
) -> None:
    run = data_stall_run
    _clean(run)
    assert _led_by(run, "data.next_wait", 2) > len(run.records) / 2, [
        (r["top1"], r["leaders"]) for r in run.records
    ]
    # the workers are watched from inside, as timer.iter watches them
    for record in run.records:
        figures = record["loader_workers"]
        assert sorted(figures) == [str(r) for r in range(RANKS)], figures
        assert all(f["workers"] == 2 for f in figures.values())
    confirmed = [i for i in run.incidents if i["confirmed"]]
    assert confirmed, [i["reasons"] for i in run.incidents]
    incident = confirmed[0]
    assert incident["stage"] == "data.next_wait" and incident["leader_rank"] == 2
    assert "slow_sample" in incident["worker_op_diff"][0]["name"], incident["worker_op_diff"]


def test_a_healthy_run_with_accumulation_opens_no_incident(tmp_path: Path) -> None:
    """Two micro-batches per optimizer step become microsteps; no stall, no incident."""
    run = run_unmodified(tmp_path, "train_ddp.py", "--accumulate", "2", "--steps", "40")
    _clean(run)
    assert run.incidents == []
    assert not (tmp_path / "incidents").exists()
    record = run.records[0]
    assert record["accumulation_factor"] == 2
    assert "model.fwd_loss_cpu_wall[1]" in record["stages"]
    assert "model.backward_cpu_wall[1]" in record["stages"]
    assert sum(r["n_steps"] for r in run.records) == 39
    # the automatic hooks time the DDP model's buckets too (timer.watch_ddp): no late rank
    assert all(r["communication"]["late_rank"] is None for r in run.records), [
        r["communication"] for r in run.records
    ]


def _confirmed(run: AutoRun, stage: str, rank: int, function: str) -> None:
    """Routed to ``stage`` and ``rank`` in most windows, and the first incident confirmed there
    with ``function`` on top of its op diff."""
    assert _led_by(run, stage, rank) > len(run.records) / 2, [
        (r["top1"], r["leaders"]) for r in run.records
    ]
    assert run.incidents, [r["labels"] for r in run.records]
    incident = min(run.incidents, key=lambda i: i["window"])
    assert incident["stage"] == stage and incident["leader_rank"] == rank
    assert incident["confirmed"] is True, incident["reasons"]
    assert function in incident["op_diff"][0]["name"], incident["op_diff"][:3]


@STALLS
def test_a_stall_in_a_lightning_fit_is_routed_and_confirmed(
    tmp_path: Path, stall: str, stage: str, rank: int, function: str
) -> None:
    """The Lightning Trainer gets its callback, which times the run in its own stages; a stall
    on one rank is routed and confirmed naming the script's function. One job each."""
    pytest.importorskip("lightning")
    run = run_unmodified(tmp_path, "lightning_fit.py", "--steps", "40", "--stall", stall)
    _clean(run)
    assert "stagefrontier: Lightning Trainer found" in run.output
    from stagefrontier.integrations.lightning import LIGHTNING_STAGES

    assert run.records[0]["stages"] == list(LIGHTNING_STAGES)
    assert sum(r["n_steps"] for r in run.records) == 40
    _confirmed(run, stage, rank, function)


@STALLS
def test_a_stall_in_a_hugging_face_trainer_is_routed_and_confirmed(
    tmp_path: Path, stall: str, stage: str, rank: int, function: str
) -> None:
    """The Hugging Face Trainer gets its callback; a stall on one rank is routed and confirmed
    naming the script's function. One job each. The data stall runs with the Trainer's default
    ``average_tokens_across_devices``, whose cross-rank gather of the step's label tokens, after
    the fetches, makes every rank wait for the slow one: the callback's data stage is the
    loader's own fetches (the HF test used to cover the forward stall only; the data job is
    25 to 50 s more)."""
    pytest.importorskip("transformers")
    run = run_unmodified(tmp_path, "hf_trainer.py", "--steps", "40", "--stall", stall)
    _clean(run)
    assert "stagefrontier: Hugging Face Trainer found" in run.output
    assert "model.fwd_loss_cpu_wall" in run.records[0]["stages"]
    assert sum(r["n_steps"] for r in run.records) == 40
    _confirmed(run, stage, rank, function)
