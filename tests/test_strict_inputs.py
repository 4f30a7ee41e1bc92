"""Inputs that used to pass silently and give garbage: each is now refused with a specific error
naming the problem (or, for a generator of stage names, read correctly)."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier.analysis.side import _KEY_KINDS
from stagefrontier.analysis.window_report import REPORT_VERSION
from stagefrontier.formats.packet import Packet, packet_dict, packet_from_bytes, packet_from_dict
from stagefrontier.render.text import window_details, window_report_text

ST3 = ["data", "fwd", "bwd"]


def window(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(0.001, 0.01, size=(6, 3, 3))


# --- durations and stage names --------------------------------------------------------------------


def test_durations_whose_sum_overflows_are_refused() -> None:
    # Every value is finite, but three stages of 1e308 s add up to infinity: the exposed time
    # would be inf and the shares NaN.
    with pytest.raises(sf.DurationsError, match="sum overflows float64"):
        sf.analyze(np.full((4, 2, 3), 1e308), ST3)
    # Large values whose sums still fit are analyzed, and the report serializes.
    report = sf.analyze(np.full((4, 2, 3), 1e300), ST3)
    assert np.isfinite(report.exposed_s) and report.shares_defined
    assert sf.WindowReport.from_json(report.to_json()) == report


@pytest.mark.parametrize("names", [set(ST3), frozenset(ST3)])
def test_a_set_of_stage_names_is_refused(names: Any) -> None:
    # A set iterates in hash order, which differs between interpreter runs: the schema (and the
    # top stage) would change from run to run for the same data.
    with pytest.raises(sf.StageNamesError, match="not a set"):
        sf.analyze(window(), names)


def test_a_generator_of_stage_names_is_read_once() -> None:
    d = window()
    assert sf.analyze(d, (name for name in ST3)) == sf.analyze(d, ST3)


def test_complex_durations_are_refused_without_a_warning() -> None:
    d = window() + 1e-3j
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's ComplexWarning would fail the test
        with pytest.raises(sf.DurationsError, match="imaginary part"):
            sf.analyze(d, ST3)


def test_a_window_with_nothing_exposed_names_no_top_stage() -> None:
    report = sf.analyze(np.zeros((4, 2, 3)), ST3)
    assert (report.top1, report.top2, report.routing_set) == (None, None, [])
    assert "no exposed time" in window_details(report)
    assert "top-1: -    top-2 (second stage): -" in window_report_text(report)
    assert sf.WindowReport.from_json(report.to_json()) == report


def test_a_stage_with_no_exposed_time_is_never_second() -> None:
    d = np.zeros((4, 2, 3))
    d[:, :, 1] = 0.01  # only fwd takes time
    report = sf.analyze(d, ST3)
    assert (report.top1, report.top2) == ("fwd", None)


# --- versions -------------------------------------------------------------------------------------


def a_packet() -> dict[str, Any]:
    d = window()
    return packet_dict(Packet.of_window(d, sf.analyze(d, ST3)))


@pytest.mark.parametrize("version", [True, 1.0])
def test_packet_version_must_be_the_integer(version: Any) -> None:
    obj = a_packet()
    assert obj["version"] == version  # equal in Python, yet not a version 1 packet
    obj["version"] = version
    with pytest.raises(sf.ReportFormatError, match="unknown packet version"):
        packet_from_bytes(json.dumps(obj).encode())


@pytest.mark.parametrize(
    ("field", "value"), [("version", float(REPORT_VERSION)), ("schema_version", True)]
)
def test_report_versions_must_be_integers(field: str, value: Any) -> None:
    data = sf.analyze(window(), ST3).to_dict()
    assert data[field] == value
    data[field] = value
    with pytest.raises(sf.ReportFormatError, match=field):
        sf.WindowReport.from_dict(data)


# --- side evidence and gates ----------------------------------------------------------------------


def test_every_side_evidence_key_has_a_checked_type() -> None:
    assert set(_KEY_KINDS) == set(sf.SideEvidence().to_dict())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gather_okay": False}, "unknown side-evidence key"),
        ({"gather_ok": "false"}, "gather_ok must be true or false"),
        ({"missing_ranks": [1.5]}, "missing_ranks must be a list of ranks"),
        ({"accumulation_factor": True}, "accumulation_factor must be null or an integer"),
        ({"overlap_error_s": "0"}, "overlap_error_s must be a number"),
        ([], "must be an object"),
    ],
)
def test_side_evidence_from_dict_is_strict(data: Any, message: str) -> None:
    with pytest.raises(sf.SideEvidenceError, match=message):
        sf.SideEvidence.from_dict(data)


def test_a_packet_with_an_unknown_side_key_is_refused() -> None:
    d = window()
    side = sf.SideEvidence(notes=("late rank",))
    obj = packet_dict(Packet.of_window(d, sf.analyze(d, ST3, side=side), side=side))
    assert packet_from_dict(json.loads(json.dumps(obj))).side == side
    obj["side"]["gather_okay"] = False  # a typo: would have been dropped without a word
    with pytest.raises(sf.ReportFormatError, match="unknown side-evidence key"):
        packet_from_dict(obj)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"leader_tie": "x"}, "leader_tie must be a number, got str"),
        ({"leader_tie": True}, "leader_tie must be a number, got bool"),
        ({"min_event_samples": 2.5}, "min_event_samples must be an integer"),
        ({"max_missing_ranks": None}, "max_missing_ranks must be an integer"),
        ({"model_fit_stages": "data"}, "collection of stage names"),
        ({"model_fit_stages": [1]}, "non-names"),
        ({"gain_baseline": 3}, "unknown gain_baseline"),
    ],
)
def test_gates_are_type_checked(values: dict[str, Any], message: str) -> None:
    with pytest.raises(sf.GatesError, match=message):
        sf.Gates(**values)
    with pytest.raises(sf.GatesError, match=message):
        sf.Gates.from_dict(values)


def test_gates_from_dict_refuses_a_non_object_and_round_trips() -> None:
    with pytest.raises(sf.GatesError, match="must be an object"):
        sf.Gates.from_dict([("leader_tie", 0.1)])  # type: ignore[arg-type]
    gates = sf.Gates(leader_tie=0.03, min_event_samples=3, model_fit_stages=frozenset({"data"}))
    assert sf.Gates.from_dict(json.loads(json.dumps(gates.to_dict()))) == gates
