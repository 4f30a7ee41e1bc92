"""The live regression check: quiet on noisy healthy windows, and an exact, named split when a
stage slows down on one rank or on every rank."""

from __future__ import annotations

import numpy as np
import pytest

from stagefrontier import (
    DEFAULT_STAGES,
    StageFrontierError,
    combine,
    decode_summary,
    encode_summary,
    summarize,
)
from stagefrontier.analysis.regression import RegressionCheck, RegressionConfig
from stagefrontier.analysis.summary import WindowSummary
from stagefrontier.render.regression_text import regression_text

STAGES = tuple(DEFAULT_STAGES)
DATA = STAGES[0]
TYPICAL = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])


def window(rng: np.random.Generator, steps: int = 20, ranks: int = 4) -> np.ndarray:
    # Step-to-step noise of about 5% per stage, with an occasional slow step (a GC pause).
    d = TYPICAL * rng.lognormal(0.0, 0.05, size=(steps, ranks, len(TYPICAL)))
    slow = rng.random(steps) < 0.05
    d[slow, :, 2] += 0.040
    return d


def test_no_alarm_on_200_healthy_windows() -> None:
    rng = np.random.default_rng(7)
    for run in range(4):
        check = RegressionCheck()
        alarms = [check.check(w, window(rng), STAGES) for w in range(50)]
        assert not any(alarms), f"run {run}: {[a for a in alarms if a]}"


def tiny_window(rng: np.random.Generator, level: float) -> np.ndarray:
    """A window of steps of about 6 ms on a busy machine: each step's stages vary by 20%, and
    the whole window runs ``level`` times its usual pace (other jobs' load comes and goes over
    seconds, longer than the 0.1 s the window takes, so its steps slow down together)."""
    d = TYPICAL / 20.0 * rng.lognormal(0.0, 0.2, size=(20, 4, len(TYPICAL)))
    return d * level


def test_tiny_steps_whose_windows_wander_with_the_load_name_no_stage() -> None:
    """A healthy run of 6 ms steps on a loaded machine: a window's steps barely vary around
    their median, but the medians wander by a fifth from window to window with the machine's
    load. Two windows then run 3.5 ms a step slower, in rank 1's forward (the scheduler left
    it waiting there), less than the baseline's windows moved. Before: a regression of rank 1's
    forward, and an incident (a 5.8 ms window against a 4.4 ms one read as 33% slower). Now
    the same flag is the whole job's, no more than the windows wander; and a stall that
    stands out of the wander is still rank 1's."""
    rng = np.random.default_rng(0)
    check = RegressionCheck()
    for w, level in enumerate([1.3, 1.2, 1.0, 0.8, 0.7]):
        assert check.check(w, tiny_window(rng, level), STAGES) is None
    found = []
    for w in (5, 6):
        d = tiny_window(rng, 1.0)
        d[:, 1, 1] += 0.0045
        found.append(check.check(w, d, STAGES))
    assert found[0] is None  # above the threshold once: noise until the next agrees
    flagged = found[1]
    assert flagged is not None and flagged["kind"] == "whole_job" and flagged["within_wander"]
    assert "no more than this run's windows move with the machine's load" in regression_text(
        flagged
    )
    stalled = tiny_window(rng, 1.0)
    stalled[:, 1, 0] += 0.025  # a stall four times the step
    caught = check.check(7, stalled, STAGES)
    assert caught is not None and caught["kind"] == "stage", caught
    assert caught["top_stage"] == DATA and caught["ranks"] == [1]


def test_two_baseline_windows_show_no_wander_a_stall_could_hide_in() -> None:
    """Early in a run the baseline holds two windows, 10% apart: their spread is one number,
    and three standard deviations of it would pass a 30 ms stall on one rank as the machine's
    wander. The wander is read from three windows or more."""
    rng = np.random.default_rng(3)
    check = RegressionCheck()
    for w, level in enumerate([1.0, 1.1]):
        assert check.check(w, window(rng) * level, STAGES) is None
    found = []
    for w in (2, 3):
        stalled = window(rng)
        stalled[:, 1, 0] += 0.030
        found.append(check.check(w, stalled, STAGES))
    flagged = found[-1]
    assert flagged is not None and flagged["kind"] == "stage", flagged
    assert not flagged["within_wander"] and flagged["ranks"] == [1]


def test_a_one_rank_stall_is_caught_in_its_first_window_and_named() -> None:
    rng = np.random.default_rng(1)
    check = RegressionCheck()
    for w in range(5):
        assert check.check(w, window(rng), STAGES) is None
    stalled = window(rng)
    stalled[:, 2, 0] += 0.120
    found = check.check(5, stalled, STAGES)
    assert found is not None
    assert found["top_stage"] == DATA
    assert found["baseline_windows"] == [0, 4]
    assert found["ranks"] == [2] and not found["all_ranks"]
    assert found["delta_advance_ms_per_step"][DATA] == pytest.approx(120, rel=0.1)
    total = sum(found["delta_advance_ms_per_step"].values())
    assert total == pytest.approx(found["delta_exposed_ms_per_step"], abs=1e-9)
    assert regression_text(found).endswith("rank 2")
    assert "vs windows 0-4: data.next_wait +1" in regression_text(found)
    # The stalled window does not join the baseline: the next one is compared with 0-4 again.
    again = check.check(6, stalled, STAGES)
    assert again is not None and again["baseline_windows"] == [0, 4]


def test_a_slowdown_on_every_rank_is_named_as_such() -> None:
    rng = np.random.default_rng(2)
    check = RegressionCheck()
    for w in range(3):
        check.check(w, window(rng), STAGES)

    def slower() -> np.ndarray:
        d = window(rng)
        d[:, :, 0] += 0.030  # every rank's data loading got 30 ms slower (~+30%)
        return d

    # Between one and two thresholds: the first such window is noise until the next agrees.
    assert check.check(3, slower(), STAGES) is None
    found = check.check(4, slower(), STAGES)
    assert found is not None and found["top_stage"] == DATA and found["all_ranks"]
    assert sorted(found["ranks"]) == [0, 1, 2, 3]
    assert found["baseline_windows"] == [0, 2]
    assert regression_text(found).endswith("all ranks")


def test_a_lasting_change_becomes_the_new_baseline() -> None:
    rng = np.random.default_rng(4)
    check = RegressionCheck(RegressionConfig(baseline_windows=3, min_baseline=2))
    for w in range(3):
        assert check.check(w, window(rng), STAGES) is None
    flagged = []
    for w in range(3, 9):
        d = window(rng)
        d[:, 1, 0] += 0.200
        flagged.append(check.check(w, d, STAGES) is not None)
    # Reported for a baseline's worth of windows, then taken as the run's new normal.
    assert flagged == [True, True, True, False, False, False]


def test_the_baseline_needs_healthy_windows_and_restarts_on_a_new_schema() -> None:
    rng = np.random.default_rng(3)
    check = RegressionCheck(RegressionConfig(baseline_windows=3, min_baseline=2))
    stalled = window(rng)
    stalled[:, 1, 0] += 0.2
    assert check.check(0, window(rng), STAGES) is None
    assert check.check(1, stalled, STAGES) is None  # one healthy window is not a baseline yet
    renamed = (*STAGES[:-1], "step.extra")
    check.check(2, window(rng), renamed)
    assert check.check(3, stalled, renamed) is None  # the baseline restarted with the schema


@pytest.mark.parametrize(
    "kwargs",
    [{"baseline_windows": 0}, {"min_baseline": 6}, {"min_increase": -1.0}],
)
def test_bad_configs_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(StageFrontierError):
        RegressionConfig(**kwargs)  # type: ignore[arg-type]


def node_summary(d: np.ndarray, per_node: int = 2) -> WindowSummary:
    """The window as node summaries of ``per_node`` ranks, compact on their way up, combined."""
    parts = [
        decode_summary(encode_summary(summarize(d[:, i : i + per_node], range(i, i + per_node),
                                                STAGES), compact=True))
        for i in range(0, d.shape[1], per_node)
    ]  # fmt: skip
    return combine(parts)


@pytest.mark.parametrize("who", ["one rank", "every rank"])
def test_node_summaries_flag_the_same_window_and_stage_as_the_ranks_columns(who: str) -> None:
    rng = np.random.default_rng(11)
    ranks = 16  # 8 nodes of 2: each summary keeps every rank of its node, the top keeps 4
    flat, hier = RegressionCheck(), RegressionCheck()
    windows = [window(rng, ranks=ranks) for _ in range(6)]
    for d in windows[3:]:
        if who == "one rank":
            d[:, 9, 0] += 0.120
        else:
            d[:, :, 0] += 0.060
    for w, d in enumerate(windows):
        exact, summary = flat.check(w, d, STAGES), hier.check_summary(w, node_summary(d))
        assert (exact is None) == (summary is None), w
        if exact is None or summary is None:
            continue
        assert w == 3 and summary["top_stage"] == exact["top_stage"] == DATA
        assert summary["baseline_windows"] == exact["baseline_windows"]
        assert summary["delta_exposed_ms_per_step"] == pytest.approx(
            exact["delta_exposed_ms_per_step"], abs=0.01
        )
        for stage in STAGES:  # within the compact parts' rounding (a few microseconds)
            assert summary["delta_advance_ms_per_step"][stage] == pytest.approx(
                exact["delta_advance_ms_per_step"][stage], abs=0.01
            )
        assert summary["all_ranks"] == exact["all_ranks"] == (who == "every rank")
        if who == "one rank":
            assert summary["ranks"] == exact["ranks"] == [9]
        # the lower bounds never exceed the exact deltas
        for rank, delta in summary["rank_delta_ms_per_step"].items():
            assert delta <= exact["rank_delta_ms_per_step"][rank] + 0.01
        break
    else:
        pytest.fail("no regression flagged")


@pytest.mark.parametrize("warmup", [2.0, 5.0, 10.0])
@pytest.mark.parametrize("slowdown", [1.5, 2.0])
def test_a_slow_warm_up_window_does_not_hide_a_later_slowdown(
    warmup: float, slowdown: float
) -> None:
    """Window 0 runs ``warmup`` times slower (compilation, caches), window 1 is normal, and the
    job slows down ``slowdown`` times from window 2. Before: window 0 stayed in the baseline and
    widened its spread so much that no window of ten was flagged."""
    rng = np.random.default_rng(int(warmup * 10 + slowdown))
    check = RegressionCheck()
    assert check.check(0, window(rng) * warmup, STAGES) is None
    assert check.check(1, window(rng), STAGES) is None
    flagged = [w for w in range(2, 10) if check.check(w, window(rng) * slowdown, STAGES)]
    assert flagged and flagged[0] <= 3, flagged


@pytest.mark.parametrize("warmup", [2.0, 10.0])
def test_warm_up_windows_leave_the_baseline_and_raise_no_alarm(warmup: float) -> None:
    rng = np.random.default_rng(int(warmup))
    for run in range(10):
        check = RegressionCheck()
        alarms = [check.check(0, window(rng) * warmup, STAGES)]
        alarms.append(check.check(1, window(rng) * (1 + (warmup - 1) / 3), STAGES))
        alarms += [check.check(w, window(rng), STAGES) for w in range(2, 30)]
        assert not any(alarms), f"run {run}: {[a for a in alarms if a]}"
        reference = check.reference(STAGES, 4)
        assert reference is not None and reference[1][0] >= 2  # warm-up windows left out
