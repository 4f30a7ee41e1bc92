"""Gradient accumulation: routing, labels, the log line and the run report work on the broad
stages; the microstep substages stay as detail."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from recorder_support import BWD, DATA, FWD, OPTIM, read_records, run_stages
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.analysis.schema import expand_microsteps
from stagefrontier.formats.run_folder import load_run
from stagefrontier.render.text import run_report_text, window_report_text
from stagefrontier.render.verdict import verdict
from stagefrontier.sinks import PacketSink

MS = 1e-3
FACTOR = 4


def data_bound_step(timer: StageTimer, stalled_microstep: int | None = None) -> None:
    """Four microsteps of data, forward and backward; the data wait is long (every microstep,
    or only ``stalled_microstep``) and everything else is nearly free."""
    with timer.step():
        for i in range(FACTOR):
            with timer.microstep(i):
                stalled = stalled_microstep in (None, i)
                run_stages(timer, {DATA: 30 * MS if stalled else 0, FWD: 0, BWD: 0})
        run_stages(timer, {OPTIM: 0})


def test_accumulation_loop_routes_and_reports_on_broad_stages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="stagefrontier")
    timer = StageTimer(
        config=TimerConfig(
            window=3, collection=CollectConfig(out_dir=tmp_path, sinks=[PacketSink(tmp_path)])
        )
    )
    for _ in range(3):
        data_bound_step(timer)
    timer.close()

    (record,) = read_records(tmp_path)
    assert record["stages"] == list(expand_microsteps(sf.DEFAULT_STAGES, FACTOR))
    # The detail: every microstep's data wait carries about a quarter of the stage.
    parts = [record["shares"][f"{DATA}[{i}]"] for i in range(FACTOR)]
    assert all(0 < p < record["semantic_shares"][DATA] for p in parts)
    # Routing and labels: broad stages only.
    assert record["top1"] == DATA
    assert record["routing_set"] == [DATA]
    assert all("[" not in stage for stage in record["co_critical_stages"])
    assert set(record["semantic_gain"]) == set(sf.DEFAULT_STAGES)
    assert set(record["semantic_localization"]) == set(sf.DEFAULT_STAGES)
    assert all(f"{DATA}[" not in r for rs in record["reasons"].values() for r in rs)
    assert record["lead"]["stage"] == DATA

    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.DEBUG and r.getMessage().startswith("window ")
    ]
    assert f"| top {DATA} " in line and f"| route {DATA} |" in line
    sentence = line.rsplit(" | ", 1)[1]
    assert "data loading" in sentence and "microstep" not in sentence  # all four stall alike

    report = run_report_text(load_run(tmp_path))
    table = report.split("Per window (times of day in UTC):")[1].split("Routing set")[0]
    assert f" {DATA} (" in table and "[" not in table
    assert f"Routing set (most common, 1/1 windows): {DATA}" in report
    # Each method's top stage is a broad stage too, as the window line reads it.
    assert "top-1 stage per method (windows where it was top-1) (accumulation microsteps " in report
    assert f"  frontier   {DATA} (1/1)" in report, report


def test_the_stalled_microstep_stays_visible_as_detail(tmp_path: Path) -> None:
    timer = StageTimer(
        config=TimerConfig(
            window=3, collection=CollectConfig(out_dir=tmp_path, sinks=[PacketSink(tmp_path)])
        )
    )
    for _ in range(3):
        data_bound_step(timer, stalled_microstep=2)
    timer.close()
    run = load_run(tmp_path)
    assert run.count == 1 and run.worst is not None
    report = run.worst.report
    assert report.top1 == DATA
    substages = {f"{DATA}[{i}]": report.shares[f"{DATA}[{i}]"] for i in range(FACTOR)}
    assert max(substages, key=substages.__getitem__) == f"{DATA}[2]"
    text = window_report_text(report)
    assert f"{DATA}[2]" in text  # the per-substage table
    assert "folded by stage (accumulation substages summed):" in text
    assert ", most of it in microstep 2" in verdict(report)


def test_broad_stage_gain_clips_all_its_substages_at_once() -> None:
    """Rank 1 stalls in two of eight steps in both microsteps' data: clipping the whole data
    stage gains what clipping each substage gains, added."""
    stages = ["data[0]", "bwd[0]", "data[1]", "bwd[1]"]
    d = np.full((8, 3, 4), 0.010)
    d[[0, 4], 1, 0] += 0.100
    d[[0, 4], 1, 2] += 0.100
    report = sf.analyze(d, stages)
    assert report.top1 == "data" and report.routing_set == ["data", "bwd"]
    whole = report.semantic_gain["data"]
    assert whole == pytest.approx(report.direct_gain["data[0]"] + report.direct_gain["data[1]"])
    assert whole > 0.5
    assert report.has("direct_exposure")


def test_without_substages_the_broad_view_is_the_window() -> None:
    d = np.random.default_rng(4).uniform(0.0, 1.0, (5, 3, len(sf.DEFAULT_STAGES)))
    report = sf.analyze(d, sf.DEFAULT_STAGES)
    assert report.semantic_shares == report.shares
    assert report.semantic_gain == report.direct_gain
    assert report.semantic_localization == report.localization


def test_role_shares_fold_substages() -> None:
    stages = ["data[0]", "bwd[0]", "data[1]", "bwd[1]"]
    d = np.random.default_rng(6).uniform(0.01, 0.02, (5, 4, 4))
    report = sf.analyze(d, stages, roles=["pp0", "pp0", "pp1", "pp1"])
    assert report.role_shares is not None
    for shares in report.role_shares.values():
        assert set(shares) == {"data", "bwd"}
        assert sum(shares.values()) == pytest.approx(1.0)
