"""Gradient accumulation in StageTimer: ``timer.microstep(i)`` substages ``name[i]``, semantic
shares folded back, a change of factor closing the window, and mixed microsteps flagged."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import stagefrontier as sf
from recorder_support import CaptureCollector, on_disk_and_captured, read_records, run_stages
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.analysis.schema import expand_microsteps, stage_order_hash
from trace_support import BWD, CALLBACKS, DATA, FWD, OPTIM, OTHER

MS = 1e-3
AMBIGUOUS = "gradient_accumulation_ambiguous"


def accumulation_step(timer: StageTimer, factor: int, skip: int | None = None) -> None:
    """One optimizer step of ``factor`` microsteps (data, forward, backward each), then the
    optimizer outside the microsteps; ``skip`` leaves one microstep index out."""
    with timer.step():
        for i in range(factor):
            if i == skip:
                continue
            with timer.microstep(i):
                run_stages(timer, {DATA: 0.2 * MS, FWD: 1 * MS, BWD: 2 * MS})
        run_stages(timer, {OPTIM: 0.5 * MS})


def test_microsteps_become_indexed_substages_and_fold_back(tmp_path: Path) -> None:
    collector = on_disk_and_captured(tmp_path, 3, lambda timer: accumulation_step(timer, 4))
    expected = expand_microsteps(sf.DEFAULT_STAGES, 4)
    (w,) = collector.windows
    assert w.stages == expected
    assert w.accumulation_factor == 4
    assert not w.accumulation_mixed
    assert w.contract_violations == 0
    d = {name: w.durations_ns[:, j] for j, name in enumerate(w.stages)}
    for i in range(4):
        assert np.all(d[f"{FWD}[{i}]"] >= 1e6)
        assert np.all(d[f"{BWD}[{i}]"] >= 2e6)
        assert np.all(d[f"{CALLBACKS}[{i}]"] == 0)
    # The optimizer, timed after the last microstep, belongs to that microstep.
    assert np.all(d[f"{OPTIM}[3]"] >= 0.5e6)
    assert all(np.all(d[f"{OPTIM}[{i}]"] == 0) for i in range(3))
    np.testing.assert_array_equal(w.durations_ns.sum(axis=1), w.wall_ns)

    (record,) = read_records(tmp_path)
    assert record["stages"] == list(expected)
    assert record["stage_order_hash"] == stage_order_hash(expected)
    assert record["accumulation_factor"] == 4
    assert AMBIGUOUS not in record["labels"]
    semantic = record["semantic_shares"]
    assert set(semantic) == set(sf.DEFAULT_STAGES)
    for stage in sf.DEFAULT_STAGES:
        parts = [v for k, v in record["shares"].items() if k.split("[")[0] == stage]
        assert semantic[stage] == pytest.approx(sum(parts), abs=1e-12)
    assert sum(semantic.values()) == pytest.approx(1.0)
    assert semantic[OTHER] == pytest.approx(record["shares"][OTHER])


def test_change_of_accumulation_factor_closes_the_window(tmp_path: Path) -> None:
    timer = StageTimer(config=TimerConfig(window=10, collection=CollectConfig(out_dir=tmp_path)))
    for _ in range(3):
        accumulation_step(timer, 2)
    for _ in range(2):
        accumulation_step(timer, 3)
    accumulation_step(timer, 1)  # back to one microstep: closes the window again
    timer.close()
    records = read_records(tmp_path)
    assert [(r["first_step"], r["last_step"]) for r in records] == [(0, 2), (3, 4), (5, 5)]
    assert [r["accumulation_factor"] for r in records] == [2, 3, 1]
    assert records[0]["stages"] == list(expand_microsteps(sf.DEFAULT_STAGES, 2))
    assert records[1]["stages"] == list(expand_microsteps(sf.DEFAULT_STAGES, 3))
    assert records[2]["stages"] == list(sf.DEFAULT_STAGES)
    notes = records[0]["reasons"].get("telemetry_limited", [])
    assert any("accumulation factor changed from 2 to 3" in n for n in notes)
    assert all(AMBIGUOUS not in r["labels"] for r in records)
    assert all(r["contract_violations"] == 0 for r in records)


def test_factor_change_moves_the_step_into_the_new_window() -> None:
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(window=10), collector=collector)
    for _ in range(2):
        accumulation_step(timer, 2)
    accumulation_step(timer, 3, skip=1)  # factor 3, mixed: belongs to the new window
    timer.close()
    first, second = collector.windows
    assert (first.first_step, first.last_step, first.accumulation_factor) == (0, 1, 2)
    assert (second.first_step, second.last_step, second.accumulation_factor) == (2, 2, 3)
    assert not first.accumulation_mixed
    assert second.accumulation_mixed
    stages = second.stages
    fwd = second.durations_ns[0]
    assert fwd[stages.index(f"{FWD}[0]")] >= 1e6
    assert fwd[stages.index(f"{FWD}[1]")] == 0  # the skipped microstep
    assert fwd[stages.index(f"{FWD}[2]")] >= 1e6


def test_skipped_microstep_index_is_ambiguous(tmp_path: Path) -> None:
    timer = StageTimer(config=TimerConfig(window=3, collection=CollectConfig(out_dir=tmp_path)))
    accumulation_step(timer, 3)
    accumulation_step(timer, 3, skip=1)
    accumulation_step(timer, 3)
    timer.close()
    (record,) = read_records(tmp_path)
    assert AMBIGUOUS in record["labels"]
    assert record["accumulation_factor"] == 3


def test_ordered_stage_between_microsteps_is_ambiguous(tmp_path: Path) -> None:
    timer = StageTimer(config=TimerConfig(window=2, collection=CollectConfig(out_dir=tmp_path)))
    for _ in range(2):
        with timer.step():
            with timer.microstep(0), timer.stage(FWD):
                time.sleep(1 * MS)
            with timer.stage(CALLBACKS):  # collapsed: outside, between microsteps
                pass
            with timer.microstep(1), timer.stage(FWD):
                time.sleep(1 * MS)
    timer.close()
    (record,) = read_records(tmp_path)
    assert AMBIGUOUS in record["labels"]
    reasons = record["reasons"][AMBIGUOUS]
    assert any("timer.microstep" in r for r in reasons)


def test_microstep_outside_a_step_is_a_violation_and_changes_nothing() -> None:
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(window=2), collector=collector)
    with timer.microstep(2):
        pass
    for _ in range(2):
        with timer.step(), timer.stage(FWD):
            pass
    timer.close()
    (w,) = collector.windows
    assert w.contract_violations == 1
    assert w.accumulation_factor == 1
    assert not w.accumulation_mixed
    assert w.stages == sf.DEFAULT_STAGES
