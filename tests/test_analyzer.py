"""``analyze`` against the slow reference, label rules with default gates, report round trips."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import reference as ref
import stagefrontier as sf
from stagefrontier import Gates, SideEvidence, WindowReport
from stagefrontier.analysis.side import EVENT_MISSING, EVENT_NOT_SAMPLED, EVENT_READY
from stagefrontier.render.text import window_details
from window_support import random_window

ST3 = ["data", "fwd", "bwd"]
FWD_STAGES = ["data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall"]
STRONG = ("direct_exposure", "sync_wait_dependent", "likely_sync_wait")

FIG1 = np.array([[[6.0, 1.0, 1.2], [1.0, 1.0, 6.2], [1.1, 1.0, 6.0]]])
FIG2 = np.array([[[4.0, 1.0, 3.0], [1.0, 5.0, 2.0], [1.0, 2.0, 5.5]]])
NON_IDENTIFIABLE = np.array([[[10.0, 0.0], [0.0, 10.0]]])

# (N, R, S): single rank, single stage, single step, even and odd ranks and steps.
SHAPES = [
    (1, 1, 1),
    (5, 1, 3),
    (1, 4, 3),
    (6, 3, 1),
    (7, 4, 6),
    (8, 5, 3),
    (9, 2, 5),
    (10, 6, 2),
    (12, 7, 4),
]


def stage_names(s: int) -> list[str]:
    return [f"stage{i}" for i in range(s)]


def integer_window(seed: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Small integers: exact ties between ranks and exactly equal leader weights."""
    rng = np.random.default_rng(seed)
    d = rng.integers(0, 4, size=shape).astype(np.float64)
    d[0, 0, 0] += 1.0
    return d


def assert_reasons(report: WindowReport) -> None:
    """Every emitted label carries at least one non-empty reason."""
    assert report.labels[0] == "frontier_accounting"
    for label in report.labels:
        assert label in sf.ALL_LABELS
        reasons = report.reasons.get(label)
        assert reasons, f"{label} emitted without a reason"
        assert all(isinstance(r, str) and r.strip() for r in reasons)


def sync_wait_window(seed: int = 0, n: int = 12) -> np.ndarray:
    """Figure 1 repeated: rank 0 is a persistent data straggler, the rest wait in backward."""
    rng = np.random.default_rng(seed)
    base = np.array([[6.0, 1.0, 1.2], [1.0, 1.0, 6.2], [1.1, 1.0, 6.0], [1.0, 1.0, 6.1]])
    return np.tile(base, (n, 1, 1)) + rng.uniform(0.0, 0.02, size=(n, 4, 3))


SPIKE_STEPS = [2, 7, 13, 17]


def spike_window(noise: bool = True) -> np.ndarray:
    """Rank 2's data stage stalls by 12 s in 4 of 20 steps; otherwise every rank is (1, 2, 1) s."""
    d = np.tile(np.array([1.0, 2.0, 1.0]), (20, 4, 1))
    if noise:
        d += np.random.default_rng(5).uniform(0.0, 0.01, size=d.shape)
    d[SPIKE_STEPS, 2, 0] += 12.0
    return d


# --- the paper's worked examples ----------------------------------------------------------------


def test_figure1_report() -> None:
    rep = sf.analyze(FIG1, ST3)
    assert rep.advances == pytest.approx({"data": 6.0, "fwd": 1.0, "bwd": 1.2}, abs=1e-12)
    assert rep.exposed_s == pytest.approx(8.2, abs=1e-12)
    assert rep.shares == pytest.approx({"data": 6 / 8.2, "fwd": 1 / 8.2, "bwd": 1.2 / 8.2})
    assert (rep.top1, rep.top2) == ("data", "bwd")
    assert rep.routing_set == ["data", "bwd"]  # 73.2% + 14.6% reaches tau_C = 0.8
    assert rep.leaders["data"] == 0
    assert rep.leaders["fwd"] == 0
    # All three ranks end within 2% of 8.2 s: backward has no confident unique leader.
    assert rep.leaders["bwd"] is None
    assert rep.localization["bwd"].tied_ranks == [0, 1, 2]
    assert sf.baselines.per_stage_max(FIG1) == pytest.approx(np.array([6.0, 1.0, 6.2]) / 13.2)
    assert_reasons(rep)


def test_figure2_report_leaders() -> None:
    rep = sf.analyze(FIG2, ST3)
    assert rep.advances == pytest.approx({"data": 4.0, "fwd": 2.0, "bwd": 2.5}, abs=1e-12)
    assert rep.exposed_s == pytest.approx(8.5, abs=1e-12)
    assert rep.leaders == {"data": 0, "fwd": 1, "bwd": 2}
    assert [rep.localization[s].gap_mean_s for s in ST3] == pytest.approx([3.0, 1.0, 0.5])
    # Medians of the prefixes: 1, 5, 8 -> lags 3, 1, 0.5.
    assert [rep.localization[s].lag_mean_s for s in ST3] == pytest.approx([3.0, 1.0, 0.5])
    assert [rep.localization[s].delta_lag_mean_s for s in ST3] == pytest.approx([3.0, -2.0, -0.5])
    assert rep.routing_set == ["data", "bwd", "fwd"]  # 47.1% + 29.4% < 80%
    assert_reasons(rep)


def test_non_identifiable_matrix_is_co_critical() -> None:
    rep = sf.analyze(NON_IDENTIFIABLE, ["data", "bwd"])
    assert rep.advances == {"data": 10.0, "bwd": 0.0}
    assert rep.shares == {"data": 1.0, "bwd": 0.0}
    assert "co_critical" in rep.labels
    assert set(rep.co_critical_stages) == {"data", "bwd"}
    assert not any(label in rep.labels for label in STRONG)
    assert_reasons(rep)


# --- analyze against the slow reference -------------------------------------------------------


def _check_against_reference(d: np.ndarray, rep: WindowReport, stages: list[str]) -> None:
    s_count = len(stages)
    assert rep.n_steps == d.shape[0]
    assert rep.n_ranks == d.shape[1]
    assert rep.exposed_s == pytest.approx(ref.exposed(d), rel=1e-12)
    assert [rep.advances[s] for s in stages] == pytest.approx(
        ref.advance_totals(d), rel=1e-12, abs=1e-13
    )
    assert [rep.shares[s] for s in stages] == pytest.approx(ref.shares(d), rel=1e-12, abs=1e-13)
    assert [rep.direct_gain[s] for s in stages] == pytest.approx(
        ref.direct_gain(d, "rank_median"), rel=1e-9, abs=1e-12
    )
    loc = ref.localization(d, tie=rep.gates.leader_tie)
    lags = ref.lag_means(d)
    delta = ref.delta_lag_means(d)
    gaps = ref.gap_means(d)
    for j, name in enumerate(stages):
        got = rep.localization[name]
        assert rep.leaders[name] == loc[j]["leader_rank"]
        assert got.leader_rank == loc[j]["leader_rank"]
        assert got.confident_steps == loc[j]["confident_steps"]
        assert got.leader_switches == loc[j]["leader_switches"]
        assert got.tied_ranks == loc[j]["tied_ranks"]
        assert got.lag_mean_s == pytest.approx(lags[j], rel=1e-9, abs=1e-12)
        assert got.delta_lag_mean_s == pytest.approx(delta[j], rel=1e-9, abs=1e-12)
        if gaps is None:
            assert got.gap_mean_s is None
        else:
            assert got.gap_mean_s == pytest.approx(gaps[j], rel=1e-9, abs=1e-12)
    order = sorted(range(s_count), key=lambda j: (-ref.shares(d)[j], j))
    assert rep.top1 == stages[order[0]]
    assert rep.top2 == (stages[order[1]] if s_count > 1 else None)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_analyze_matches_reference(shape: tuple[int, int, int], seed: int) -> None:
    d = random_window(seed, shape)
    stages = stage_names(shape[2])
    rep = sf.analyze(d, stages)
    assert rep.shares_defined
    _check_against_reference(d, rep, stages)
    assert_reasons(rep)


@pytest.mark.parametrize("shape", SHAPES)
def test_analyze_matches_reference_on_integer_ties(shape: tuple[int, int, int]) -> None:
    d = integer_window(7, shape)
    stages = stage_names(shape[2])
    rep = sf.analyze(d, stages)
    _check_against_reference(d, rep, stages)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", [3, 4])
def test_cohort_median_gain_matches_reference(shape: tuple[int, int, int], seed: int) -> None:
    d = random_window(seed, shape)
    stages = stage_names(shape[2])
    rep = sf.analyze(d, stages, gates=Gates(gain_baseline="cohort_median"))
    assert [rep.direct_gain[s] for s in stages] == pytest.approx(
        ref.direct_gain(d, "cohort_median"), rel=1e-9, abs=1e-12
    )
    # The gain baseline does not change the accounting.
    assert [rep.shares[s] for s in stages] == pytest.approx(ref.shares(d), rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("per_rank", [False, True])
def test_reference_gain_matches_reference(shape: tuple[int, int, int], per_rank: bool) -> None:
    d = random_window(9, shape)
    _, r, s = shape
    stages = stage_names(s)
    rng = np.random.default_rng(10)
    no_stall = rng.uniform(0.0, 0.08, size=(r, s) if per_rank else (s,))
    rep = sf.analyze(
        d,
        stages,
        gates=Gates(gain_baseline="reference"),
        side=SideEvidence(no_stall_reference_s=no_stall),
    )
    assert [rep.direct_gain[x] for x in stages] == pytest.approx(
        ref.direct_gain(d, "reference", no_stall.tolist()), rel=1e-9, abs=1e-12
    )


def test_gains_are_nonnegative_and_clipped() -> None:
    d = random_window(12, (9, 5, 4))
    stages = stage_names(4)
    # A reference far above every observation clips to the observation: no gain at all.
    rep = sf.analyze(
        d,
        stages,
        gates=Gates(gain_baseline="reference"),
        side=SideEvidence(no_stall_reference_s=np.full(4, 100.0)),
    )
    assert rep.direct_gain == dict.fromkeys(stages, 0.0)
    # A zero reference removes each stage entirely.
    rep0 = sf.analyze(
        d,
        stages,
        gates=Gates(gain_baseline="reference"),
        side=SideEvidence(no_stall_reference_s=np.zeros(4)),
    )
    for name, value in rep0.direct_gain.items():
        assert 0.0 <= value <= 1.0
        assert value >= sf.analyze(d, stages).direct_gain[name] - 1e-12


def test_direct_gain_hand_value_for_spikes() -> None:
    d = spike_window(noise=False)
    # Normal steps take 4 s, spike steps 16 s; the per-rank median of rank 2's data is 1 s.
    expected = (16 * 4 + 4 * 16 - 20 * 4) / (16 * 4 + 4 * 16)
    for baseline in ("rank_median", "cohort_median"):
        rep = sf.analyze(d, ST3, gates=Gates(gain_baseline=baseline))
        assert rep.direct_gain == pytest.approx({"data": expected, "fwd": 0.0, "bwd": 0.0})
    rep = sf.analyze(d, ST3)
    assert rep.shares["data"] == pytest.approx((16 * 1 + 4 * 13) / 128)


@pytest.mark.parametrize("shape", [(6, 4, 3), (7, 3, 5)])
def test_role_shares_match_reference_per_group(shape: tuple[int, int, int]) -> None:
    d = random_window(13, shape)
    r = shape[1]
    roles = ["a" if i % 2 == 0 else "b" for i in range(r)]
    stages = stage_names(shape[2])
    rep = sf.analyze(d, stages, roles=roles)
    assert rep.roles == roles
    assert rep.role_shares is not None
    assert set(rep.role_shares) == {"a", "b"}
    for role in ("a", "b"):
        group = d[:, [i for i in range(r) if roles[i] == role], :]
        assert [rep.role_shares[role][s] for s in stages] == pytest.approx(
            ref.shares(group), rel=1e-12, abs=1e-13
        )


# --- labels with the default gates --------------------------------------------------------------


def test_role_aware_needed_when_roles_differ() -> None:
    d = spike_window()
    roles = ["pp0", "pp0", "pp1", "pp1"]
    rep = sf.analyze(d, ST3, roles=roles)
    assert "role_aware_needed" in rep.labels
    assert rep.role_shares is not None and set(rep.role_shares) == {"pp0", "pp1"}
    # No global attribution across roles: no ranking, no routing set, per-role tops instead.
    assert rep.top1 is None and rep.top2 is None and rep.routing_set == []
    assert "per role: pp0 top " in window_details(rep) and "; pp1 top " in window_details(rep)
    assert sf.WindowReport.from_dict(rep.to_dict()) == rep
    assert "direct_exposure" not in rep.labels
    assert any("role_aware_needed" in r for r in rep.reasons["direct_exposure"])
    assert_reasons(rep)

    same = sf.analyze(d, ST3, roles=["pp0"] * 4)
    assert "role_aware_needed" not in same.labels
    assert same.role_shares is None
    assert same.top1 == "data" and same.routing_set
    assert "direct_exposure" in same.labels


def test_direct_exposure_from_intermittent_spikes() -> None:
    d = spike_window()
    rep = sf.analyze(d, ST3)
    assert rep.labels == ["frontier_accounting", "direct_exposure"]
    assert rep.top1 == "data"
    assert rep.shares["data"] > 0.4
    assert rep.direct_gain["data"] == pytest.approx(0.374, abs=0.005)
    assert rep.direct_gain["fwd"] < 0.01 and rep.direct_gain["bwd"] < 0.01
    assert rep.co_critical_stages == []
    # Rank 2 leads data uniquely only in the spike steps, and carries most of its advance.
    assert rep.leaders["data"] == 2
    assert rep.localization["data"].confident_steps == len(SPIKE_STEPS)
    assert "data" in rep.reasons["direct_exposure"][0]
    assert_reasons(rep)


def test_sync_wait_labels_need_the_model_fit_indicator() -> None:
    d = sync_wait_window()
    default = sf.analyze(d, ST3)
    assert default.top1 == "data"
    assert default.direct_gain["data"] < 0.01  # persistent straggler: the median is the stall
    assert "co_critical" in default.labels
    assert "data" in default.co_critical_stages
    assert not any(label in default.labels for label in STRONG)
    assert_reasons(default)

    other = sf.analyze(d, ST3, gates=Gates(model_fit_stages=frozenset({"bwd"})))
    assert "sync_wait_dependent" not in other.labels
    assert "likely_sync_wait" not in other.labels
    assert "co_critical" in other.labels

    fit = sf.analyze(d, ST3, gates=Gates(model_fit_stages=frozenset({"data"})))
    assert "sync_wait_dependent" in fit.labels
    assert "likely_sync_wait" in fit.labels
    assert "direct_exposure" not in fit.labels
    assert "co_critical" not in fit.labels
    assert fit.leaders["data"] == 0
    assert "rank 0" in fit.reasons["likely_sync_wait"][0]
    assert_reasons(fit)


def test_sync_wait_labels_suppressed_by_telemetry() -> None:
    d = sync_wait_window()
    rep = sf.analyze(
        d,
        ST3,
        gates=Gates(model_fit_stages=frozenset({"data"})),
        side=SideEvidence(missing_ranks=(4,)),
    )
    assert "telemetry_limited" in rep.labels
    assert "sync_wait_dependent" not in rep.labels
    assert "likely_sync_wait" not in rep.labels


def test_two_stage_near_tie_is_co_critical() -> None:
    rng = np.random.default_rng(1)
    d = np.tile(np.array([4.5, 4.3, 1.2]), (10, 4, 1)) + rng.uniform(0, 0.01, size=(10, 4, 3))
    rep = sf.analyze(d, ST3)
    assert "co_critical" in rep.labels
    assert {"data", "fwd"} <= set(rep.co_critical_stages)
    assert "bwd" not in rep.co_critical_stages
    assert any("near-tied" in r for r in rep.reasons["co_critical"])
    assert not any(label in rep.labels for label in STRONG)
    assert_reasons(rep)


def test_near_tie_blocks_direct_exposure_even_with_model_fit() -> None:
    d = spike_window(noise=False)
    d[:, :, 1] = 4.0  # forward now carries 80 s of 144: 0.56 vs data's 0.47
    rep = sf.analyze(d, ST3, gates=Gates(share_tie=0.2, model_fit_stages=frozenset({"fwd"})))
    assert rep.top1 == "fwd"
    assert "co_critical" in rep.labels
    assert set(rep.co_critical_stages) >= {"data", "fwd"}
    assert not any(label in rep.labels for label in STRONG)


def _residual_window(residual: float) -> np.ndarray:
    d = np.zeros((20, 4, 6))
    d[:, :, :3] = spike_window()
    d[:, :, 5] = residual
    return d


def test_telemetry_limited_from_residual_share() -> None:
    stages = list(sf.DEFAULT_STAGES)
    clean = sf.analyze(_residual_window(0.01), stages)
    assert clean.residual_share < 0.05
    assert "telemetry_limited" not in clean.labels
    assert "direct_exposure" in clean.labels

    rep = sf.analyze(_residual_window(1.0), stages)
    assert rep.residual_share == pytest.approx(rep.shares[sf.RESIDUAL_STAGE], rel=1e-12)
    assert rep.residual_share > 0.05
    assert "telemetry_limited" in rep.labels
    assert any(sf.RESIDUAL_STAGE in r for r in rep.reasons["telemetry_limited"])
    assert "direct_exposure" not in rep.labels
    assert_reasons(rep)


def test_telemetry_limited_from_overlap_error() -> None:
    d = spike_window()
    total = float(d.sum())  # sum of every rank's timed spans
    small = sf.analyze(d, ST3, side=SideEvidence(overlap_error_s=0.005 * total))
    assert "telemetry_limited" not in small.labels
    rep = sf.analyze(d, ST3, side=SideEvidence(overlap_error_s=0.05 * total))
    # Overlap relative to the step wall time, which is the span sum minus the overlap.
    assert rep.overlap_share == pytest.approx(0.05 / 0.95, rel=1e-9)
    assert "telemetry_limited" in rep.labels
    assert any("overlap" in r for r in rep.reasons["telemetry_limited"])
    assert "direct_exposure" not in rep.labels
    assert_reasons(rep)


def test_telemetry_limited_from_missing_ranks() -> None:
    rep = sf.analyze(spike_window(), ST3, side=SideEvidence(missing_ranks=(5, 6)))
    assert "telemetry_limited" in rep.labels
    assert any("missing" in r and "5" in r for r in rep.reasons["telemetry_limited"])
    assert "direct_exposure" not in rep.labels
    assert_reasons(rep)


def test_telemetry_limited_from_contract_violations() -> None:
    rep = sf.analyze(spike_window(), ST3, side=SideEvidence(contract_violations=3))
    assert "telemetry_limited" in rep.labels
    assert any("contract" in r for r in rep.reasons["telemetry_limited"])
    assert "direct_exposure" not in rep.labels
    assert_reasons(rep)


def test_telemetry_limited_from_gather_failure_and_notes() -> None:
    rep = sf.analyze(spike_window(), ST3, side=SideEvidence(gather_ok=False, notes=("clock jump",)))
    assert "telemetry_limited" in rep.labels
    assert "clock jump" in rep.reasons["telemetry_limited"]
    assert len(rep.reasons["telemetry_limited"]) == 2


def test_gradient_accumulation_ambiguous() -> None:
    d = spike_window()
    rep = sf.analyze(d, ST3, side=SideEvidence(accumulation_collapsed=True, accumulation_factor=4))
    assert "gradient_accumulation_ambiguous" in rep.labels
    assert "direct_exposure" not in rep.labels
    assert_reasons(rep)
    assert "gradient_accumulation_ambiguous" not in sf.analyze(d, ST3).labels


def test_semantic_shares_fold_microsteps() -> None:
    stages = ["data[0]", "bwd[0]", "data[1]", "bwd[1]"]
    d = random_window(17, (6, 3, 4))
    rep = sf.analyze(d, stages)
    expected = ref.shares(d)
    assert rep.semantic_shares == pytest.approx(
        {"data": expected[0] + expected[2], "bwd": expected[1] + expected[3]}, rel=1e-12
    )


# --- forward CUDA-event side evidence -------------------------------------------------------------


def _event_side(event_ms: float, n: int, r: int, **kwargs: object) -> SideEvidence:
    return SideEvidence(
        event_ms=np.full((n, r), event_ms),
        event_state=np.full((n, r), EVENT_READY, dtype=np.int8),
        **kwargs,  # type: ignore[arg-type]
    )


def _forward_window(fwd_s: float, bwd_s: float, data_s: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(21)
    base = np.array([data_s, fwd_s, bwd_s])
    return np.tile(base, (8, 4, 1)) * rng.uniform(0.99, 1.01, size=(8, 4, 3))


def test_forward_device_supported() -> None:
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    rep = sf.analyze(d, FWD_STAGES, side=_event_side(400.0, 8, 4))
    assert "forward_device_supported" in rep.labels
    assert "forward_host_overhead_suspected" not in rep.labels
    assert "forward_event_scope_limited" not in rep.labels
    assert rep.forward_event is not None
    assert rep.forward_event["ready"] == 32.0
    assert rep.forward_event["ratio"] == pytest.approx(0.4 / d[:, :, 1].mean(), rel=1e-12)
    assert_reasons(rep)


def test_forward_host_overhead_suspected() -> None:
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    rep = sf.analyze(d, FWD_STAGES, side=_event_side(50.0, 8, 4))
    assert "forward_host_overhead_suspected" in rep.labels
    assert "forward_device_supported" not in rep.labels
    assert rep.forward_event is not None and rep.forward_event["ratio"] < 0.25
    assert_reasons(rep)


def test_forward_spillover_suspected() -> None:
    # Forward is short on the host, its device time is long, and backward carries the cost.
    d = _forward_window(fwd_s=0.1, bwd_s=0.8, data_s=0.2)
    rep = sf.analyze(d, FWD_STAGES, side=_event_side(300.0, 8, 4))
    assert rep.top1 == "model.backward_cpu_wall"
    assert "forward_spillover_suspected" in rep.labels
    assert "forward_device_supported" not in rep.labels  # forward is not a top-2 stage
    assert_reasons(rep)


def test_forward_event_scope_limited_by_streams() -> None:
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    rep = sf.analyze(d, FWD_STAGES, side=_event_side(400.0, 8, 4, event_scope_limited=True))
    assert "forward_event_scope_limited" in rep.labels
    assert "forward_device_supported" not in rep.labels
    assert_reasons(rep)


def _forward_bound_with_events(state: np.ndarray) -> WindowReport:
    """The forward-bound window with these event states; every ready pair measured 400 ms."""
    ms = np.where(state == EVENT_READY, 400.0, np.nan)
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    return sf.analyze(d, FWD_STAGES, side=SideEvidence(event_ms=ms, event_state=state))


def test_forward_event_scope_limited_by_ready_ratio() -> None:
    state = np.full((8, 4), EVENT_READY, dtype=np.int8)
    state[:4] = EVENT_MISSING  # 16 of 32 sampled pairs never completed
    rep = _forward_bound_with_events(state)
    assert rep.forward_event is not None
    assert rep.forward_event["ready_ratio"] == 0.5
    assert "forward_event_scope_limited" in rep.labels
    assert "forward_device_supported" not in rep.labels
    assert_reasons(rep)


def test_forward_event_scope_limited_by_few_samples() -> None:
    state = np.full((8, 4), EVENT_NOT_SAMPLED, dtype=np.int8)
    state[0, :3] = EVENT_READY  # three ready pairs, all sampled ones completed
    rep = _forward_bound_with_events(state)
    assert "forward_event_scope_limited" in rep.labels
    assert "forward_device_supported" not in rep.labels


def test_forward_event_scope_limited_when_stage_absent() -> None:
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    rep = sf.analyze(d, ST3, side=_event_side(400.0, 8, 4))
    assert "forward_event_scope_limited" in rep.labels
    assert_reasons(rep)


def test_no_forward_labels_without_samples() -> None:
    d = _forward_window(fwd_s=0.5, bwd_s=0.2)
    state = np.full((8, 4), EVENT_NOT_SAMPLED, dtype=np.int8)
    rep = sf.analyze(
        d, FWD_STAGES, side=SideEvidence(event_ms=np.full((8, 4), np.nan), event_state=state)
    )
    assert rep.forward_event is None
    assert not any(label.startswith("forward_") for label in rep.labels)


# --- zero-exposed windows ------------------------------------------------------------------------


def test_zero_window_has_undefined_shares_without_warnings() -> None:
    d = np.zeros((5, 4, 3))
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        rep = sf.analyze(d, ST3)
        text = rep.to_json()
        summary = window_details(rep)
    assert rep.shares_defined is False
    assert rep.exposed_s == 0.0
    assert rep.advances == dict.fromkeys(ST3, 0.0)
    assert rep.shares == dict.fromkeys(ST3, 0.0)
    assert rep.direct_gain == dict.fromkeys(ST3, 0.0)
    assert rep.routing_set == []
    assert rep.labels == ["frontier_accounting", "telemetry_limited"]
    assert "undefined" in rep.reasons["frontier_accounting"][0]
    assert any("floor" in r for r in rep.reasons["telemetry_limited"])
    assert all(any("shares undefined" in r for r in rep.reasons[s]) for s in STRONG)
    assert WindowReport.from_json(text) == rep
    assert "raw advances" in summary


def test_tiny_window_reports_raw_advances() -> None:
    d = np.zeros((2, 2, 3))
    d[:, 0, 0] = 1e-12
    d[:, 1, 2] = 3e-12
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        rep = sf.analyze(d, ST3, roles=["a", "b"])
    assert rep.shares_defined is False
    assert rep.advances == pytest.approx({"data": 2e-12, "fwd": 0.0, "bwd": 4e-12}, abs=1e-25)
    assert rep.exposed_s == pytest.approx(6e-12, abs=1e-25)
    assert rep.top1 is None  # roles differ: no global ranking
    assert sf.analyze(d, ST3).top1 == "bwd"  # ordered by raw advances when shares are undefined
    assert rep.role_shares == {"a": dict.fromkeys(ST3, 0.0), "b": dict.fromkeys(ST3, 0.0)}


# --- WindowReport round trip ---------------------------------------------------------------------


def _round_trip_reports() -> list[WindowReport]:
    ev_state = np.full((8, 4), EVENT_READY, dtype=np.int8)
    ev_state[0, 0] = EVENT_MISSING
    ev_ms = np.where(ev_state == EVENT_READY, 123.456789, np.nan)
    return [
        sf.analyze(FIG1, ST3),
        sf.analyze(FIG2, ST3, roles=["pp0", "pp1", "pp1"]),
        sf.analyze(random_window(2, (5, 1, 3)), ST3),
        sf.analyze(random_window(3, (6, 3, 1)), ["only"]),
        sf.analyze(
            _forward_window(fwd_s=0.5, bwd_s=0.2),
            FWD_STAGES,
            side=SideEvidence(
                event_ms=ev_ms,
                event_state=ev_state,
                missing_ranks=(7,),
                contract_violations=1,
                notes=("note ü",),
                overlap_error_s=0.25,
            ),
        ),
        sf.analyze(
            sync_wait_window(),
            ST3,
            gates=Gates(
                model_fit_stages=frozenset({"data", "bwd"}),
                gain_baseline="cohort_median",
                leader_tie=0.01,
                candidate_threshold=0.9,
            ),
        ),
        sf.analyze(
            random_window(4, (7, 4, 6)),
            list(sf.DEFAULT_STAGES),
            gates=Gates(gain_baseline="reference"),
            side=SideEvidence(
                no_stall_reference_s=np.full((4, 6), 0.03), accumulation_collapsed=True
            ),
        ),
        sf.analyze(np.zeros((3, 2, 3)), ST3),
    ]


@pytest.mark.parametrize("index", range(8))
def test_report_round_trip(index: int) -> None:
    rep = _round_trip_reports()[index]
    data = rep.to_dict()
    back = WindowReport.from_dict(data)
    assert back == rep
    assert back.to_dict() == data
    text = rep.to_json()
    assert json.loads(text) == data
    again = WindowReport.from_json(text)
    assert again == rep
    assert again.to_json() == text
    assert all(isinstance(v, sf.StageLocalization) for v in again.localization.values())
    assert again.gates == rep.gates


def test_round_trip_keeps_custom_gates_and_roles() -> None:
    gates = Gates(model_fit_stages=frozenset({"fwd"}), gain_tie=0.07, min_event_samples=9)
    rep = sf.analyze(FIG2, ST3, gates=gates, roles=["x", "y", "x"])
    back = WindowReport.from_json(rep.to_json())
    assert back.gates == gates
    assert back.gates.model_fit_stages == frozenset({"fwd"})
    assert back.roles == ["x", "y", "x"]
    assert back.role_shares == rep.role_shares
    assert back.role_shares is not None and set(back.role_shares) == {"x", "y"}


def test_report_with_zero_forward_cpu_time_serializes() -> None:
    # Ready forward events but zero CPU-wall forward time: the report must still be valid JSON.
    d = np.zeros((6, 2, 3))
    d[:, :, 0] = 1.0
    rep = sf.analyze(d, FWD_STAGES, side=_event_side(5.0, 6, 2))
    assert WindowReport.from_json(rep.to_json()) == rep
