"""Real multi-process Gloo DDP runs: routing of injected delays and every collection failure path.

Each test spawns real ranks around an ephemeral-port TCPStore (see stagefrontier.demo.launch)
with a hard deadline. Faults only sleep, so a faulty run must reproduce the untimed run's losses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import DEMO_DEADLINE_S, DEMO_STEPS, DEMO_WINDOW, demo_fault_ms
from rank_support import START_METHOD as FORK
from rank_support import run_job, torchrun_command
from stagefrontier import analyze
from stagefrontier.demo import DeadlineExceeded, DemoConfig, launch, parse_fault
from stagefrontier.demo.launch import DemoRun
from stagefrontier.formats.packet import read_packet

STEPS = DEMO_STEPS
WINDOW = DEMO_WINDOW
DEADLINE_S = DEMO_DEADLINE_S


def _config(tmp_path: Path, name: str, **kwargs: object) -> DemoConfig:
    """The 2-rank demo of STEPS steps in windows of WINDOW, writing to ``tmp_path / name``."""
    return DemoConfig(
        ranks=kwargs.pop("ranks", 2),  # type: ignore[arg-type]
        steps=STEPS,
        window=WINDOW,
        out_dir=str(tmp_path / name),
        collect_timeout_s=kwargs.pop("collect_timeout_s", 5.0),  # type: ignore[arg-type]
        quiet=True,
        **kwargs,  # type: ignore[arg-type]
    )


def _run(tmp_path: Path, name: str, **kwargs: object) -> DemoRun:
    return launch(_config(tmp_path, name, **kwargs), deadline_s=DEADLINE_S, start_method=FORK)


@pytest.fixture
def untimed_losses(untimed_demo: DemoRun) -> dict[int, list[float]]:
    return untimed_demo.losses


def _majority(values: list[object]) -> object:
    return Counter(values).most_common(1)[0][0]


@pytest.mark.parametrize(
    ("ranks", "where", "stage", "leader"),
    [
        (2, "data@1", "data.next_wait", 1),
        (4, "data@2", "data.next_wait", 2),
        (2, "forward@1", "model.fwd_loss_cpu_wall", 1),
        # A delay inside backward's computation (a gradient hook) is absorbed by the gradient
        # all-reduce: every rank leaves backward together, so the stage is identified but no
        # single rank leads it; the timed buckets name the late rank (below).
        (2, "backward_compute@1", "model.backward_cpu_wall", None),
    ],
)
def test_injected_delay_routes_to_its_stage_and_rank(
    tmp_path: Path,
    untimed_demo: DemoRun,
    ranks: int,
    where: str,
    stage: str,
    leader: int | None,
) -> None:
    fault = parse_fault(f"{where}:{demo_fault_ms(untimed_demo, ranks)}ms")
    run = _run(tmp_path, "fault", ranks=ranks, faults=(fault,))
    windows = run.windows
    assert len(windows) == STEPS // WINDOW
    assert all(w["gather_ok"] and w["world_size"] == ranks for w in windows)
    assert _majority([w["top1"] for w in windows]) == stage
    assert all(stage in w["routing_set"] for w in windows)
    if leader is not None:
        assert _majority([w["leaders"][stage] for w in windows]) == leader
    else:  # the demo times its DDP buckets: rank 1 reaches them late
        assert _majority([w["communication"]["late_rank"] for w in windows]) == 1
    if ranks == 2:
        assert run.losses == untimed_demo.losses


def test_packet_reads_back_to_the_identical_report(tmp_path: Path) -> None:
    run = _run(tmp_path, "packets", faults=(parse_fault("data@1:120ms"),))
    packets = sorted((run.out_dir / "packets").glob("*.json"))
    assert len(packets) == STEPS // WINDOW
    for path, record in zip(packets, run.windows, strict=True):
        packet = read_packet(path)
        again = analyze(
            packet.d, packet.stages, gates=packet.gates, roles=packet.roles, side=packet.side
        )
        assert again == packet.report
        assert again.to_dict()["shares"] == record["shares"]
        assert path.stat().st_size < 50_000


def test_rank_that_never_sends_is_reported_missing(
    tmp_path: Path, untimed_losses: dict[int, list[float]]
) -> None:
    run = _run(tmp_path, "silent", untimed_ranks=(1,), collect_timeout_s=1.0)
    windows = run.windows
    assert len(windows) == STEPS // WINDOW
    for w in windows:
        assert not w["gather_ok"]
        assert w["missing_ranks"] == [1]
        assert w["ranks_present"] == [0]
        assert "telemetry_limited" in w["labels"]
        assert any("missing ranks [1]" in r for r in w["reasons"]["telemetry_limited"])
    assert run.losses == untimed_losses


def test_rank_with_a_different_stage_list_is_not_merged(
    tmp_path: Path, untimed_losses: dict[int, list[float]]
) -> None:
    run = _run(tmp_path, "mismatch", extra_stage_ranks=(1,))
    windows = run.windows
    assert len(windows) == STEPS // WINDOW
    for w in windows:
        assert w["mismatched_ranks"] == [1]
        assert w["ranks_present"] == [0]
        assert w["n_ranks"] == 1
        assert any("not merged" in r for r in w["reasons"]["telemetry_limited"])
    assert run.losses == untimed_losses


def test_store_that_dies_mid_run_downgrades_later_windows(
    tmp_path: Path, untimed_losses: dict[int, list[float]]
) -> None:
    config = _config(tmp_path, "dead", collect_timeout_s=2.0)
    run = launch(config, deadline_s=DEADLINE_S, kill_store_after_step=WINDOW + 2, start_method=FORK)
    windows = run.windows
    assert len(windows) == STEPS // WINDOW
    assert windows[0]["gather_ok"]
    assert not windows[-1]["gather_ok"]
    assert any("store" in r for r in windows[-1]["reasons"]["telemetry_limited"])
    assert run.losses == untimed_losses


def test_store_that_dies_before_the_first_window_leaves_each_window_to_rank_0(
    tmp_path: Path, untimed_losses: dict[int, list[float]]
) -> None:
    """The collectors connect at their first window, to a store already gone: the connection
    is refused at once (not retried for the job store's own 60 s, past close's wait), and every
    window is rank 0's own, with the reason."""
    config = _config(tmp_path, "dead-early", collect_timeout_s=2.0)
    run = launch(config, deadline_s=DEADLINE_S, kill_store_after_step=0, start_method=FORK)
    windows = run.windows
    assert len(windows) == STEPS // WINDOW
    for w in windows:
        assert not w["gather_ok"] and w["ranks_present"] == [0]
        assert any("store" in r for r in w["reasons"]["telemetry_limited"])
    assert run.losses == untimed_losses


def test_restart_ignores_and_deletes_the_previous_attempts_keys(tmp_path: Path) -> None:
    stale = [f"stagefrontier/job/0/w{w}/r1" for w in range(STEPS // WINDOW)]
    seen: dict[str, bool] = {}

    def plant(store: object) -> None:
        for key in stale:
            store.set(key, b"garbage from the previous attempt")  # type: ignore[attr-defined]

    def check(store: object) -> None:
        seen.update({key: bool(store.check([key])) for key in stale})  # type: ignore[attr-defined]

    env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "1"}
    config = _config(tmp_path, "restart", collect_timeout_s=10.0, env=env)
    run = launch(
        config, deadline_s=DEADLINE_S, store_setup=plant, store_teardown=check, start_method=FORK
    )
    assert all(w["gather_ok"] and w["ranks_present"] == [0, 1] for w in run.windows)
    assert not any(
        "rejected" in r for w in run.windows for r in w["reasons"].get("telemetry_limited", [])
    )
    assert seen == {key: False for key in stale}


def test_runs_under_torchrun(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "examples" / "ddp_torchrun.py"
    out = tmp_path / "torchrun"
    args = ("--steps", "40", "--window", "20", "--out", str(out))
    run_job(torchrun_command(example, *args, ranks=4), DEADLINE_S)
    lines = (out / "windows.jsonl").read_text().splitlines()
    assert len(lines) == 2
    import json

    for line in lines:
        record = json.loads(line)
        assert record["world_size"] == 4
        assert record["ranks_present"] == [0, 1, 2, 3]
        assert record["gather_ok"]


def test_run_without_torchrun_it_says_how_to_launch_it_in_one_line(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "examples" / "ddp_torchrun.py"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, str(example), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        env=env,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "torchrun --standalone --nproc-per-node 4 examples/ddp_torchrun.py" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_run_past_its_deadline_says_where_each_rank_is_stuck(tmp_path: Path) -> None:
    """Rank 1 sleeps for an hour in its data stage, rank 0 waits in the gradient all-reduce:
    at the deadline the launcher collects both ranks' stacks and names where each one is.

    The deadline falls once rank 1 has been inside its delay for a second (``stuck``: its fault
    marker's age), so both ranks are past their start-up whatever the machine's load, and the
    test waits out no fixed deadline (it waited 20 s or more, and a rank still importing torch
    at a loaded machine's 20 s failed it)."""
    config = DemoConfig(
        ranks=2,
        steps=3,
        window=3,
        faults=(parse_fault("data@1:3600000ms"),),
        out_dir=str(tmp_path / "stuck"),
        timed=False,
        quiet=True,
    )
    with pytest.raises(DeadlineExceeded, match="deadline") as caught:
        launch(config, deadline_s=DEMO_DEADLINE_S, start_method=FORK, stuck=(1,))
    message = str(caught.value)
    assert "rank 1 stuck at File" in message and "in delay" in message, message
    assert "rank 0 stuck at File" in message, message
    stacks = (tmp_path / "stuck" / "stacks-rank1.txt").read_text()
    assert "_train" in stacks and "Current thread" in stacks
