"""The comparison baselines: hand-computed values and the same validation as ``analyze``."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest

import reference as ref
import stagefrontier as sf
from stagefrontier import DurationsError, EmptyWindowError, StageNamesError
from stagefrontier import baselines as bl

# Two steps, three ranks, stages (data, fwd, bwd); no ties in any rank total.
WINDOW = np.array(
    [
        [[6.0, 1.0, 1.2], [1.0, 1.0, 6.0], [1.1, 1.0, 5.8]],  # totals 8.2, 8.0, 7.9
        [[1.0, 2.0, 1.0], [1.0, 1.0, 1.0], [3.0, 1.0, 2.0]],  # totals 4.0, 3.0, 6.0
    ]
)
ST3 = ["data", "fwd", "bwd"]
ALL = [bl.per_stage_max, bl.per_stage_mean, bl.rank_spread, bl.slowest_rank, bl.rank0_total]


def test_per_stage_max() -> None:
    # Step maxima (6, 1, 6.0) and (3, 2, 2).
    np.testing.assert_allclose(bl.per_stage_max(WINDOW), np.array([9.0, 3.0, 8.0]) / 20.0)


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        # Means (8.1/3, 1, 13/3) and (5/3, 4/3, 4/3).
        (bl.per_stage_mean, np.array([13.1, 7.0, 17.0]) / 37.1),
        # Odd ranks, max - median: (6 - 1.1, 0, 6.0 - 5.8) and (3 - 1, 2 - 1, 2 - 1).
        (bl.rank_spread, np.array([6.9, 1.0, 1.2]) / 9.1),
        # Step 0: rank 0 (8.2) is slowest, step 1: rank 2 (6.0).
        (bl.slowest_rank, np.array([9.0, 2.0, 3.2]) / 14.2),
        (bl.rank0_total, np.array([7.0, 3.0, 2.2]) / 12.2),
    ],
)
def test_baseline_shares_of_the_window(
    baseline: Callable[[np.ndarray], np.ndarray], expected: np.ndarray
) -> None:
    np.testing.assert_allclose(baseline(WINDOW), expected, rtol=1e-12)


def test_rank_spread_even_ranks() -> None:
    d = np.array([[[1.0, 4.0], [2.0, 4.0], [3.0, 1.0], [10.0, 6.0]]])
    # data: 10 - 2.5 = 7.5; second stage: 6 - 4 = 2.
    np.testing.assert_allclose(bl.rank_spread(d), [7.5 / 9.5, 2.0 / 9.5], rtol=1e-12)


def test_figure1_per_stage_max_blames_backward_duplicate() -> None:
    fig1 = WINDOW[:1].copy()
    fig1[0, 1, 2] = 6.2
    fig1[0, 2, 2] = 6.0
    max_shares = bl.per_stage_max(fig1)
    np.testing.assert_allclose(max_shares, np.array([6.0, 1.0, 6.2]) / 13.2, rtol=1e-12)
    assert int(np.argmax(max_shares)) == 2  # the downstream wait duplicate wins
    assert sf.analyze(fig1, ST3).top1 == "data"


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 1, 3), (6, 4, 5), (7, 3, 2)])
def test_max_and_mean_match_reference(shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(sum(shape))
    d = rng.exponential(0.1, size=shape)
    np.testing.assert_allclose(bl.per_stage_max(d), ref.per_stage_max_shares(d), rtol=1e-12)
    np.testing.assert_allclose(bl.per_stage_mean(d), ref.per_stage_mean_shares(d), rtol=1e-12)


@pytest.mark.parametrize("fn", ALL)
def test_shares_sum_to_one_and_accept_stage_names(fn: Callable[..., np.ndarray]) -> None:
    shares = fn(WINDOW, ST3)
    assert shares.shape == (3,)
    assert shares.sum() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_array_equal(shares, fn(WINDOW))


def test_single_rank_baselines_agree() -> None:
    d = np.random.default_rng(3).exponential(0.2, size=(6, 1, 4))
    expected = d[:, 0, :].sum(axis=0) / d.sum()
    for fn in (bl.per_stage_max, bl.per_stage_mean, bl.slowest_rank, bl.rank0_total):
        np.testing.assert_allclose(fn(d), expected, rtol=1e-12)
    np.testing.assert_array_equal(bl.rank_spread(d), np.zeros(4))  # no dispersion at all


def test_registry() -> None:
    assert list(bl.BASELINES) == [
        "per_stage_max",
        "per_stage_mean",
        "rank_spread",
        "slowest_rank",
        "rank0_total",
    ]
    assert list(bl.BASELINES.values()) == ALL


@pytest.mark.parametrize("fn", ALL)
def test_zero_window_gives_zero_shares_without_warnings(fn: Callable[..., np.ndarray]) -> None:
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        shares = fn(np.zeros((3, 2, 4)))
    np.testing.assert_array_equal(shares, np.zeros(4))


@pytest.mark.parametrize("fn", ALL)
@pytest.mark.parametrize(
    ("value", "word"),
    [(np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite"), (-1.0, "negative")],
)
def test_bad_values_rejected(fn: Callable[..., np.ndarray], value: float, word: str) -> None:
    d = WINDOW.copy()
    d[1, 2, 0] = value
    with pytest.raises(DurationsError, match=word):
        fn(d)


@pytest.mark.parametrize("fn", ALL)
def test_shape_and_names_rejected(fn: Callable[..., np.ndarray]) -> None:
    with pytest.raises(DurationsError, match="3 axes"):
        fn(np.ones((2, 3)))
    for shape in [(0, 2, 3), (2, 0, 3), (2, 3, 0)]:
        with pytest.raises(EmptyWindowError, match="empty window"):
            fn(np.zeros(shape))
    with pytest.raises(StageNamesError, match="2 stage names given"):
        fn(WINDOW, ["data", "fwd"])
    with pytest.raises(StageNamesError, match="duplicate"):
        fn(WINDOW, ["data", "data", "bwd"])
