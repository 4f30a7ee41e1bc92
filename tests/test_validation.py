"""The RQ1 validation suite: its result, and the fixtures it is built from."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.analysis import validation as v

KEYS = {
    "telescoping_max_error",
    "bound_violations",
    "stability_max_ratio",
    "sync_wait_recovery",
    "direct_exposure_recovery",
    "downgrade_fixtures",
    "ok",
}


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return v.run_validation()


def test_result_keys_and_json(result: dict[str, Any]) -> None:
    assert set(result) == KEYS
    assert set(result["sync_wait_recovery"]) == {"stagefrontier", "per_stage_max", "per_stage_mean"}
    assert set(result["downgrade_fixtures"]) == {
        "co_critical",
        "role_heterogeneous",
        "telemetry_limited",
        "two_stage_tie",
    }
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_every_check_holds(result: dict[str, Any]) -> None:
    assert result["telescoping_max_error"] < 1e-12
    assert result["bound_violations"] == 0
    assert 0.9 < result["stability_max_ratio"] <= 1.0  # near 1: the bound is approached
    assert result["sync_wait_recovery"] == {
        "stagefrontier": 1.0,
        "per_stage_max": 0.0,
        "per_stage_mean": 0.0,
    }
    assert result["direct_exposure_recovery"] == 1.0
    assert all(result["downgrade_fixtures"].values())
    assert result["ok"] is True
    assert all(row.passed for row in v.check_rows(result))


def test_suite_is_deterministic(result: dict[str, Any]) -> None:
    assert v.run_validation() == result


def test_a_failing_check_fails_the_suite(result: dict[str, Any]) -> None:
    broken = json.loads(json.dumps(result))
    broken["sync_wait_recovery"]["per_stage_max"] = 1 / 120
    broken["downgrade_fixtures"]["two_stage_tie"] = False
    failed = [row.name for row in v.check_rows(broken) if not row.passed]
    assert failed == ["sync-wait recovery, per-stage max", "downgrade fixture: two_stage_tie"]


@pytest.mark.parametrize("seed", range(5))
def test_sync_wait_fixture_is_a_displaced_upstream_stall(seed: int) -> None:
    f = v.sync_wait_fixture(np.random.default_rng(seed))
    assert f.injected in ("data.next_wait", "model.fwd_loss_cpu_wall")
    bwd = f.stages.index("model.backward_cpu_wall")
    ends = f.d[:, :, : bwd + 1].sum(axis=2)
    # Backward ends at the collective's completion on every rank: waits equalize the prefixes.
    np.testing.assert_allclose(ends, ends[:, :1].repeat(ends.shape[1], axis=1), rtol=1e-12)
    # The host-visible backward of a waiting rank is longer than the stall it absorbed.
    stalled = f.d[:, f.rank, f.stages.index(f.injected)]
    others = np.delete(f.d[:, :, bwd], f.rank, axis=1)
    assert (others.max(axis=1) > stalled).all()
    report = sf.analyze(f.d, f.stages)
    assert report.top1 == f.injected
    assert report.leaders[f.injected] == f.rank


@pytest.mark.parametrize("seed", range(5))
def test_direct_exposure_fixture_spikes_in_well_under_half_the_steps(seed: int) -> None:
    f = v.direct_exposure_fixture(np.random.default_rng(seed))
    s = f.stages.index(f.injected)
    column = f.d[:, f.rank, s]
    spiking = column > 10 * np.median(column)
    assert 0 < spiking.sum() < 0.4 * len(column)
    others = np.delete(f.d[:, :, s], f.rank, axis=1)
    assert others.max() < 2 * np.median(others)
    assert f.injected != sf.RESIDUAL_STAGE


def test_tight_fixtures_attain_their_bounds() -> None:
    rng = np.random.default_rng(0)
    assert v._tight_fixtures(rng, r=4, s=6) == 0
    # The M = min(R, S) F fixture: four ranks, one unit each on a distinct stage.
    d = np.zeros((1, 4, 6))
    d[0, np.arange(4), np.arange(4)] = 2.0
    exposed, m_max, m_mean = sf.analysis.accounting.stage_sum_bounds(d)
    assert (exposed[0], m_max[0], m_mean[0]) == (2.0, 8.0, 2.0)


def test_bound_check_counts_violations_and_missed_equalities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = np.array([[[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.0], [0.0, 0.0]]])
    assert v._bound_violations(d) == 0
    # Per-step numbers no real window can produce: F > M in step 0, Mbar < F / R in step 1.
    fake = (np.array([2.0, 1.0]), np.array([1.0, 1.0]), np.array([2.0, 0.1]))
    monkeypatch.setattr(v, "stage_sum_bounds", lambda _d: fake)
    assert v._bound_violations(d) == 2
    # With bounds that hold but are never attained, every tight fixture counts as a violation.
    loose = (np.ones(3), np.full(3, 1.5), np.full(3, 0.9))
    monkeypatch.setattr(v, "stage_sum_bounds", lambda _d: loose)
    assert v._tight_fixtures(np.random.default_rng(0), r=2, s=2) == 3


def test_small_runs_of_each_check() -> None:
    assert v.telescoping_max_error(windows=20) < 1e-12
    assert v.bound_violations(windows=20) == 0
    assert v.stability_max_ratio(windows=20) <= 1.0
    assert v.sync_wait_recovery(fixtures=10) == {
        "stagefrontier": 1.0,
        "per_stage_max": 0.0,
        "per_stage_mean": 0.0,
    }
    assert v.direct_exposure_recovery(fixtures=10) == 1.0
