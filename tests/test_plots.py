"""The figures on a 7-stage run: which steps the frontier figure shows, the leader written per
window, label spacing, and real PNGs from both figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier import analyze
from stagefrontier.formats.packet import Packet, write_packet
from stagefrontier.formats.run_folder import RunWindows, load_run
from stagefrontier.render.plots import (
    OTHER_RANK,
    _spread,
    captured_steps,
    leader_text,
    plot_shares_over_time,
    plot_worst_step,
    rank_styles,
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


def _folder(
    tmp_path: Path, stages: tuple[str, ...] = STAGES, costs: dict[int, Any] | None = None
) -> Path:
    """Two windows of 9 steps on 3 ranks; rank 1's data wait grows with the step, and step 4 of
    the second window is the slowest of the run. ``costs``: a window's ``self_cost``."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "packets"
    folder.mkdir(parents=True)
    for w in range(2):
        d = rng.uniform(0.001, 0.004, size=(9, 3, len(STAGES)))
        d[:, 1, 0] += 0.02 + 0.002 * np.arange(9)
        if w == 1:
            d[4, 1, 0] += 0.2
        meta: dict[str, Any] = {"window": w, "first_step": 9 * w, "last_step": 9 * w + 8}
        meta["ranks_present"] = [0, 1, 2]
        if costs and w in costs:
            meta["self_cost"] = costs[w]
        packet = Packet.of_window(d, analyze(d, stages), meta=meta)
        write_packet(folder / f"window-{w:06d}.json", packet)
    return tmp_path


def _run(
    tmp_path: Path, stages: tuple[str, ...] = STAGES, costs: dict[int, Any] | None = None
) -> RunWindows:
    return load_run(_folder(tmp_path, stages, costs))


def _captured(tmp_path: Path, steps: list[int]) -> None:
    """An incident that captured ``steps`` in the folder."""
    from stagefrontier.formats.incident import new_incident
    from stagefrontier.render.incident import write_incident

    incident = new_incident("w00001", "window")
    incident.update(captured=True, steps=steps)
    write_incident(tmp_path / "incidents" / "w00001", incident)


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
    reports = [report.to_dict() for report, _ in run.windows]
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


def test_windows_the_router_slowed_are_left_out_of_the_worst_step(tmp_path: Path) -> None:
    # the worst step (step 4 of window 1) is in a window the router slowed
    run = _run(tmp_path / "slowed", costs={1: {"router_cpu_s": {"max": 2.5, "median": 0.3}}})
    packet, shown = steps_to_show(run)
    assert packet.meta["window"] == 0
    assert "window(s) 1 left out: the profiler router's capture slowed them" in shown[-1][1]
    run = _run(tmp_path / "idle", costs={1: {"router_cpu_s": {"max": 1e-6, "median": 0.0}}})
    assert steps_to_show(run)[0].meta["window"] == 1  # a negligible router cost is not a slowdown
    plot_worst_step(run, tmp_path / "frontier.png")


def test_a_captured_incidents_window_is_left_out_and_said_when_every_window_is(
    tmp_path: Path,
) -> None:
    for folder in (tmp_path / "one", tmp_path / "every"):
        _captured(folder, [11, 13])  # inside window 1 (steps 9-17)
    assert steps_to_show(_run(tmp_path / "one"))[0].meta["window"] == 0
    cost = {"router_cpu_s": {"max": 1.0, "median": 1.0}}
    packet, shown = steps_to_show(_run(tmp_path / "every", costs={0: cost}))
    assert packet.meta["window"] == 1
    assert "every window carries the profiler router's capture cost" in shown[-1][1]


def test_eight_ranks_get_eight_distinct_colours_and_markers() -> None:
    totals = np.arange(8.0)
    styles = rank_styles(totals, np.array([3, 3]), np.array([5.0, 1.0]), list(range(10, 18)))
    assert len({s["color"] for s in styles}) == 8 and len({s["marker"] for s in styles}) == 8
    assert [s["label"] for s in styles] == [f"rank {r}" for r in range(10, 18)]


def test_beyond_eight_ranks_the_leaders_and_the_median_rank_stand_out() -> None:
    totals = np.linspace(1.0, 2.0, 16)
    setters, advances = np.array([9, 4, 9]), np.array([3.0, 1.0, 0.5])
    styles = rank_styles(totals, setters, advances, [100 + r for r in range(16)])
    labeled = {r: s["label"] for r, s in enumerate(styles) if "label" in s}
    assert labeled == {
        9: "rank 109 (sets the frontier)",
        4: "rank 104 (sets the frontier)",
        8: "rank 108 (median rank)",
    }
    assert styles[9]["color"] != styles[4]["color"] != styles[8]["color"]
    assert all(s["color"] == OTHER_RANK for r, s in enumerate(styles) if r not in labeled)


def test_figure_titles_and_labels_break_their_lines_and_escape_names(tmp_path: Path) -> None:
    """The figure's own line breaks are line breaks (they were drawn as a literal ``\\n``);
    a control character in a stage name is still shown escaped."""
    import matplotlib

    from html_support import simulated_run, with_incident

    folder = simulated_run(tmp_path / "run", 4, 3, slow=2)
    with_incident(folder, slow=2)  # window 1's steps were captured: left out of the worst step
    run = load_run(folder)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # the text kept as text
        worst = plot_worst_step(run, tmp_path / "worst.svg").read_text()
        shares = plot_shares_over_time(run, tmp_path / "shares.svg").read_text()
    for svg in (worst, shares):
        assert "\\n" not in svg
    assert "worst step of the run: step" in worst
    assert "window(s) 1 left out: the profiler router" in worst
    assert ">exposed<" in shares and ">ms/step<" in shares

    evil = _run(tmp_path / "evil", stages=("data\nnext\x1b[2J", *STAGES[1:]))
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        text = plot_shares_over_time(evil, tmp_path / "evil.svg").read_text()
    assert "data\\nnext\\x1b[2J" in text


def test_an_incidents_figure_shows_its_captured_steps(tmp_path: Path) -> None:
    _captured(tmp_path, [10, 12])
    run = _run(tmp_path)
    packet, shown = captured_steps(run, (10, 12))  # window 1 holds steps 9-17
    assert packet.meta["window"] == 1
    exposed = packet.d.sum(axis=2).max(axis=1)
    (_, first), (slowest, what) = shown
    assert slowest in (1, 2, 3) and exposed[slowest] == exposed[1:4].max()
    assert what == "slowest captured step (steps 10-12 were captured)" and "typical" in first
    # Steps no packet holds: the run's worst step, saying so.
    packet, shown = captured_steps(run, (500, 504))
    assert shown[-1][1].endswith("\nno packet holds the captured steps 500-504")


@pytest.mark.parametrize("names", [("ms", "pp1"), (".", "0", "1")])
def test_a_summarized_role_run_draws_roles_named_like_a_panel_or_a_gap(
    tmp_path: Path, names: tuple[str, ...]
) -> None:
    from stagefrontier.formats.run_digest import Bucket, Tallies
    from stagefrontier.render.plots import plot_bucket_shares

    shares = {"data.next_wait": 0.3, "model.forward": 0.7}
    buckets = [
        Bucket(
            {"window": 2 * i, "first_step": 20 * i},
            {"window": 2 * i + 1, "last_step": 20 * i + 19},
            2,
            (9.0, 10.0, 11.0),
            shares,
            "model.forward",
            {},
            {name: shares for name in names},
        )
        for i in range(5)
    ]
    run = RunWindows(tmp_path, list(shares), [], 10, Tallies(), buckets)
    figure = plot_bucket_shares(run, tmp_path / "shares.png")
    assert figure.read_bytes().startswith(PNG_MAGIC)
