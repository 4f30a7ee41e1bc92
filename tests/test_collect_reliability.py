"""One bad record costs one rank one window, never the collection: real spawned Gloo DDP ranks
whose payloads are corrupted on the wire (see collect_support.Job.corrupt_windows)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from collect_support import Job, launch, reasons

STEPS = 30
WINDOW = 10


@pytest.mark.parametrize("collect", ["store", "gloo"])
def test_a_window_that_does_not_decode_costs_its_rank_that_window_only(
    tmp_path: Path, collect: str
) -> None:
    run = launch(
        Job(
            out_dir=str(tmp_path),
            steps=STEPS,
            window=WINDOW,
            collect=collect,
            corrupt_windows={1: {1: "undecodable"}},
        )
    )
    windows = run.windows
    assert [w["window"] for w in windows] == [0, 1, 2]
    bad = windows[1]
    assert bad["missing_ranks"] == [1] and bad["ranks_present"] == [0]
    assert any(r.startswith("rank 1 window rejected") and "first_step" in r for r in reasons(bad))
    for w in (windows[0], windows[2]):
        assert w["gather_ok"] and w["ranks_present"] == [0, 1], reasons(w)
    assert not any("disabled" in r or "dead" in r for w in windows for r in reasons(w))


def test_a_rank_whose_window_fails_the_analysis_is_dropped_and_the_rest_analyzed(
    tmp_path: Path,
) -> None:
    run = launch(
        Job(
            out_dir=str(tmp_path),
            ranks=3,
            steps=STEPS,
            window=WINDOW,
            collect="store",
            corrupt_windows={2: {1: "unanalyzable"}},
        )
    )
    windows = run.windows
    assert [w["window"] for w in windows] == [0, 1, 2]
    bad = windows[1]
    assert bad["ranks_present"] == [0, 1] and bad["missing_ranks"] == [2]
    assert bad["n_ranks"] == 2 and bad["top1"] is not None
    dropped = [r for r in reasons(bad) if r.startswith("rank 2 window dropped")]
    assert len(dropped) == 1 and "SideEvidenceError" in dropped[0], reasons(bad)
    for w in (windows[0], windows[2]):
        assert w["gather_ok"] and w["ranks_present"] == [0, 1, 2], reasons(w)
    assert len(list((tmp_path / "packets").glob("*.json"))) == 3


def test_a_disabled_rank_is_announced_and_every_window_is_written(tmp_path: Path) -> None:
    """4 ranks, windows of 20, rank 3's timer built with enabled=False: rank 0 learns it at
    once, so it never waits for rank 3 and its queue never overflows."""
    run = launch(
        Job(
            out_dir=str(tmp_path),
            ranks=4,
            steps=200,
            window=20,
            collect="store",
            silent_ranks=(3,),
            timeout_s=10.0,
        )
    )
    windows = run.windows
    assert [w["window"] for w in windows] == list(range(10))
    for w in windows:
        assert w["ranks_present"] == [0, 1, 2] and w["missing_ranks"] == [3]
        assert "rank(s) [3] send no windows: their timers are disabled" in reasons(w)
        assert not any("dropped" in r or "stopped waiting" in r for r in reasons(w))
