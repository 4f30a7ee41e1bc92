"""Stage names that a profiler trace cannot carry as they are (issue 23, item 16).

Kineto writes a range whose name holds a tab, an ESC, a bell, DEL or any non-ASCII character as
"unknown", drops newlines, cuts the name at a NUL, turns ``\\`` into ``/`` and writes ``"``
unescaped (the whole trace is then invalid JSON). A capture's stage ranges therefore carry an
encoded name, which every trace reader decodes back to the stage's.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from stagefrontier.analysis.schema import range_name, stage_of_range
from trace_support import manual_incident

ODD = 'data "next"\x1b[31m\n\twait\\ \u202e%41 é'
"""A data stage whose name holds a quote, an ESC sequence, a newline, a tab, a backslash, a
bidi override, something that looks like an escape and a non-ASCII letter."""
FORWARD = "model.fwd\x07loss"


@pytest.mark.parametrize(
    "stage",
    [ODD, FORWARD, "data.next_wait", "50% done", "a%41", "x[2]", "\x00", "naïve"],
)
def test_a_range_name_is_plain_ascii_and_decodes_to_its_stage(stage: str) -> None:
    name = range_name(stage)
    assert all(" " <= ch <= "~" and ch not in '"\\' for ch in name), name
    assert stage_of_range(name) == stage
    if all(" " <= ch <= "~" and ch not in '"\\%' for ch in stage):
        assert name == stage  # a plain name is its own range name


def test_a_name_that_is_no_encoding_is_left_as_it_is() -> None:
    for name in ("50%", "a%41", "%zz", "%C3", "load 50%AB"):  # "%41" is "A" written as an escape
        assert stage_of_range(name) == name


UNTIL_WRITTEN = 3000
"""A bound on the steps trained while waiting for the incident (about a minute at 21 ms)."""


def _train(timer: Any, steps: int) -> None:
    import torch

    model = torch.nn.Linear(8, 8)
    for _ in range(steps):
        with timer.step():
            with timer.stage(ODD):
                time.sleep(0.02)
            with timer.stage(FORWARD):
                model(torch.randn(4, 8)).sum().backward()


def test_a_capture_keeps_the_range_of_a_stage_named_with_control_characters(
    tmp_path: Path,
) -> None:
    """A real capture of a loop whose stages' names hold control characters, quotes and
    non-ASCII letters: the trace keeps both stages' ranges, so the confirmation sees the data
    stage's time (before: its range was "unknown", or the trace was not JSON at all, and the
    incident read a false "disagrees")."""
    dist = pytest.importorskip("torch.distributed")
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.formats.incident import read_incident
    from stagefrontier.reducers import reduce_kineto

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    router = ProfilerRouter(steps=3, store=store, capture_timeout_s=120.0)
    timer = StageTimer(
        config=TimerConfig(
            stages=[ODD, FORWARD],
            window=5,
            collection=CollectConfig("local", out_dir=tmp_path, regression=None, log=False),
            router=router,
        )
    )
    _train(timer, 5)
    router.request_capture([0], stage=ODD)
    # Trained until the incident is written, so it is reduced live against the windows in
    # memory (one settling as the timer closes is left to the after-run process).
    for _ in range(UNTIL_WRITTEN):
        _train(timer, 1)
        if list(tmp_path.glob("incidents/*/incident.json")):
            break
    _train(timer, 5)
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert incident["captured"], incident["reasons"]
    assert incident["trace_shares"][ODD] > 0.5, (incident["trace_shares"], incident["reasons"])
    assert incident["op_diff"] and "sleep" in incident["op_diff"][0]["name"], incident["op_diff"]
    trace = incident["trace_files"]["0"]
    reduced = reduce_kineto([trace], [ODD, FORWARD], step_source="annotation")
    assert reduced.d[:, :, 0].min() > 0.015  # every step's data stage holds its 20 ms sleep


def test_figures_show_such_a_stage_name_escaped(tmp_path: Path) -> None:
    """The run's figures write a stage name's control characters as escapes (``\\x1b``), as
    every text output does; before, they reached the font as glyphs it lacks."""
    pytest.importorskip("matplotlib")
    import warnings

    from stagefrontier import CollectConfig, StageTimer, TimerConfig
    from stagefrontier.formats.run_folder import load_run
    from stagefrontier.render.plots import plot_shares_over_time, plot_worst_step
    from stagefrontier.sinks import PacketSink

    timer = StageTimer(
        config=TimerConfig(
            stages=[ODD, FORWARD],
            window=3,
            collection=CollectConfig(out_dir=tmp_path, sinks=[PacketSink(tmp_path)]),
        )
    )
    for _ in range(6):
        with timer.step():
            with timer.stage(ODD):
                time.sleep(0.002)
            with timer.stage(FORWARD):
                time.sleep(0.001)
    timer.close()
    run = load_run(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns of each glyph its font lacks
        plot_worst_step(run, tmp_path / "frontier.png")
        plot_shares_over_time(run, tmp_path / "shares.png")
