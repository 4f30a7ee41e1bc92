"""The figures on a 7-stage run: which steps the frontier figure shows, the leader written per
window, label spacing, and real PNGs from both figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stagefrontier import analyze
from stagefrontier.formats.packet import Packet, read_packet, write_packet
from stagefrontier.formats.run_folder import RunWindows
from stagefrontier.render.plots import (
    _spread,
    leader_text,
    plot_shares_over_time,
    plot_worst_step,
    steps_to_show,
)

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STAGES = (
    "data.next_wait",
    "model.fwd_loss_cpu_wall",
    "model.backward_cpu_wall",
    "callbacks.cpu_wall",
    "optim.step_cpu_wall",
    "batch_end.cpu_wall",
    "step.other_cpu_wall",
)


def _run(tmp_path: Path) -> RunWindows:
    """Two windows of 9 steps on 3 ranks; rank 1's data wait grows with the step, and step 4 of
    the second window is the slowest of the run."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "packets"
    folder.mkdir()
    for w in range(2):
        d = rng.uniform(0.001, 0.004, size=(9, 3, len(STAGES)))
        d[:, 1, 0] += 0.02 + 0.002 * np.arange(9)
        if w == 1:
            d[4, 1, 0] += 0.2
        meta = {"window": w, "first_step": 9 * w, "last_step": 9 * w + 8}
        meta["ranks_present"] = [0, 1, 2]
        packet = Packet.of_window(d, analyze(d, STAGES), meta=meta)
        write_packet(folder / f"window-{w:06d}.json", packet)
    packets = [read_packet(p) for p in sorted(folder.iterdir())]
    return RunWindows(tmp_path, packets, [])


def test_the_frontier_figure_shows_the_worst_step_after_its_windows_typical_step(
    tmp_path: Path,
) -> None:
    packet, shown = steps_to_show(_run(tmp_path))
    assert packet.meta["window"] == 1
    exposed = packet.d.sum(axis=2).max(axis=1)
    (typical, first), (worst, second) = shown
    assert worst == 4 and second == "worst step of the run"
    assert exposed[typical] == np.median(exposed) and "typical" in first


def test_leader_text_names_the_top_stages_rank_or_says_there_is_none(tmp_path: Path) -> None:
    run = _run(tmp_path)
    reports = [p.report.to_dict() for p in run.packets]
    assert [r["top1"] for r in reports] == ["data.next_wait", "data.next_wait"]
    assert [leader_text(r) for r in reports] == ["rank 1", "rank 1"]
    quiet = {"top1": "data.next_wait", "semantic_localization": {}, "leaders": {}}
    assert leader_text(quiet) == "no single leader"


def test_labels_are_pushed_apart_but_never_below_their_arrow() -> None:
    assert _spread([0.0, 1.0, 1.5, 10.0], gap=2.0) == [0.0, 2.0, 4.0, 10.0]


def test_both_figures_render_for_seven_stages(tmp_path: Path) -> None:
    run = _run(tmp_path)
    for path in (
        plot_worst_step(run, tmp_path / "frontier.png"),
        plot_shares_over_time(run, tmp_path / "shares.png"),
    ):
        assert path.read_bytes().startswith(PNG_MAGIC)
