"""The verdict sentence and the reasons a person reads: built from the labels, naming the Gates
fields, explaining a near-zero gain, and quiet on a healthy window."""

from __future__ import annotations

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.analysis.schema import BACKWARD_STAGE, DATA_STAGE, RESIDUAL_STAGE
from stagefrontier.analysis.validation import direct_exposure_fixture
from stagefrontier.render.text import window_details, window_report_text
from stagefrontier.render.verdict import listing, ranks_text, verdict

STAGES = sf.DEFAULT_STAGES
BASE_S = np.array([0.001, 0.020, 0.030, 0.0005, 0.002, 0.0001])
"""Per-stage work of every rank in a healthy step, in DEFAULT_STAGES order."""
PAPER_SYMBOLS = ("gamma", "eta_", "W_s", "tau_C", "window is co_critical")


def synchronized(work: np.ndarray) -> np.ndarray:
    """Backward ends with a gradient all-reduce: every rank leaves it when the last one arrives,
    so a rank that arrives early waits inside its backward."""
    b = STAGES.index(BACKWARD_STAGE)
    arrival = work[:, :, :b].sum(axis=2)
    done = (arrival + work[:, :, b]).max(axis=1)
    d = work.copy()
    d[:, :, b] = done[:, None] - arrival
    return d


def healthy(n: int = 40, r: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return BASE_S * (1 + 0.05 * rng.standard_normal((n, r, len(STAGES))))


def steady_data_stall() -> np.ndarray:
    """Rank 2 waits 120 ms for data in every step; the others wait for it in backward."""
    work = healthy(n=20)
    work[:, 2, STAGES.index(DATA_STAGE)] += 0.120
    return synchronized(work)


def all_reasons(report: sf.WindowReport) -> str:
    return " ".join(" ".join(v) for v in report.reasons.values())


def test_steady_one_rank_stall_says_who_what_where_and_why_the_gain_is_zero() -> None:
    report = sf.analyze(steady_data_stall(), STAGES)
    assert report.labels == ["frontier_accounting", "co_critical"]
    assert report.direct_gain[DATA_STAGE] < 0.01
    text = verdict(report)
    assert text.startswith("Rank 2's data loading runs ~120 ms/step behind the median rank")
    assert "the other ranks make up the gap in backward, most likely waiting for it." in text
    # What is known and what to do first; the label's caveat after it.
    finding, caveat = text.split(" Why co_critical, not a proven wait: ")
    assert finding.endswith("Next: profile data loading (data.next_wait) on rank 2.")
    assert "co_critical" not in finding and "direct gain" not in finding
    assert caveat.startswith("no wait model is declared for data loading")
    assert "direct gain is only 0% because the stall is steady, so it is rank 2's usual" in caveat
    # The reasons name what a user can set, and say why the gain is near zero.
    reasons = all_reasons(report)
    assert not any(symbol in reasons for symbol in PAPER_SYMBOLS)
    (low_gain,) = [r for r in report.reasons["co_critical"] if "direct gain" in r]
    assert "< gain_threshold 10%" in low_gain and "a steady stall: rank 2" in low_gain
    assert "Gates.model_fit_stages" in low_gain
    (withheld,) = report.reasons["direct_exposure"]
    assert withheld.startswith("not emitted: co_critical: data.next_wait's direct gain is 0.0%")


def test_a_stall_already_in_the_runs_baseline_is_not_called_a_no_stall_reference() -> None:
    """A stall present from the run's first step is in the healthy windows rank 0's live
    analysis clips the gains to: the caveat names those windows, not a stall-free reference."""
    d = steady_data_stall()
    side = sf.SideEvidence(no_stall_reference_s=np.median(d, axis=0))
    report = sf.analyze(d, STAGES, gates=sf.Gates(gain_baseline="reference"), side=side)
    assert report.has("co_critical") and report.direct_gain[DATA_STAGE] < 0.01
    text = verdict(report, {"gain_reference_windows": [0, 1]})
    assert "Next: profile data loading (data.next_wait) on rank 2." in text
    assert "no-stall" not in text
    assert (
        "its direct gain is only 0% because the run's baseline (windows 0-1) already had it: "
        "clipping each rank to its durations there removes little." in text
    )


def test_asserted_wait_model_says_the_rank_holds_every_rank_back() -> None:
    gates = sf.Gates(model_fit_stages=frozenset({DATA_STAGE}))
    report = sf.analyze(steady_data_stall(), STAGES, gates=gates)
    assert "likely_sync_wait" in report.labels
    text = verdict(report)
    assert text.startswith("Rank 2's data loading holds every rank back by ~120 ms/step")
    assert "the others wait in backward" in text
    assert text.endswith("Next: profile data loading (data.next_wait) on rank 2.")


def test_healthy_window_reads_quiet_and_names_no_leader() -> None:
    report = sf.analyze(synchronized(healthy()), STAGES)
    assert "direct_exposure" not in report.labels
    text = verdict(report)
    assert text.startswith("No single rank leads: ranks 0-3 share the lead in backward, which")
    assert "no rank holds the others back" in text
    line = window_details(report)
    assert "led by" not in line
    assert "top model.backward_cpu_wall" in line and "no single leader (ranks 0-3 share it)" in line
    assert line.endswith(text)


def test_direct_exposure_verdict_gives_the_saving() -> None:
    fixture = direct_exposure_fixture(np.random.default_rng(3))
    report = sf.analyze(fixture.d, fixture.stages)
    assert report.has("direct_exposure") and report.top1 == fixture.injected
    text = verdict(report)
    assert text.startswith(f"Rank {fixture.rank}'s ")
    assert "clipping it to its usual duration would save" in text
    assert text.endswith(f"on rank {fixture.rank}.")


def spike_window(spike_s: float) -> np.ndarray:
    """One rank, ten steps of (20 ms forward, 30 ms backward), one backward spike."""
    d = np.zeros((10, 1, len(STAGES)))
    d[:, 0, 1], d[:, 0, 2] = 0.020, 0.030
    d[4, 0, 2] += spike_s
    return d


def test_gain_just_above_the_threshold_is_co_critical_not_a_flip() -> None:
    near = sf.analyze(spike_window(0.068), STAGES)
    gain = near.direct_gain[BACKWARD_STAGE]
    assert near.gates.gain_threshold <= gain < near.gates.gain_threshold + near.gates.gain_tie
    assert near.labels == ["frontier_accounting", "co_critical"]
    assert any("within gain_tie 5% of gain_threshold 10%" in r for r in near.reasons["co_critical"])
    # Without the band the same window would be called direct exposure; a clear spike still is.
    no_band = sf.analyze(spike_window(0.068), STAGES, gates=sf.Gates(gain_tie=0.0))
    assert no_band.has("direct_exposure")
    assert sf.analyze(spike_window(0.200), STAGES).has("direct_exposure")


def test_single_rank_window_does_not_talk_about_other_ranks() -> None:
    report = sf.analyze(healthy(r=1), STAGES)
    text = verdict(report)
    assert text.startswith("A single rank, so no rank can hold others back: backward takes")
    assert "profile backward" in text


def test_limits_come_first_or_replace_the_verdict() -> None:
    d = synchronized(healthy())
    d[:, :, STAGES.index(RESIDUAL_STAGE)] = 0.5 * d.sum(axis=2)
    assert verdict(sf.analyze(d, STAGES)).startswith("Telemetry is incomplete (residual ")
    roles = sf.analyze(healthy(), STAGES, roles=["pp0", "pp0", "pp1", "pp1"])
    assert verdict(roles).startswith("Ranks play different roles, so no global verdict")
    empty = sf.analyze(np.zeros((3, 2, len(STAGES))), STAGES)
    assert verdict(empty) == "No exposed step time in this window: nothing to attribute."


def test_analyze_text_ends_with_the_verdict() -> None:
    report = sf.analyze(steady_data_stall(), STAGES)
    text = window_report_text(report)
    assert text.splitlines()[-1] == "verdict: " + verdict(report)
    assert "routing set (candidate_threshold=0.8)" in text


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3, 1, 2, 0], "0-3"), ([1, 4, 5], "1,4-5"), ([7], "7"), ([2, 0], "0,2")],
)
def test_rank_lists_collapse_runs(ranks: list[int], text: str) -> None:
    assert ranks_text(ranks) == text


def test_a_suppressed_label_names_the_telemetry_problem() -> None:
    fixture = direct_exposure_fixture(np.random.default_rng(3))
    side = sf.SideEvidence(missing_ranks=(99,), gather_ok=False)
    report = sf.analyze(fixture.d, fixture.stages, side=side)
    assert not report.has("direct_exposure")
    (withheld,) = report.reasons["direct_exposure"]
    assert withheld == "not emitted: suppressed by telemetry_limited: missing ranks [99]: " + (
        "analyzed the ranks that arrived"
    )
    assert verdict(report).startswith("Telemetry is incomplete (missing ranks [99]")


def test_stage_lists_read_as_prose() -> None:
    assert listing([BACKWARD_STAGE]) == "backward"
    assert listing([DATA_STAGE, BACKWARD_STAGE]) == "data loading and backward"
    assert listing(["a", "b", RESIDUAL_STAGE]) == "a, b and untimed step time"
