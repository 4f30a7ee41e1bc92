"""Evidence packets: exact round trip, re-analysis identity, size bound and corrupt-input errors."""

from __future__ import annotations

import base64
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import stagefrontier as sf
from stagefrontier.analysis.side import EVENT_MISSING, EVENT_READY
from stagefrontier.formats.packet import (
    PACKET_FORMAT,
    PACKET_VERSION,
    Packet,
    decode_array,
    encode_array,
    packet_bytes,
    packet_from_bytes,
    read_packet,
    write_packet,
)

STAGES = sf.DEFAULT_STAGES
BASE = np.array([0.004, 0.030, 0.055, 0.002, 0.012, 0.0005])


def timing_window(n: int, r: int, seed: int = 0) -> np.ndarray:
    """Realistic CPU-wall durations: whole nanoseconds, a few percent jitter, one slow rank."""
    rng = np.random.default_rng(seed)
    d = BASE * (1 + 0.05 * rng.standard_normal((n, r, len(STAGES))))
    d[:, r // 2, 0] += rng.gamma(4.0, 0.03, size=n)
    return np.round(np.abs(d), 9)


def side_evidence(n: int, r: int) -> sf.SideEvidence:
    state = np.zeros((n, r), dtype=np.int8)
    state[::3] = EVENT_READY
    state[1::7] = EVENT_MISSING
    ms = np.full((n, r), np.nan)
    ms[state == EVENT_READY] = 21.5
    return sf.SideEvidence(
        event_ms=ms,
        event_state=state,
        missing_ranks=(r - 1,),
        gather_ok=False,
        notes=("late rank",),
    )


def packet_obj(tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    d = timing_window(8, 4)
    path = write_packet(tmp_path / "p.json", Packet.of_window(d, sf.analyze(d, STAGES), **kwargs))
    obj: dict[str, Any] = json.loads(path.read_text())
    return obj


def test_round_trip_is_exact_and_reanalysis_is_identical(tmp_path: Path) -> None:
    n, r = 20, 6
    d = timing_window(n, r)
    roles = ["dp"] * r
    side = side_evidence(n, r)
    gates = sf.Gates(gain_baseline="cohort_median", model_fit_stages=frozenset({"data.next_wait"}))
    report = sf.analyze(d, STAGES, gates=gates, roles=roles, side=side)
    meta = {
        "window": 7,
        "first_step": 140,
        "last_step": 159,
        "hosts": ["a", "b"],
        "gather_ok": False,
    }

    path = write_packet(
        tmp_path / "w7.json", Packet.of_window(d, report, roles=roles, side=side, meta=meta)
    )
    packet = read_packet(path)

    assert packet.d.dtype == np.float64
    assert packet.d.tobytes() == d.tobytes()
    assert packet.stages == STAGES
    assert packet.roles == tuple(roles)
    assert packet.gates == gates
    assert packet.meta == meta
    assert packet.report == report
    assert packet.reanalyze() == report
    assert packet.side is not None
    np.testing.assert_array_equal(packet.side.event_ms, side.event_ms)  # NaN in the same places
    np.testing.assert_array_equal(packet.side.event_state, side.event_state)
    assert packet.side.missing_ranks == side.missing_ranks
    assert packet.side.notes == side.notes
    assert not packet.side.gather_ok


def test_packet_is_versioned_json_with_every_field(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    assert obj["format"] == PACKET_FORMAT
    assert obj["version"] == PACKET_VERSION
    assert set(obj) == {
        "format",
        "version",
        "d",
        "stages",
        "roles",
        "side",
        "gates",
        "meta",
        "report",
    }
    assert obj["d"]["dtype"] == "<f8"
    assert obj["d"]["shape"] == [8, 4, 6]
    assert obj["roles"] is None and obj["side"] is None and obj["meta"] == {}


def test_bytes_and_file_agree_and_no_temp_file_is_left(tmp_path: Path) -> None:
    d = timing_window(5, 3)
    report = sf.analyze(d, STAGES)
    target = tmp_path / "p.json"
    target.write_text("old content")
    packet = Packet.of_window(d, report, meta={"window": 1})
    write_packet(target, packet)
    assert target.read_bytes() == packet_bytes(packet)
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
    assert packet_from_bytes(target.read_bytes()).report == report


def test_32_ranks_20_steps_6_stages_fits_in_0_05_mb(tmp_path: Path) -> None:
    d = timing_window(20, 32, seed=3)
    report = sf.analyze(d, STAGES)
    hosts = [f"node{i // 8:02d}" for i in range(32)]
    meta = {"window": 12, "first_step": 240, "last_step": 259, "world_size": 32, "hosts": hosts}
    path = write_packet(tmp_path / "p.json", Packet.of_window(d, report, meta=meta))
    assert path.stat().st_size <= 50_000
    assert read_packet(path).reanalyze() == report


def test_packet_is_smaller_than_the_raw_matrix_in_json(tmp_path: Path) -> None:
    d = timing_window(20, 32, seed=4)
    compact = packet_bytes(Packet.of_window(d, sf.analyze(d, STAGES)))
    assert len(compact) < len(json.dumps(d.tolist()))


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=3, max_dims=3, min_side=1, max_side=6),
        elements=st.floats(0.0, 1e6, allow_subnormal=True),
    )
)
def test_array_codec_is_exact(values: np.ndarray) -> None:
    decoded = decode_array(json.loads(json.dumps(encode_array(values, "<f8"))), "d", ndim=3)
    assert decoded.shape == values.shape
    assert decoded.tobytes() == values.tobytes()


def test_a_packet_refuses_a_report_of_another_window(tmp_path: Path) -> None:
    d = timing_window(5, 3)
    other = sf.analyze(timing_window(6, 3), STAGES)
    with pytest.raises(sf.ReportFormatError, match="report describes 6 steps"):
        Packet.of_window(d, other)
    assert list(tmp_path.iterdir()) == []


def test_packets_get_the_mode_of_any_new_file(tmp_path: Path) -> None:
    d = timing_window(5, 3)
    old = os.umask(0o022)
    try:
        path = write_packet(tmp_path / "p.json", Packet.of_window(d, sf.analyze(d, STAGES)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # not a temporary file's private 0o600


def test_write_rejects_meta_that_is_not_json(tmp_path: Path) -> None:
    d = timing_window(5, 3)
    with pytest.raises(sf.ReportFormatError, match="not JSON-serializable"):
        write_packet(
            tmp_path / "p.json", Packet.of_window(d, sf.analyze(d, STAGES), meta={"x": {1, 2}})
        )
    assert list(tmp_path.iterdir()) == []


# --- corrupt packets ----------------------------------------------------------------------------


def load(obj: Any) -> None:
    packet_from_bytes(json.dumps(obj).encode())


def test_not_json() -> None:
    with pytest.raises(sf.ReportFormatError, match="not JSON"):
        packet_from_bytes(b"PK\x03\x04 definitely not json")
    with pytest.raises(sf.ReportFormatError, match="not JSON"):
        packet_from_bytes(b"\xff\xfe{}")


def test_non_finite_json_constant(tmp_path: Path) -> None:
    text = json.dumps(packet_obj(tmp_path)).replace('"meta": {}', '"meta": {"x": NaN}')
    with pytest.raises(sf.ReportFormatError, match="NaN"):
        packet_from_bytes(text.encode())


def test_not_an_object() -> None:
    with pytest.raises(sf.ReportFormatError, match="must be a JSON object"):
        load([1, 2, 3])


def test_wrong_format(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["format"] = "stagefrontier.window_report"
    with pytest.raises(sf.ReportFormatError, match="not a stagefrontier packet"):
        load(obj)


def test_unknown_version(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["version"] = 2
    with pytest.raises(sf.ReportFormatError, match="unknown packet version 2"):
        load(obj)


@pytest.mark.parametrize("field", ["d", "stages", "roles", "side", "gates", "meta", "report"])
def test_missing_field(tmp_path: Path, field: str) -> None:
    obj = packet_obj(tmp_path)
    del obj[field]
    with pytest.raises(sf.ReportFormatError, match=rf"missing field\(s\) \['{field}'\]"):
        load(obj)


def test_shape_byte_mismatch(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["d"]["shape"] = [8, 4, 7]
    with pytest.raises(
        sf.ReportFormatError, match="shape/byte mismatch: declared 1792 bytes, decoded 1536"
    ):
        load(obj)
    obj["d"]["shape"] = [8, 4, 5]
    with pytest.raises(
        sf.ReportFormatError, match="shape/byte mismatch: declared 1280 bytes, decoded more"
    ):
        load(obj)


def test_declared_size_is_checked_before_decompressing(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["d"]["shape"] = [10**4, 500, 6]  # 240 MB claimed from a few kB of data
    with pytest.raises(sf.ReportFormatError, match="compressed bytes can hold"):
        load(obj)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("shape", [8, -4, 6], "non-negative ints"),
        ("shape", [32, 6], "expected 3 axes"),
        ("dtype", "object", "unsupported dtype 'object'"),
        ("codec", "pickle", "unknown codec 'pickle'"),
        ("data", "not*base64!", "not valid base64"),
    ],
)
def test_a_bad_field_of_the_matrix_is_refused(
    tmp_path: Path, field: str, value: object, needle: str
) -> None:
    obj = packet_obj(tmp_path)
    obj["d"][field] = value
    with pytest.raises(sf.ReportFormatError, match=needle):
        load(obj)


def test_bad_zlib(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["d"]["data"] = base64.b64encode(b"\x00" * 64).decode()
    with pytest.raises(sf.ReportFormatError, match="not valid zlib"):
        load(obj)


def test_truncated_and_trailing_zlib(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    stream = base64.b64decode(obj["d"]["data"])
    obj["d"]["data"] = base64.b64encode(stream[: len(stream) // 2]).decode()
    with pytest.raises(sf.ReportFormatError, match="shape/byte mismatch"):
        load(obj)
    obj["d"]["data"] = base64.b64encode(stream + zlib.compress(b"more")).decode()
    with pytest.raises(sf.ReportFormatError, match="trailing data"):
        load(obj)


def test_invalid_durations_in_the_matrix(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    bad = np.full((8, 4, 6), 0.01)
    bad[2, 1, 3] = -1.0
    obj["d"] = encode_array(bad, "<f8")
    with pytest.raises(sf.ReportFormatError, match="packet field 'd' is invalid: 1 negative"):
        load(obj)


def test_stages_roles_gates_side_report_are_validated(tmp_path: Path) -> None:
    cases: list[tuple[str, Any, str]] = [
        ("stages", list(STAGES[:5]), "5 stage names given but the matrix has 6"),
        ("stages", "data", "'stages' must be a list"),
        ("roles", ["a", "b"], "2 roles for 4 ranks"),
        ("gates", {"no_such_gate": 1}, "unknown gate"),
        ("side", {"event_ms": [1.0]}, "packet field 'side.event_ms' must be an encoded array"),
        ("meta", [1], "'meta' must be a JSON object"),
        ("report", {"format": "x"}, "not a stagefrontier window report"),
    ]
    for field, value, message in cases:
        obj = packet_obj(tmp_path)
        obj[field] = value
        with pytest.raises(sf.ReportFormatError, match=message):
            load(obj)


def test_report_must_describe_the_matrix_and_gates(tmp_path: Path) -> None:
    obj = packet_obj(tmp_path)
    obj["report"]["n_steps"] = 9
    with pytest.raises(sf.ReportFormatError, match="packet report describes 9 steps"):
        load(obj)
    obj = packet_obj(tmp_path)
    obj["gates"]["share_dominance"] = 0.5
    with pytest.raises(sf.ReportFormatError, match="other gates"):
        load(obj)
