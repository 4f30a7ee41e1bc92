"""Bad input raises a specific StageFrontierError subclass whose message names the problem."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import stagefrontier as sf
from stagefrontier import (
    DurationsError,
    EmptyWindowError,
    Gates,
    ReportFormatError,
    RolesError,
    SideEvidence,
    SideEvidenceError,
    StageFrontierError,
    StageNamesError,
    WindowReport,
)

ST3 = ["data", "fwd", "bwd"]


def good() -> np.ndarray:
    return np.arange(24, dtype=np.float64).reshape(2, 4, 3) / 10.0


def with_value(value: float, where: tuple[int, int, int] = (1, 2, 1)) -> np.ndarray:
    d = good()
    d[where] = value
    return d


def test_hierarchy() -> None:
    for cls in (
        DurationsError,
        EmptyWindowError,
        StageNamesError,
        RolesError,
        SideEvidenceError,
        ReportFormatError,
    ):
        assert issubclass(cls, StageFrontierError)
        assert issubclass(cls, ValueError)
    assert issubclass(EmptyWindowError, DurationsError)


def test_every_exception_class_is_defined_in_errors_and_exported() -> None:
    """All of them live in stagefrontier.errors, derive from the root, are importable from
    ``stagefrontier``, and stay importable from the modules that raise them."""
    import importlib
    import inspect
    import pkgutil

    import stagefrontier.errors as errors

    defined = {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls) and issubclass(cls, BaseException)
    }
    assert len(defined) >= 17
    for name, cls in defined.items():
        assert cls.__module__ == "stagefrontier.errors"
        assert issubclass(cls, StageFrontierError)
        assert getattr(sf, name) is cls and name in sf.__all__
    for info in pkgutil.walk_packages(sf.__path__, "stagefrontier."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an integration whose optional framework is not installed
            continue
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException):
                home = value.__module__
                assert home == "stagefrontier.errors" or not home.startswith("stagefrontier"), (
                    f"{value.__qualname__} is defined in {home}"
                )
    old_homes = {
        "stagefrontier.record.recorder": "ContractViolation",
        "stagefrontier.analysis.compare": "CompareError",
        "stagefrontier.collect.gloo": "GlooProtocolError",
        "stagefrontier.demo": "DemoError",
        "stagefrontier.demo.launch": "DeadlineExceeded",
        "stagefrontier.demo.faults": "FaultSpecError",
        "stagefrontier.reducers": "TraceFormatError",
        "stagefrontier.reducers.errors": "MissingDependencyError",
        "stagefrontier.integrations": "MissingExtraError",
    }
    for module_name, name in old_homes.items():
        assert getattr(importlib.import_module(module_name), name) is defined[name]


@pytest.mark.parametrize(
    ("value", "word"),
    [(np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite"), (-0.5, "negative")],
)
def test_bad_values(value: float, word: str) -> None:
    with pytest.raises(DurationsError, match=word) as info:
        sf.analyze(with_value(value), ST3)
    # The message locates the first bad entry and names its stage.
    assert "step 1, rank 2, stage 1" in str(info.value)
    assert "'fwd'" in str(info.value)


def test_bad_value_counts() -> None:
    d = good()
    d[0, 0, 0] = np.nan
    d[1, 3, 2] = np.nan
    with pytest.raises(DurationsError, match="2 NaN"):
        sf.analyze(d, ST3)


def test_nan_reported_before_negative() -> None:
    d = with_value(-1.0, (0, 0, 0))
    d[1, 1, 1] = np.nan
    with pytest.raises(DurationsError, match="NaN"):
        sf.analyze(d, ST3)


@pytest.mark.parametrize("shape", [(3,), (4, 3), (1, 2, 3, 1)])
def test_wrong_ndim(shape: tuple[int, ...]) -> None:
    with pytest.raises(DurationsError, match="3 axes") as info:
        sf.analyze(np.ones(shape), ST3)
    assert str(shape) in str(info.value)


def test_not_numeric() -> None:
    with pytest.raises(DurationsError, match="numeric"):
        sf.analyze([[["a", "b", "c"]]], ST3)


@pytest.mark.parametrize("names", [["data", "fwd"], ["data", "fwd", "bwd", "opt"]])
def test_stage_count_mismatch(names: list[str]) -> None:
    with pytest.raises(StageNamesError, match=f"{len(names)} stage names given") as info:
        sf.analyze(good(), names)
    assert "3 stages" in str(info.value)


def test_duplicate_stage_names() -> None:
    with pytest.raises(StageNamesError, match="duplicate stage name 'fwd'"):
        sf.analyze(good(), ["fwd", "data", "fwd"])


@pytest.mark.parametrize("names", [["data", "", "bwd"], ["data", 3, "bwd"]])
def test_bad_stage_name(names: list[object]) -> None:
    with pytest.raises(StageNamesError, match="position 1"):
        sf.analyze(good(), names)  # type: ignore[arg-type]


def test_stages_as_single_string() -> None:
    with pytest.raises(StageNamesError, match="not a single string"):
        sf.analyze(good(), "abc")


@pytest.mark.parametrize("shape", [(0, 4, 3), (2, 0, 3)])
def test_empty_steps_or_ranks(shape: tuple[int, int, int]) -> None:
    with pytest.raises(EmptyWindowError, match="empty window") as info:
        sf.analyze(np.zeros(shape), ST3)
    assert str(shape) in str(info.value)


def test_empty_stage_axis() -> None:
    with pytest.raises(EmptyWindowError, match="empty window"):
        sf.analyze(np.zeros((2, 4, 0)), ["data"])
    # With a matching (empty) stage list the error still names the emptiness.
    with pytest.raises(StageFrontierError, match="empty"):
        sf.analyze(np.zeros((2, 4, 0)), [])


@pytest.mark.parametrize("roles", [["a", "b", "c"], ["a"] * 5, []])
def test_roles_length(roles: list[str]) -> None:
    with pytest.raises(RolesError, match=f"{len(roles)} roles given for 4 ranks"):
        sf.analyze(good(), ST3, roles=roles)


def test_roles_as_single_string() -> None:
    with pytest.raises(RolesError, match="not a single string"):
        sf.analyze(good(), ST3, roles="abcd")


def test_side_evidence_shapes() -> None:
    with pytest.raises(SideEvidenceError, match="event_ms must have shape"):
        sf.analyze(
            good(),
            ST3,
            side=SideEvidence(event_ms=np.ones((2, 3)), event_state=np.ones((2, 3), np.int8)),
        )
    with pytest.raises(SideEvidenceError, match="together"):
        sf.analyze(good(), ST3, side=SideEvidence(event_ms=np.ones((2, 4))))
    with pytest.raises(SideEvidenceError, match="event_state values"):
        sf.analyze(
            good(),
            ST3,
            side=SideEvidence(event_ms=np.ones((2, 4)), event_state=np.full((2, 4), 7, np.int8)),
        )
    with pytest.raises(SideEvidenceError, match="overlap_error_s"):
        sf.analyze(good(), ST3, side=SideEvidence(overlap_error_s=-1.0))
    with pytest.raises(SideEvidenceError, match="no_stall_reference_s must have shape"):
        sf.analyze(good(), ST3, side=SideEvidence(no_stall_reference_s=np.ones(4)))


def test_reference_gain_needs_a_reference() -> None:
    with pytest.raises(SideEvidenceError, match="no_stall_reference_s"):
        sf.analyze(good(), ST3, gates=Gates(gain_baseline="reference"))


def test_bad_gates() -> None:
    with pytest.raises(StageFrontierError, match="share_dominance"):
        Gates(share_dominance=-0.1)
    with pytest.raises(StageFrontierError, match="candidate_threshold"):
        Gates(candidate_threshold=1.5)
    with pytest.raises(StageFrontierError, match="gain_baseline"):
        Gates(gain_baseline="mode")  # type: ignore[arg-type]


def test_accounting_functions_validate() -> None:
    for fn in (sf.prefixes, sf.frontier, sf.advances, sf.slack):
        with pytest.raises(DurationsError, match="NaN"):
            fn(with_value(np.nan))
        with pytest.raises(EmptyWindowError):
            fn(np.zeros((0, 2, 2)))


# --- corrupt or unknown report input --------------------------------------------------------------


def report_dict() -> dict[str, Any]:
    return sf.analyze(good(), ST3).to_dict()


CORRUPTIONS = {
    "unknown_version": (lambda d: d.update(version=1), "version"),
    "no_version": (lambda d: d.pop("version"), "version"),
    "wrong_format": (lambda d: d.update(format="something.else"), "format"),
    "missing_field": (lambda d: d.pop("shares"), "missing"),
    "localization_list": (lambda d: d.update(localization=[1, 2]), "malformed"),
    "localization_fields": (lambda d: d.update(localization={"data": {"bogus": 1}}), "malformed"),
    "unknown_gate": (lambda d: d.update(gates={"not_a_gate": 1}), "gate"),
    "negative_gate": (lambda d: d.update(gates={"share_dominance": -1.0}), "share_dominance"),
    "gates_not_object": (lambda d: d.update(gates=[]), "gates"),
    "shares_not_object": (lambda d: d.update(shares="garbage"), "shares"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_report_dict(case: str) -> None:
    mutate, word = CORRUPTIONS[case]
    data = report_dict()
    mutate(data)
    with pytest.raises(ReportFormatError, match=word):
        WindowReport.from_dict(data)


def test_report_not_an_object() -> None:
    with pytest.raises(ReportFormatError, match="JSON object"):
        WindowReport.from_dict([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ReportFormatError, match="JSON object"):
        WindowReport.from_json("[1, 2, 3]")


@pytest.mark.parametrize("cut", [0, 1, 50, -1])
def test_truncated_or_invalid_json(cut: int) -> None:
    text = sf.analyze(good(), ST3).to_json()
    with pytest.raises(ReportFormatError, match="not valid JSON"):
        WindowReport.from_json(text[:cut] if cut else "{not json")


def test_unknown_version_in_json() -> None:
    data = report_dict()
    data["version"] = 99
    with pytest.raises(ReportFormatError, match="99"):
        WindowReport.from_json(json.dumps(data))
