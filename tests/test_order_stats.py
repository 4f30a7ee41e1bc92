"""The analyzer's partition-based order statistics equal the ones a full sort gives, exactly.

``window_inputs`` and ``clipped_step_times`` take the median and the second largest prefix of each
lane from one partition instead of a sort (the sort was most of the analyzer's time at thousands
of ranks). These tests hold the fast path to the sorted values bit for bit, on random lanes and
windows full of ties, and the whole analysis to the pure-Python reference on such windows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import reference as ref
import stagefrontier as sf
from stagefrontier.analysis.accounting import rank_last_prefixes
from stagefrontier.analysis.evidence import window_inputs
from stagefrontier.analysis.gain import copy_steps_last
from stagefrontier.analysis.gates import Gates
from stagefrontier.analysis.order_stats import partitioned_median, second_largest

# Few distinct values, so most lanes hold ties, some of them at the median or the top.
tied_values = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.0 + 2**-40, 3.0])
lanes = st.tuples(st.integers(1, 4), st.integers(1, 40)).flatmap(
    lambda shape: arrays(np.float64, shape, elements=tied_values)
)


def sorted_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median and second largest of each row from a full sort (the path the analyzer left)."""
    ordered = np.sort(x, axis=-1)
    k = x.shape[-1]
    if k % 2:
        median = ordered[..., k // 2]
    else:
        median = 0.5 * (ordered[..., k // 2 - 1] + ordered[..., k // 2])
    return median, ordered[..., -2] if k > 1 else ordered[..., 0]


@settings(max_examples=300, deadline=None)
@given(lanes)
def test_partitioned_median_and_second_largest_equal_the_sorted_values(x: np.ndarray) -> None:
    want_median, want_second = sorted_stats(x)
    buffer = x.copy()
    median = partitioned_median(buffer)
    assert np.array_equal(median, want_median)
    if x.shape[-1] > 1:
        assert np.array_equal(second_largest(buffer), want_second)


def tied_window(seed: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Durations from a handful of values: equal prefixes across ranks in most steps."""
    rng = np.random.default_rng(seed)
    return rng.choice([0.0, 0.01, 0.02, 0.05], size=shape)


def random_window(seed: int, shape: tuple[int, int, int]) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = rng.lognormal(-3.0, 0.7, size=shape)
    d[rng.random(shape) < 0.1] = 0.0
    return d


SHAPES = [(1, 1, 1), (3, 2, 4), (5, 3, 3), (7, 8, 6), (20, 33, 5), (17, 64, 6)]
WINDOWS = [tied_window, random_window]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("make", WINDOWS)
@pytest.mark.parametrize("baseline", ["rank_median", "cohort_median"])
def test_window_inputs_equal_the_sorted_computation(
    shape: tuple[int, int, int], make: object, baseline: str
) -> None:
    d = make(11, shape)  # type: ignore[operator]
    n, r, s = shape
    inputs = window_inputs(d, Gates(gain_baseline=baseline), None)  # type: ignore[arg-type]
    prefix = rank_last_prefixes(d)
    median, second = sorted_stats(prefix)
    assert np.array_equal(inputs.median, median)
    assert np.array_equal(inputs.second, second if r > 1 else np.zeros((n, s)))
    by_rank = d.transpose(0, 2, 1)
    if baseline == "rank_median":
        base = sorted_stats(d.transpose(1, 2, 0))[0].T[None, :, :]
    else:
        base = sorted_stats(by_rank)[0][:, :, None]
    clipped = (prefix[:, -1, None, :] - np.maximum(by_rank - base, 0.0)).max(axis=2)
    assert np.array_equal(inputs.clipped, clipped)


@pytest.mark.parametrize("steps", [1, 15, 16, 17, 40])
def test_copy_steps_last_is_the_transpose(steps: int) -> None:
    d = random_window(5, (steps, 9, 4))
    out = np.empty((9, 4, steps))
    copy_steps_last(d, out)
    assert np.array_equal(out, d.transpose(1, 2, 0))


@pytest.mark.parametrize("shape", [(6, 5, 3), (9, 8, 4), (12, 7, 5)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_analyze_on_tied_windows_matches_the_reference(
    shape: tuple[int, int, int], seed: int
) -> None:
    d = tied_window(seed, shape)
    d[0, 0, 0] += 0.01  # never an all-zero window
    stages = [f"s{i}" for i in range(shape[2])]
    rep = sf.analyze(d, stages)
    assert [rep.direct_gain[x] for x in stages] == pytest.approx(
        ref.direct_gain(d, "rank_median"), rel=1e-9, abs=1e-12
    )
    cohort = sf.analyze(d, stages, gates=Gates(gain_baseline="cohort_median"))
    assert [cohort.direct_gain[x] for x in stages] == pytest.approx(
        ref.direct_gain(d, "cohort_median"), rel=1e-9, abs=1e-12
    )
    lags, gaps = ref.lag_means(d), ref.gap_means(d)
    assert gaps is not None
    loc = ref.localization(d, tie=rep.gates.leader_tie)
    for j, name in enumerate(stages):
        got = rep.localization[name]
        assert got.lag_mean_s == pytest.approx(lags[j], rel=1e-9, abs=1e-12)
        assert got.gap_mean_s == pytest.approx(gaps[j], rel=1e-9, abs=1e-12)
        assert got.leader_rank == loc[j]["leader_rank"]
        assert got.tied_ranks == loc[j]["tied_ranks"]
