"""Slow analysis and late ranks in a real 2-rank store-collected job.

A full hand-off queue: rank 0's analysis is slower than its windows arrive, so windows are
dropped and counted, training is unaffected, and every window rank 0 does analyze still has both
ranks (a sender never deletes a key rank 0 has yet to read). A late rank: its windows arrive
after rank 0's deadline and are reported missing.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from collect_support import Job, launch, reasons

STEPS = 40
WINDOW = 2


def test_full_queue_drops_windows_with_a_count_and_training_completes(tmp_path: Path) -> None:
    untimed = launch(Job(out_dir=str(tmp_path / "untimed"), steps=STEPS, collect="off"))
    run = launch(
        Job(
            out_dir=str(tmp_path / "slow"),
            steps=STEPS,
            window=WINDOW,
            collect="store",
            step_sleep_s=0.01,
            queue_size={0: 1, 1: 16},
            sink_sleep_s=0.3,
        )
    )
    assert run.losses == untimed.losses
    windows = run.windows
    indices = [w["window"] for w in windows]
    assert indices == sorted(indices)
    assert 1 <= len(windows) < STEPS // WINDOW
    dropped = []
    for w in windows:
        assert w["gather_ok"], w["missing_ranks"]
        assert w["ranks_present"] == [0, 1]
        for reason in reasons(w):
            match = re.fullmatch(r"rank 0 dropped (\d+) window\(s\): hand-off queue full", reason)
            if match:
                dropped.append(int(match.group(1)))
    assert dropped and all(n >= 1 for n in dropped)
    assert len(windows) + sum(dropped) <= STEPS // WINDOW
    # each gap in the analyzed windows is exactly the count the next analyzed window reports
    gaps = [b - a - 1 for a, b in itertools.pairwise(indices) if b - a > 1]
    assert sorted(gaps) == sorted(dropped)


def test_rank_late_beyond_the_deadline_is_reported_missing(
    tmp_path: Path, untimed_job_losses: dict[int, list[float]]
) -> None:
    """Rank 1's sender thread waits 2 s before each send (a fault injected from outside the
    collector), rank 0 waits 0.5 s: every window is analyzed without rank 1."""
    run = launch(
        Job(
            out_dir=str(tmp_path / "late"),
            window=10,
            collect="store",
            timeout_s=0.5,
            late_send_s={1: 2.0},
        )
    )
    assert len(run.windows) == 3
    for w in run.windows:
        assert w["missing_ranks"] == [1]
        assert "telemetry_limited" in w["labels"]
    assert run.losses == untimed_job_losses
