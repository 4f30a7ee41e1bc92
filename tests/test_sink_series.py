"""The series a metrics sink creates do not grow with the world size: every sink writes
``AnalyzedWindow.metrics`` (per stage, per label and a fixed set; the leading rank is a value,
never a series of its own), read back here from a run of 2 ranks and one of 64 whose every
window is led by another rank."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from stagefrontier import ALL_LABELS
from stagefrontier.analysis.regression import RegressionCheck
from stagefrontier.sinks import CsvSink, PrometheusSink, Sink, TensorBoardSink
from stagefrontier.window.merged import AnalyzedWindow, analyze_merged, merge_windows
from stagefrontier.window.rank import RankWindow

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "optim.step_cpu_wall", "residual")
MS = 1_000_000
WINDOWS = 12


def _run(ranks: int) -> list[AnalyzedWindow]:
    """``WINDOWS`` windows of ``ranks`` ranks, window k's data wait led by rank k (mod the
    ranks), the last two windows slower (a regression split by stage)."""
    rng = np.random.default_rng(ranks)
    check = RegressionCheck()
    out = []
    for index in range(WINDOWS):
        windows = []
        for rank in range(ranks):
            durations = rng.integers(9 * MS, 11 * MS, size=(10, len(STAGES)))
            durations[:, -1] = 0
            if rank == index % ranks:
                durations[:, 0] += 40 * MS
            if index >= WINDOWS - 2:
                durations[:, 1] += 30 * MS
            first = index * 10
            windows.append(
                RankWindow(index, first, first + 9, rank, STAGES, durations, durations.sum(1))
            )
        analyzed = analyze_merged(merge_windows(windows, ranks))
        found = check.check(index, analyzed.d, STAGES)
        out.append(replace(analyzed, regression=found))
    return out


@pytest.fixture(scope="module")
def runs() -> dict[int, list[AnalyzedWindow]]:
    """The run of 2 ranks and the run of 64, analyzed once for every test."""
    return {ranks: _run(ranks) for ranks in (2, 64)}


def _write(sinks: list[Sink], windows: list[AnalyzedWindow]) -> None:
    for window in windows:
        for sink in sinks:
            sink.write(window)


def test_the_runs_lead_with_many_ranks_and_regress(runs: dict[int, list[AnalyzedWindow]]) -> None:
    wide = runs[64]
    assert len({w.metrics.leader_rank for w in wide}) == WINDOWS  # a new leader each window
    assert wide[-1].metrics.regression_stage_ms  # the per-stage regression series appear


def test_tensorboard_tags_are_the_same_for_2_and_64_ranks(
    tmp_path: Path, runs: dict[int, list[AnalyzedWindow]]
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = []
    for ranks in (2, 64):
        sink = TensorBoardSink(tmp_path / f"tb-{ranks}")
        _write([sink], runs[ranks])
        sink.close()
        acc = EventAccumulator(str(tmp_path / f"tb-{ranks}"), size_guidance={"scalars": 0})
        acc.Reload()
        tags.append(set(acc.Tags()["scalars"]))
    assert tags[0] == tags[1]
    semantic = len(STAGES) - 1 + 1  # the timed stages and the residual, named semantically
    assert len(tags[1]) == 2 * semantic + len(ALL_LABELS) + 5  # the bound docs/sinks.md states


def test_prometheus_series_are_the_same_for_2_and_64_ranks(
    runs: dict[int, list[AnalyzedWindow]],
) -> None:
    pytest.importorskip("prometheus_client")
    series = []
    for ranks in (2, 64):
        sink = PrometheusSink(port=0)
        try:
            _write([sink], runs[ranks])
            series.append(
                {
                    (sample.name, tuple(sorted(sample.labels.items())))
                    for family in sink.registry.collect()
                    for sample in family.samples
                }
            )
        finally:
            sink.close()
    assert series[0] == series[1]
    assert len(series[1]) == 2 * len(STAGES) + len(ALL_LABELS) + 8


def test_csv_columns_are_the_same_for_2_and_64_ranks(
    tmp_path: Path, runs: dict[int, list[AnalyzedWindow]]
) -> None:
    headers = []
    for ranks in (2, 64):
        sink = CsvSink(tmp_path / f"{ranks}.csv")
        _write([sink], runs[ranks])
        sink.close()
        with open(tmp_path / f"{ranks}.csv", newline="") as handle:
            headers.append(next(csv.reader(handle)))
    assert headers[0] == headers[1]
