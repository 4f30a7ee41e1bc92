"""The window a timer closes on holds what was left of the run, often one step: its line names
no leading rank, and the run's report sums up with the last full window instead."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stagefrontier.formats.run_folder import load_run
from stagefrontier.render.text import run_report_text
from stagefrontier.sinks import PacketSink, summary_line
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall", "residual")
RANKS = 4
MS = 1_000_000


def _window(window: int, first_step: int, n_steps: int, seed: int) -> list[RankWindow]:
    """Four healthy ranks, ~10 ms per stage with jitter, except that rank 1's backward is 30 ms
    slower in the window's first step (one step's front rank, as jitter makes one)."""
    rng = np.random.default_rng(seed)
    out = []
    for rank in range(RANKS):
        durations = rng.integers(9 * MS, 11 * MS, size=(n_steps, len(STAGES)))
        durations[:, -1] = 0
        if rank == 1:
            durations[0, 2] += 30 * MS
        last = first_step + n_steps - 1
        wall = durations.sum(axis=1)
        out.append(RankWindow(window, first_step, last, rank, STAGES, durations, wall))
    return out


def test_a_one_step_window_names_no_rank_and_the_report_sums_up_a_full_one(
    tmp_path: Path,
) -> None:
    sink = PacketSink(tmp_path)
    full = analyze_merged(merge_windows(_window(0, 0, 40, seed=0), RANKS))
    sink.write(full)
    tail = analyze_merged(merge_windows(_window(1, 40, 1, seed=1), RANKS))
    sink.write(tail)

    line = summary_line(tail.record, tail.report)
    assert "no leader named over 1 step |" in line, line
    assert "This window holds only 1 step, too few to name a leading rank" in line, line
    assert "rank 1" not in line.lower(), line

    text = run_report_text(load_run(tmp_path))
    assert "Verdict (last full window, 0): " in text, text
    assert "Reasons (last full window, 0):" in text, text
    assert "over 40 step(s)" in text and "over 1 step(s)" not in text, text
    assert "window 1" not in text.split("Verdict (")[1], text
