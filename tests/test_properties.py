"""Hypothesis properties of the frontier accounting and of ``analyze``."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import reference as ref
import stagefrontier as sf
from stagefrontier.analysis.accounting import stage_sum_bounds

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

durations = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
shapes = st.tuples(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=5),
)
windows = shapes.flatmap(lambda shape: arrays(np.float64, shape, elements=durations))


def names(s: int) -> list[str]:
    return [f"s{i}" for i in range(s)]


@SETTINGS
@given(windows)
def test_telescoping(d: np.ndarray) -> None:
    a = sf.advances(d)
    f = sf.frontier(d)
    total = a.sum(axis=1)
    np.testing.assert_allclose(total, f[:, -1], rtol=1e-12, atol=0.0)
    np.testing.assert_allclose(total, d.sum(axis=2).max(axis=1), rtol=1e-12, atol=0.0)


@SETTINGS
@given(windows)
def test_advances_nonnegative_and_frontier_monotone(d: np.ndarray) -> None:
    assert (sf.advances(d) >= 0.0).all()
    assert (np.diff(sf.frontier(d), axis=1) >= 0.0).all()
    assert (sf.slack(d) >= -1e-12 * max(1.0, float(d.sum()))).all()


@SETTINGS
@given(windows)
def test_slack_identity(d: np.ndarray) -> None:
    lam = sf.slack(d)
    scale = max(1.0, float(d.sum(axis=2).max()))
    np.testing.assert_allclose((d - lam).max(axis=1), sf.advances(d), rtol=0, atol=1e-12 * scale)


@SETTINGS
@given(windows)
def test_max_and_mean_bounds(d: np.ndarray) -> None:
    _, r, s = d.shape
    exposed, max_sum, mean_sum = stage_sum_bounds(d)
    eps = 1e-12 * np.maximum(exposed, 1.0)
    assert np.all(exposed <= max_sum + eps)
    assert np.all(max_sum <= min(r, s) * exposed + eps)
    assert np.all(exposed / r <= mean_sum + eps)
    assert np.all(mean_sum <= exposed + eps)


@SETTINGS
@given(windows, st.randoms(use_true_random=False))
def test_permuting_ranks_leaves_shares_unchanged(d: np.ndarray, rnd: object) -> None:
    _, r, s = d.shape
    perm = list(range(r))
    rnd.shuffle(perm)  # type: ignore[attr-defined]
    stages = names(s)
    a = sf.analyze(d, stages)
    b = sf.analyze(d[:, perm, :], stages)
    assert a.shares_defined == b.shares_defined
    assert np.isclose(a.exposed_s, b.exposed_s, rtol=1e-12, atol=0.0)
    for name in stages:
        assert np.isclose(a.shares[name], b.shares[name], rtol=1e-12, atol=1e-15)
        assert np.isclose(a.advances[name], b.advances[name], rtol=1e-12, atol=1e-12)
        assert np.isclose(a.direct_gain[name], b.direct_gain[name], rtol=1e-9, atol=1e-12)
    assert a.routing_set == b.routing_set
    assert a.top1 == b.top1


@SETTINGS
@given(windows, st.floats(min_value=1e-3, max_value=1e3))
def test_scaling_durations_leaves_shares_unchanged(d: np.ndarray, c: float) -> None:
    assume(float(d.sum(axis=2).max(axis=1).sum()) * min(c, 1.0) > 1e-6)
    stages = names(d.shape[2])
    a = sf.analyze(d, stages)
    b = sf.analyze(d * c, stages)
    assert a.shares_defined and b.shares_defined
    assert np.isclose(b.exposed_s, a.exposed_s * c, rtol=1e-12, atol=0.0)
    for name in stages:
        assert np.isclose(a.shares[name], b.shares[name], rtol=1e-9, atol=1e-12)
        assert np.isclose(a.direct_gain[name], b.direct_gain[name], rtol=1e-9, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(windows)
def test_shares_match_slow_reference(d: np.ndarray) -> None:
    assume(ref.exposed(d) > 1e-6)
    stages = names(d.shape[2])
    rep = sf.analyze(d, stages)
    assert np.allclose([rep.shares[x] for x in stages], ref.shares(d), rtol=1e-12, atol=1e-13)
    assert np.allclose(
        [rep.direct_gain[x] for x in stages], ref.direct_gain(d), rtol=1e-9, atol=1e-12
    )
    assert np.isclose(sum(rep.shares.values()), 1.0, rtol=1e-12, atol=0.0)
