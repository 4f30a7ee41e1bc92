"""Window summaries: partitions combine into the whole, the summary analysis agrees with
``analyze``, and what is approximate is bounded and said."""

from __future__ import annotations

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier import Gates, SummaryError, WindowSummary, analyze_summary, combine, summarize
from stagefrontier.analysis.baselines import BASELINES, summary_baselines
from window_support import random_window

STAGES = ["data", "fwd", "bwd", "opt", "step.other_cpu_wall"]
ACCUMULATED = ["data", "fwd[0]", "bwd[0]", "fwd[1]", "bwd[1]", "opt"]
EXACT_ARRAYS = ("top_prefix", "top_rank", "top_dominant", "clipped", "group_clipped", "stage_max",
                "mean_top", "mean_top_rank", "mean_min")  # fmt: skip


def partition(d: np.ndarray, stages: list[str], seed: int, **kwargs: object) -> WindowSummary:
    """Summaries of random disjoint rank groups of ``d``, combined in a random tree."""
    rng = np.random.default_rng(seed)
    r = d.shape[1]
    cuts = np.sort(rng.choice(np.arange(1, r), size=min(r - 1, rng.integers(0, 6)), replace=False))
    groups = np.split(rng.permutation(r), cuts)
    parts = [summarize(d[:, g, :], g.tolist(), stages, **kwargs) for g in groups]  # type: ignore[arg-type]
    if len(parts) > 2:
        split = int(rng.integers(1, len(parts)))
        parts = [combine(parts[:split]), combine(parts[split:])]
    return combine(parts)


@pytest.mark.parametrize("seed", range(12))
def test_combined_partitions_equal_the_summary_of_the_whole(seed: int) -> None:
    stages = ACCUMULATED if seed % 3 == 0 else STAGES
    rng = np.random.default_rng(seed)
    d = random_window(seed, (int(rng.integers(1, 9)), int(rng.integers(2, 40)), len(stages)))
    whole = summarize(d, range(d.shape[1]), stages)
    merged = partition(d, stages, seed)
    np.testing.assert_array_equal(merged.ranks, whole.ranks)
    for name in EXACT_ARRAYS:
        np.testing.assert_array_equal(getattr(merged, name), getattr(whole, name), err_msg=name)
    np.testing.assert_allclose(merged.stage_sum, whole.stage_sum, rtol=1e-12)
    np.testing.assert_array_equal(merged.slowest, whole.slowest)
    assert merged.rank_total_sum_s == pytest.approx(whole.rank_total_sum_s, rel=1e-12)
    # The sketch keeps exact counts: each lane counts every rank once.
    lanes = np.repeat(np.arange(merged.sketch.sizes.size), merged.sketch.sizes)
    assert (np.bincount(lanes, weights=merged.sketch.count) == d.shape[1]).all()


@pytest.mark.parametrize("seed", range(12))
def test_summary_analysis_agrees_with_analyze(seed: int) -> None:
    stages = ACCUMULATED if seed % 3 == 0 else STAGES
    rng = np.random.default_rng(100 + seed)
    d = random_window(seed, (int(rng.integers(1, 12)), int(rng.integers(2, 60)), len(stages)))
    full = sf.analyze(d, stages)
    got = analyze_summary(partition(d, stages, seed))
    for name in ("exposed_s", "shares", "advances", "direct_gain", "top1", "top2", "leaders"):
        assert getattr(got, name) == getattr(full, name), name
    assert (got.routing_set, got.semantic_shares) == (full.routing_set, full.semantic_shares)
    assert got.semantic_gain == full.semantic_gain
    for name in stages:
        want, have = full.localization[name], got.localization[name]
        assert (have.leader_rank, have.confident_steps, have.leader_switches) == (
            want.leader_rank,
            want.confident_steps,
            want.leader_switches,
        )
        assert have.gap_mean_s == want.gap_mean_s
        bound = have.lag_error_bound_s
        assert abs(have.lag_mean_s - want.lag_mean_s) <= bound + 1e-15
        assert abs(have.delta_lag_mean_s - want.delta_lag_mean_s) <= bound + 1e-15
        if not have.tie_truncated_steps:
            assert have.tied_ranks == want.tied_ranks


def test_a_summary_of_every_rank_reproduces_analyze_exactly() -> None:
    d = random_window(7, (9, 13, len(ACCUMULATED)))
    for gates in (Gates(), Gates(gain_baseline="cohort_median", leader_tie=0.2)):
        summary = summarize(d, range(13), ACCUMULATED, top_k=13, gain_baseline=gates.gain_baseline)
        assert analyze_summary(summary, gates=gates) == sf.analyze(d, ACCUMULATED, gates=gates)


def test_the_median_bound_holds_and_is_reported() -> None:
    d = random_window(3, (6, 300, len(STAGES)))
    report = analyze_summary(partition(d, STAGES, 3, top_k=2))
    full = sf.analyze(d, STAGES)
    bounds = [report.localization[s].lag_error_bound_s for s in STAGES]
    assert all(b > 0 for b in bounds)
    for name in STAGES:
        assert abs(report.localization[name].lag_mean_s - full.localization[name].lag_mean_s) <= (
            report.localization[name].lag_error_bound_s
        )
    assert any("lag_error_bound_s" in r for r in report.reasons["frontier_accounting"])


def test_tie_sets_beyond_top_k_are_said() -> None:
    d = np.full((4, 12, 3), 0.01)  # every rank tied at every boundary
    report = analyze_summary(partition(d, ["data", "fwd", "bwd"], 1, top_k=3))
    loc = report.localization["bwd"]
    assert loc.tie_truncated_steps == 4
    assert (
        len(loc.tied_ranks)
        < 12
        == len(sf.analyze(d, ["data", "fwd", "bwd"]).localization["bwd"].tied_ranks)
    )
    assert any("tie sets may be incomplete" in r for r in report.reasons["frontier_accounting"])
    exact = analyze_summary(summarize(d, range(12), ["data", "fwd", "bwd"], top_k=12))
    assert exact.localization["bwd"].tie_truncated_steps == 0


def test_merged_cohort_median_gains_are_a_telemetry_caveat() -> None:
    d = random_window(5, (5, 16, len(STAGES)))
    gates = Gates(gain_baseline="cohort_median")
    parts = [summarize(d[:, i : i + 4], range(i, i + 4), STAGES, gain_baseline="cohort_median")
             for i in range(0, 16, 4)]  # fmt: skip
    report = analyze_summary(combine(parts), gates=gates)
    assert "telemetry_limited" in report.labels
    assert any("cohort medians" in r for r in report.reasons["telemetry_limited"])
    with pytest.raises(SummaryError, match="computed against 'cohort_median'"):
        analyze_summary(combine(parts))


def test_reference_baseline_is_applied_per_group() -> None:
    d = random_window(9, (5, 10, len(STAGES)))
    ref = np.full((10, len(STAGES)), 0.02)
    gates = Gates(gain_baseline="reference")
    full = sf.analyze(d, STAGES, gates=gates, side=sf.SideEvidence(no_stall_reference_s=ref))
    parts = [
        summarize(d[:, g], g, STAGES, gain_baseline="reference", reference=ref[g])
        for g in ([0, 3, 4], [1, 2, 5, 6, 7, 8, 9])
    ]
    assert analyze_summary(combine(parts), gates=gates).direct_gain == full.direct_gain


def test_baselines_from_a_summary() -> None:
    d = random_window(11, (7, 24, len(STAGES)))
    got = summary_baselines(partition(d, STAGES, 11))
    for name, shares in got.items():
        np.testing.assert_allclose(shares, BASELINES[name](d, STAGES), rtol=1e-12, err_msg=name)


def test_combine_refuses_what_does_not_fit() -> None:
    d = random_window(2, (4, 6, 3))
    a = summarize(d[:, :3], [0, 1, 2], ["a", "b", "c"])
    with pytest.raises(SummaryError, match=r"rank\(s\) \[2\]"):
        combine([a, summarize(d[:, 3:], [2, 3, 4], ["a", "b", "c"])])
    with pytest.raises(SummaryError, match="stages"):
        combine([a, summarize(d[:, 3:], [3, 4, 5], ["a", "b", "x"])])
    with pytest.raises(SummaryError, match="steps"):
        combine([a, summarize(d[:2, 3:], [3, 4, 5], ["a", "b", "c"])])
    with pytest.raises(SummaryError, match="top_k"):
        combine([a, summarize(d[:, 3:], [3, 4, 5], ["a", "b", "c"], top_k=3)])
    with pytest.raises(SummaryError, match="at least one"):
        combine([])
    with pytest.raises(SummaryError, match="distinct"):
        summarize(d[:, :2], [1, 1], ["a", "b", "c"])
    with pytest.raises(SummaryError, match="top_k"):
        summarize(d, range(6), ["a", "b", "c"], top_k=1)
    with pytest.raises(sf.SideEvidenceError, match="per-rank arrays"):
        analyze_summary(a, side=sf.SideEvidence(no_stall_reference_s=np.zeros(3)))
