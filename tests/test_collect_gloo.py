"""collect="gloo": real spawned Gloo DDP ranks exchanging windows over a dedicated group.

Each run spawns 2 ranks around an ephemeral-port TCPStore with a hard deadline; faults only sleep
or drop windows, so every run must reproduce the untimed run's losses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from collect_support import DATA, Job, launch, reasons
from stagefrontier.collect import CollectConfig, CollectorSettings, GlooCollector, make_collector


def test_gloo_windows_route_to_the_delayed_rank_and_resync_after_a_drop(
    tmp_path: Path, untimed_job_losses: dict[int, list[float]]
) -> None:
    # Rank 1 waits 40 ms per step for data; its hand-off drops window 1 as a full queue would,
    # so it offers window 2 while rank 0 offers window 1.
    run = launch(Job(str(tmp_path), data_delay_s={1: 0.04}, drop_windows={1: (1,)}))
    windows = run.windows
    assert [w["window"] for w in windows] == [0, 1, 2]
    assert all(w["world_size"] == 2 for w in windows)
    for w in (windows[0], windows[2]):
        assert w["top1"] == DATA
        assert w["gather_ok"]
        assert w["ranks_present"] == [0, 1]
        assert w["leaders"][DATA] == 1
    resynced = windows[1]
    assert not resynced["gather_ok"]
    assert resynced["missing_ranks"] == [1]
    assert any("offered window 2 for window 1" in r for r in reasons(resynced))
    # the window after the drop is merged again and says that rank 1 dropped one
    assert any("rank 1 dropped 1 window(s)" in r for r in reasons(windows[2]))
    assert not any("dead" in r for w in windows for r in reasons(w))
    assert len(list((tmp_path / "packets").glob("*.json"))) == 3
    assert run.losses == untimed_job_losses


def test_gloo_group_dies_after_a_rank_never_joins_and_later_windows_downgrade(
    tmp_path: Path, untimed_job_losses: dict[int, list[float]]
) -> None:
    # Rank 1 builds the group but its timer is disabled: rank 0's first window operation times
    # out after 0.5 s, the group is marked dead, and every later window is rank 0's alone.
    run = launch(
        Job(
            out_dir=str(tmp_path),
            window=5,
            timeout_s=0.5,
            step_sleep_s=0.03,
            silent_ranks=(1,),
            queue_size={0: 8},
        )
    )
    windows = run.windows
    assert [w["window"] for w in windows] == list(range(6))
    for w in windows:
        assert not w["gather_ok"]
        assert w["missing_ranks"] == [1]
        assert w["ranks_present"] == [0]
        assert "telemetry_limited" in w["labels"]
        assert any("gloo collection group dead" in r for r in reasons(w))
    assert any("window 0 exchange failed" in r for r in reasons(windows[0]))
    assert run.losses == untimed_job_losses


def test_gloo_mode_needs_torch_distributed(tmp_path: Path) -> None:
    from stagefrontier.errors import StageFrontierError

    with pytest.raises(StageFrontierError, match=r"collect='gloo' needs torch\.distributed"):
        make_collector(CollectConfig(mode="gloo", out_dir=tmp_path, timeout_s=1.0, queue_size=1))


def test_gloo_collector_of_one_rank_analyzes_locally(tmp_path: Path) -> None:
    import numpy as np

    from stagefrontier.window.rank import RankWindow

    collector = GlooCollector(CollectorSettings(0, 1, tmp_path), group=None)
    stages = (DATA, "step.other_cpu_wall")
    durations = np.array([[3_000_000, 1_000_000]] * 4, dtype=np.int64)
    window = RankWindow(0, 0, 3, 0, stages, durations, durations.sum(axis=1))
    assert collector.submit(window)
    collector.close()
    collector.close()
    lines = (tmp_path / "windows.jsonl").read_text().splitlines()
    assert len(lines) == 1
