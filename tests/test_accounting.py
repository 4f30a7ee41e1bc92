"""Frontier accounting: hand-computed paper examples, the slack identity and the max/mean bounds."""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref
import stagefrontier as sf
from stagefrontier.analysis.accounting import stage_sum_bounds, window_shares
from window_support import random_window

# Paper figure 1: r0 has a slow data stage, r1 and r2 wait for it inside backward.
FIG1 = np.array([[[6.0, 1.0, 1.2], [1.0, 1.0, 6.2], [1.1, 1.0, 6.0]]])
# Paper figure 2: prefix curves r0 (4, 5, 8), r1 (1, 6, 8), r2 (1, 3, 8.5).
FIG2 = np.array([[[4.0, 1.0, 3.0], [1.0, 5.0, 2.0], [1.0, 2.0, 5.5]]])
# The two-rank non-identifiable matrix r0 = (10, 0), r1 = (0, 10).
NON_IDENTIFIABLE = np.array([[[10.0, 0.0], [0.0, 10.0]]])

SHAPES = [(1, 1, 1), (4, 1, 3), (1, 5, 4), (6, 3, 1), (7, 4, 6), (8, 5, 3), (9, 2, 5), (10, 6, 2)]


# --- the paper's worked examples ----------------------------------------------------------------


def test_figure1_prefixes_frontier_advances() -> None:
    np.testing.assert_allclose(
        sf.prefixes(FIG1)[0],
        [[6.0, 7.0, 8.2], [1.0, 2.0, 8.2], [1.1, 2.1, 8.1]],
        rtol=0,
        atol=1e-12,
    )
    np.testing.assert_allclose(sf.frontier(FIG1)[0], [6.0, 7.0, 8.2], rtol=0, atol=1e-12)
    np.testing.assert_allclose(sf.advances(FIG1)[0], [6.0, 1.0, 1.2], rtol=0, atol=1e-12)
    assert sf.advances(FIG1)[0].sum() == pytest.approx(8.2, abs=1e-12)


def test_figure1_per_stage_max_overcounts_to_13_2() -> None:
    exposed, max_sum, mean_sum = stage_sum_bounds(FIG1)
    assert exposed[0] == pytest.approx(8.2, abs=1e-12)
    assert max_sum[0] == pytest.approx(13.2, abs=1e-12)  # 6.0 + 1.0 + 6.2
    assert mean_sum[0] == pytest.approx((8.1 + 2 * 8.2) / 3, abs=1e-12)
    assert ref.per_stage_max_sum(FIG1) == pytest.approx([13.2], abs=1e-12)


def test_figure1_slack_values_and_identity() -> None:
    lam = sf.slack(FIG1)[0]
    # F after data is 6.0 and after forward 7.0; r1 and r2 owe 5.0 and 4.9 at both boundaries.
    np.testing.assert_allclose(lam, [[0.0, 0.0, 0.0], [0.0, 5.0, 5.0], [0.0, 4.9, 4.9]], atol=1e-12)
    # a_bwd = max(1.2 - 0, 6.2 - 5.0, 6.0 - 4.9) = 1.2: the wait is not charged to backward again.
    assert (FIG1[0, :, 2] - lam[:, 2]).max() == pytest.approx(1.2, abs=1e-12)


def test_figure2_advances_from_different_leaders() -> None:
    np.testing.assert_allclose(
        sf.prefixes(FIG2)[0], [[4.0, 5.0, 8.0], [1.0, 6.0, 8.0], [1.0, 3.0, 8.5]], atol=1e-12
    )
    np.testing.assert_allclose(sf.frontier(FIG2)[0], [4.0, 6.0, 8.5], atol=1e-12)
    np.testing.assert_allclose(sf.advances(FIG2)[0], [4.0, 2.0, 2.5], atol=1e-12)
    leaders = [int(np.argmax(sf.prefixes(FIG2)[0, :, s])) for s in range(3)]
    assert leaders == [0, 1, 2]


def test_non_identifiable_matrix_charges_data_only() -> None:
    np.testing.assert_array_equal(sf.frontier(NON_IDENTIFIABLE)[0], [10.0, 10.0])
    np.testing.assert_array_equal(sf.advances(NON_IDENTIFIABLE)[0], [10.0, 0.0])


def test_single_rank_frontier_is_the_rank_vector() -> None:
    d = random_window(3, (5, 1, 4))
    np.testing.assert_allclose(sf.advances(d), d[:, 0, :], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(sf.frontier(d), np.cumsum(d[:, 0, :], axis=1), rtol=1e-12)


def test_single_stage_advance_is_slowest_rank() -> None:
    d = random_window(4, (6, 3, 1))
    np.testing.assert_array_equal(sf.advances(d)[:, 0], d[:, :, 0].max(axis=1))


# --- against the slow reference ----------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_accounting_functions_match_reference(shape: tuple[int, int, int], seed: int) -> None:
    d = random_window(seed, shape)
    np.testing.assert_allclose(sf.prefixes(d), ref.prefixes(d), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sf.frontier(d), ref.frontier(d), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sf.advances(d), ref.advances(d), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(sf.slack(d), ref.slack(d), rtol=1e-12, atol=1e-13)
    exposed, max_sum, mean_sum = stage_sum_bounds(d)
    np.testing.assert_allclose(exposed, ref.step_exposed(d), rtol=1e-12)
    np.testing.assert_allclose(max_sum, ref.per_stage_max_sum(d), rtol=1e-12)
    np.testing.assert_allclose(mean_sum, ref.per_stage_mean_sum(d), rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_slack_identity(shape: tuple[int, int, int]) -> None:
    d = random_window(11, shape)
    lam = sf.slack(d)
    assert (lam >= -1e-12).all()
    assert np.all(lam[:, :, 0] == 0.0)
    np.testing.assert_allclose((d - lam).max(axis=1), sf.advances(d), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(ref.advances_from_slack(d), ref.advances(d), rtol=1e-12, atol=1e-13)


def test_window_shares_and_floor() -> None:
    step_adv = np.array([[1.0, 3.0], [2.0, 2.0]])
    shares, exposed, defined = window_shares(step_adv, 1e-9)
    assert defined is True
    assert exposed == 8.0
    np.testing.assert_allclose(shares, [3.0 / 8.0, 5.0 / 8.0], rtol=1e-15)
    shares, exposed, defined = window_shares(np.full((2, 2), 1e-12), 1e-9)
    assert defined is False
    assert exposed == pytest.approx(4e-12)
    np.testing.assert_array_equal(shares, [0.0, 0.0])


# --- bounds F <= M <= min(R, S) F and F / R <= Mbar <= F ------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_bounds_on_random_windows(shape: tuple[int, int, int]) -> None:
    d = random_window(21, shape)
    _, r, s = shape
    exposed, max_sum, mean_sum = stage_sum_bounds(d)
    eps = 1e-12 * exposed
    assert np.all(exposed <= max_sum + eps)
    assert np.all(max_sum <= min(r, s) * exposed + eps)
    assert np.all(exposed / r <= mean_sum + eps)
    assert np.all(mean_sum <= exposed + eps)


@pytest.mark.parametrize(("r", "s"), [(2, 2), (3, 5), (5, 3), (4, 4), (1, 3), (3, 1)])
def test_per_stage_max_upper_bound_is_tight(r: int, s: int) -> None:
    # Duration D on min(R, S) distinct rank-stage pairs, no rank with more than one nonzero.
    k = min(r, s)
    d = np.zeros((1, r, s))
    for i in range(k):
        d[0, i, i] = 2.5
    exposed, max_sum, _ = stage_sum_bounds(d)
    assert exposed[0] == 2.5
    assert max_sum[0] == k * 2.5
    assert max_sum[0] == min(r, s) * exposed[0]


def test_per_stage_max_lower_bound_is_tight() -> None:
    # A single active rank: its per-stage maxima are its own durations and they sum to F.
    d = np.zeros((1, 4, 3))
    d[0, 2] = [1.0, 2.0, 0.5]
    exposed, max_sum, _ = stage_sum_bounds(d)
    assert exposed[0] == 3.5
    assert max_sum[0] == 3.5


@pytest.mark.parametrize("r", [1, 2, 3, 8])
def test_per_stage_mean_lower_bound_is_tight(r: int) -> None:
    # One rank has total D, every other rank is idle: the mean hides the tail by exactly R.
    d = np.zeros((1, r, 3))
    d[0, 0] = [1.0, 0.5, 2.5]
    exposed, _, mean_sum = stage_sum_bounds(d)
    assert exposed[0] == 4.0
    assert mean_sum[0] == pytest.approx(4.0 / r, rel=1e-15)


def test_per_stage_mean_upper_bound_is_tight() -> None:
    # Identical ranks: the mean equals the frontier.
    d = np.tile(np.array([0.25, 1.0, 0.75]), (2, 5, 1))
    exposed, _, mean_sum = stage_sum_bounds(d)
    np.testing.assert_allclose(mean_sum, exposed, rtol=1e-15)
    np.testing.assert_allclose(exposed, [2.0, 2.0], rtol=1e-15)
