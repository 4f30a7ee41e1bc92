"""Baselines that follow the run (``analysis.baseline_phases``): a phase the user names, paused
steps and a detected change of the step's make-up start a new baseline instead of a regression,
while a real stall is still caught; and a rolling baseline."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stagefrontier import DEFAULT_STAGES, CollectConfig, StageTimer, TimerConfig
from stagefrontier.analysis.baseline_phases import CHANGED_INSIDE, Marks
from stagefrontier.analysis.regression import RegressionCheck, RegressionConfig

STAGES = tuple(DEFAULT_STAGES)
TRAIN = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])
EVALUATION = np.array([0.004, 0.015, 0.0, 0.002, 0.0, 0.0005])
"""An evaluation step: half the forward, no backward pass, no optimizer."""
BEFORE = RegressionConfig(follow_phases=False)


def window(rng: np.random.Generator, typical: np.ndarray, steps: int = 20) -> np.ndarray:
    return typical * rng.lognormal(0.0, 0.05, size=(steps, 4, len(typical)))


def _alarms(config: RegressionConfig, plan: Sequence[tuple[np.ndarray, Marks]]) -> list[int]:
    """The windows of ``plan`` (typical step, marks) the check flags."""
    rng = np.random.default_rng(3)
    check = RegressionCheck(config)
    return [
        w
        for w, (typical, marks) in enumerate(plan)
        if check.check(w, window(rng, typical), STAGES, marks)
    ]


def test_an_evaluation_phase_the_user_names_is_never_a_regression_of_training() -> None:
    evaluation: Marks = ("evaluation", False, False)
    plan: list[tuple[np.ndarray, Marks]] = (
        [(TRAIN, None)] * 6 + [(EVALUATION, evaluation)] * 3 + [(TRAIN, None)] * 6
    )
    assert _alarms(BEFORE, plan)  # training compared with evaluation windows: "slower"
    assert _alarms(RegressionConfig(), plan) == []
    stalled = TRAIN + np.array([0.06, 0, 0, 0, 0, 0])
    assert _alarms(RegressionConfig(), [*plan, (stalled, None)]) == [len(plan)]


def test_a_change_of_the_steps_make_up_starts_a_new_baseline_and_returns_to_the_old() -> None:
    plan: list[tuple[np.ndarray, Marks]] = [(TRAIN, None)] * 6 + [(EVALUATION, None)] * 3
    plan += [(TRAIN, None)] * 6
    assert _alarms(BEFORE, plan)
    assert _alarms(RegressionConfig(), plan) == []
    rng = np.random.default_rng(5)
    check = RegressionCheck()
    said = []
    for w, (typical, _) in enumerate(plan):
        check.check(w, window(rng, typical), STAGES)
        said.append(check.restarted)
    assert said[6] == "a stage of the step stopped (a new phase)"
    assert said[9] == "back to an earlier make-up of the step"
    assert said.count(None) == len(plan) - 2


def test_paused_steps_start_the_baseline_again() -> None:
    slower = TRAIN * 1.5  # after a checkpoint the pause left out, the step settles slower
    plan: list[tuple[np.ndarray, Marks]] = [(TRAIN, None)] * 6 + [(slower, (None, False, True))]
    plan += [(slower, None)] * 5
    assert _alarms(BEFORE, plan)
    assert _alarms(RegressionConfig(), plan) == []


def test_a_window_the_phase_changed_inside_is_compared_with_nothing() -> None:
    rng = np.random.default_rng(2)
    check = RegressionCheck()
    for w in range(4):
        check.check(w, window(rng, TRAIN), STAGES)
    mixed = window(rng, TRAIN * 3)
    assert check.check(4, mixed, STAGES, ("evaluation", True, False)) is None
    assert check.restarted == CHANGED_INSIDE
    stalled = window(rng, TRAIN + np.array([0.06, 0, 0, 0, 0, 0]))
    found = check.check(5, stalled, STAGES)
    assert found is not None and found["baseline_windows"] == [0, 3]


def test_a_rolling_baseline_reports_a_lasting_change_for_fewer_windows() -> None:
    plan: list[tuple[np.ndarray, Marks]] = [(TRAIN, None)] * 6
    plan += [(TRAIN * 1.6, None)] * 8
    fixed, rolling = (
        _alarms(RegressionConfig(), plan),
        _alarms(RegressionConfig(rolling=True), plan),
    )
    assert fixed == [6, 7, 8, 9, 10]  # baseline_windows windows, then the new normal
    assert rolling and rolling[0] == 6 and len(rolling) < len(fixed)


def test_the_phase_reaches_the_record(tmp_path: Path) -> None:
    stages = ("data.next_wait", "model.fwd_loss_cpu_wall")
    collection = CollectConfig(out_dir=tmp_path)
    timer = StageTimer(config=TimerConfig(stages, window=2, collection=collection))
    for step in range(8):
        if step == 2:
            timer.set_phase("evaluation")
        if step == 5:
            timer.set_phase(None)  # inside window 2
        with timer.step(), timer.stage("data.next_wait"):
            pass
    timer.set_phase(7)  # type: ignore[arg-type]  # not a name: a violation, ignored
    timer.close()
    records = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    phases = [(r.get("phase"), r.get("phase_changed", False)) for r in records]
    assert phases == [(None, False), ("evaluation", False), (None, True), (None, False)]
    assert timer.violations == 1
