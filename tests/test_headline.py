"""A window's headline: what, who, how much and the next step in at most 160 characters; the rest
at DEBUG; a window that says what the one before it said is headed ``same as window N``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.render.headline import HEADLINE_MAX, Headlines, window_headline
from stagefrontier.render.text import window_details
from stagefrontier.render.verdict import next_step, verdict, verdict_parts
from stagefrontier.sinks import LogSink
from stagefrontier.window.merged import analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow
from test_verdict import STAGES, healthy, steady_data_stall, synchronized


def _record(window: int, n_steps: int = 20) -> dict[str, Any]:
    return {
        "window": window,
        "first_step": window * n_steps,
        "last_step": (window + 1) * n_steps - 1,
    }


def test_a_stall_headline_says_what_who_how_much_and_the_next_step() -> None:
    report = sf.analyze(steady_data_stall(), STAGES)
    line = window_headline(report, _record(3))
    assert line.startswith("window 3 steps 60-79 | exposed ")
    assert "| top data.next_wait " in line and " ms) led by rank 2 |" in line
    assert line.endswith("| Next: profile data loading (data.next_wait) on rank 2")
    assert len(line) <= HEADLINE_MAX, len(line)
    # The verdict's own next step, and the whole verdict in the details line.
    assert next_step(report) in verdict(report) and verdict(report) in window_details(report)
    assert "Why co_critical" not in line and "labels " not in line


def test_the_verdict_is_its_parts_put_together() -> None:
    for d in (steady_data_stall(), synchronized(healthy())):
        report = sf.analyze(d, STAGES)
        parts = verdict_parts(report)
        assert parts.next_step and f"Next: {parts.next_step}." in verdict(report)
        assert verdict(report).lower().endswith(parts.text().lower())


def test_consecutive_windows_that_say_the_same_thing_say_it_once() -> None:
    headlines = Headlines()
    stall = sf.analyze(steady_data_stall(), STAGES)
    quiet = sf.analyze(synchronized(healthy()), STAGES)
    lines = [headlines.line(r, _record(i)) for i, r in enumerate((quiet, stall, stall, stall))]
    assert "Next: " in lines[0] and "Next: " in lines[1]
    assert lines[2].endswith("led by rank 2 | same as window 1"), lines[2]
    assert lines[3].endswith("| same as window 1") and "Next: " not in lines[3]
    # A different finding is said in full again, and a repeat refers to it.
    again = [headlines.line(r, _record(4 + i)) for i, r in enumerate((quiet, quiet))]
    assert "Next: " in again[0] and again[1].endswith("| same as window 4")


def test_a_headline_of_very_long_names_is_cut_to_the_limit() -> None:
    long = [f"{name}.{'x' * 150}" for name in STAGES]
    report = sf.analyze(steady_data_stall(), long)
    line = window_headline(report, _record(0))
    assert len(line) == HEADLINE_MAX and line.endswith("...")
    assert long[0] in window_details(report)  # the details line keeps the whole name


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_the_log_sink_writes_the_details_only_at_debug(
    level: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(level, logger="stagefrontier")
    d = steady_data_stall()
    sink = LogSink()
    for index in range(2):
        per_rank = _rank_windows(d, index)
        sink.write(analyze_merged(merge_windows(per_rank, d.shape[1])))
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    heads = [text for lvl, text in lines if lvl == logging.INFO]
    assert len(heads) == 2 and all(len(text) <= HEADLINE_MAX for text in heads)
    assert heads[1].endswith("| same as window 0")
    details = [text for lvl, text in lines if lvl == logging.DEBUG]
    assert len(details) == (2 if level == logging.DEBUG else 0)
    assert all("| labels co_critical |" in text and "Why co_critical" in text for text in details)


def _rank_windows(d: np.ndarray, index: int) -> list[RankWindow]:
    """Each rank's window of ``d`` (seconds), as the timer hands it off, in integer ns."""
    n_steps, first = d.shape[0], index * d.shape[0]
    out = []
    for rank in range(d.shape[1]):
        durations = np.round(d[:, rank, :] * 1e9).astype(np.int64)
        durations[:, -1] = 0  # the untimed rest: the step's wall time is the timed stages
        wall = durations.sum(axis=1)
        out.append(RankWindow(index, first, first + n_steps - 1, rank, STAGES, durations, wall))
    return out


def test_a_whole_job_slowdown_says_so_in_the_headline() -> None:
    report = sf.analyze(synchronized(healthy()), STAGES)
    record = {**_record(5), "regression": {"kind": "whole_job", "delta_exposed_ms_per_step": 41.2}}
    line = window_headline(report, record)
    assert line.endswith("| whole job slower +41 ms/step | Next: look outside the training code")
    assert len(line) <= HEADLINE_MAX and "top model.backward_cpu_wall " in line
    stage = {**_record(5), "regression": {"kind": "stage", "delta_exposed_ms_per_step": 41.2}}
    assert "| slower +41 ms/step |" in window_headline(report, stage)
