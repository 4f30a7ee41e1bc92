"""Node-level vs rank-level leads: the top stage's leading ranks and the hosts they run on, in the
record, the log line, the packet and the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stagefrontier.formats.run_folder import load_run
from stagefrontier.render.text import run_report_text, window_details
from stagefrontier.sinks import PacketSink
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall", "residual")
HOSTS = {r: "node-a" if r < 4 else "node-b" for r in range(8)}
MS = 1_000_000


def _windows(slow: dict[int, int], hosts: dict[int, str], seed: int = 0) -> list[RankWindow]:
    """8 ranks, 30 steps: ~10 ms per stage, plus ``slow[rank]`` ms of data wait jittered per step
    (so the slow ranks take turns at the frontier)."""
    rng = np.random.default_rng(seed)
    out = []
    for rank in range(8):
        durations = rng.integers(9 * MS, 11 * MS, size=(30, len(STAGES)))
        durations[:, -1] = 0
        if rank in slow:
            durations[:, 0] += slow[rank] * MS + rng.integers(0, 8 * MS, size=30)
        wall = durations.sum(axis=1)
        out.append(
            RankWindow(
                0, 0, 29, rank, STAGES, durations, wall, hostname=hosts[rank], pid=100 + rank
            )
        )
    return out


def _record(slow: dict[int, int], hosts: dict[int, str]) -> dict[str, object]:
    return analyze_merged(merge_windows(_windows(slow, hosts), 8)).record


def test_slow_ranks_all_on_one_host_are_a_node_level_lead() -> None:
    record = _record({4: 60, 5: 60, 6: 60, 7: 60}, HOSTS)
    assert record["top1"] == "data.next_wait"
    lead = record["lead"]
    assert lead["scope"] == "node" and lead["hosts"] == ["node-b"]
    assert sorted(lead["ranks"]) == [4, 5, 6, 7]
    assert record["pids"]["5"] == 105 and record["local_ranks"]["5"] == 0


def test_one_slow_rank_is_a_rank_level_lead() -> None:
    record = _record({6: 60}, HOSTS)
    assert record["lead"] == {
        "stage": "data.next_wait",
        "ranks": [6],
        "hosts": ["node-b"],
        "scope": "rank",
    }


def test_slow_ranks_on_two_hosts_are_not_called_a_node() -> None:
    record = _record({1: 60, 6: 60}, HOSTS)
    assert record["lead"]["scope"] == "hosts"
    assert sorted(record["lead"]["ranks"]) == [1, 6]
    assert record["lead"]["hosts"] == ["node-a", "node-b"]


def test_a_single_host_job_cannot_tell_node_from_rank() -> None:
    record = _record({4: 60, 5: 60}, {r: "box" for r in range(8)})
    assert record["lead"]["scope"] == "one_host_job"


def test_node_level_lead_reaches_the_log_line_packet_and_report(tmp_path: Path) -> None:
    slow = {4: 60, 5: 60, 6: 60, 7: 60}
    analyzed = analyze_merged(merge_windows(_windows(slow, HOSTS), 8))
    line = window_details(analyzed.report, analyzed.record)
    assert "led by node-b (node-level: ranks 4,5,6,7 all on node-b) | route " in line, line
    assert "Node node-b (ranks 4-7)'s data loading runs " in line, line
    PacketSink(tmp_path).write(analyzed)
    run = load_run(tmp_path)
    assert run.windows[0][1]["lead"]["scope"] == "node"
    assert "node-level: ranks" in run_report_text(run)
