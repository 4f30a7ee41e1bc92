"""The store's binary window format: round trip, and one clear error per malformed payload."""

from __future__ import annotations

import json
import struct
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from stagefrontier import DEFAULT_STAGES, RESIDUAL_STAGE, ReportFormatError
from stagefrontier.collect.wire import HEADER_SIZE, decode_window, encode_window
from stagefrontier.window.merged import merge_windows
from stagefrontier.window.rank import RankWindow, per_rank_fields, wire_fields

STAGES = (*DEFAULT_STAGES, RESIDUAL_STAGE)


def make_window(**overrides: Any) -> RankWindow:
    n = 3
    durations = np.arange(n * len(STAGES), dtype=np.int64).reshape(n, len(STAGES)) * 1000
    values: dict[str, Any] = dict(
        window=3,
        first_step=60,
        last_step=63,
        paused_ranges=((61, 61),),
        rank=2,
        stages=STAGES,
        durations_ns=durations,
        wall_ns=durations.sum(axis=1),
        event_ms=np.array([1.5, np.nan, 2.0]),
        event_state=np.array([2, 0, 2], dtype=np.int8),
        forward_stage=DEFAULT_STAGES[1],
        accumulation_factor=1,
        contract_violations=2,
        violation_reasons=("stage entered twice",),
        probes={"collate": {"count": 4.0, "total_ms": 1.25}},
        dropped_windows=1,
        hostname="node-b",
        local_rank=2,
        pid=4242,
        role="pp1",
        role_set=("pp0", "pp1"),
        contexts_entered=18,
        context_cost_ns=350,
        handoff_ns=41_000,
        thread_cpu_ns=1_200_000,
    )
    values.update(overrides)
    return RankWindow(**values)


def with_meta(payload: bytes, **changes: Any) -> bytes:
    """The payload with its JSON block edited (header length fixed up)."""
    meta_len = struct.unpack_from("<I", payload, HEADER_SIZE - 5)[0]
    meta = json.loads(payload[HEADER_SIZE : HEADER_SIZE + meta_len])
    meta.update(changes)
    block = json.dumps(meta).encode()
    header = bytearray(payload[:HEADER_SIZE])
    struct.pack_into("<I", header, HEADER_SIZE - 5, len(block))
    return bytes(header) + block + payload[HEADER_SIZE + meta_len :]


def test_every_declared_field_round_trips() -> None:
    window = make_window()
    back = decode_window(encode_window(window))
    for f in fields(RankWindow):
        ours, theirs = getattr(window, f.name), getattr(back, f.name)
        if isinstance(ours, np.ndarray):
            np.testing.assert_array_equal(ours, theirs)
        else:
            assert ours == theirs, f.name
    # Every scalar field travels in the JSON block: a new field needs no codec edit.
    sent = {f.name for f in wire_fields()}
    assert {"hostname", "pid", "role", "role_set", "accumulation_factor", "first_step"} <= sent


def test_the_jsonl_record_keeps_the_declared_per_rank_fields() -> None:
    merged = merge_windows([make_window(rank=0, hostname="a"), make_window(rank=1)], 2)
    assert per_rank_fields(merged.ranks) == {
        "hosts": {"0": "a", "1": "node-b"},
        "local_ranks": {"0": 2, "1": 2},
        "pids": {"0": 4242, "1": 4242},
        "paused_ranges": {"0": ((61, 61),), "1": ((61, 61),)},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"first_step": 1e400}, "first_step must be an integer"),
        ({"local_rank": 1.0}, "local_rank must be an integer"),
        ({"pid": True}, "pid must be an integer"),
        ({"role": 7}, "role must be a string"),
        ({"accumulation_factor": 0}, "accumulation_factor must be an integer in [1"),
        ({"accumulation_mixed": "yes"}, "accumulation_mixed must be true or false"),
        ({"stages": "data"}, "stages must be a list"),
        ({"probes": {"p": {"count": "x"}}}, "must be a finite number"),
        ({"last_step": 70}, "covers steps 60-70 but holds 3 rows and 1 paused step"),
        ({"paused_ranges": []}, "covers steps 60-63 but holds 3 rows"),
        ({"paused_ranges": [[62, 61]]}, "holds the empty range [62, 61]"),
        ({"paused_ranges": [[70, 70]]}, "paused ranges fall outside"),
        ({"paused_ranges": [61, 61]}, "must hold [first, last] pairs"),
        ({"thread_cpu_ns": -1}, "thread_cpu_ns must be an integer"),
        ({"first_step": None}, "first_step must be an integer"),
    ],
)
def test_malformed_metadata_is_a_format_error(change: dict[str, Any], message: str) -> None:
    payload = with_meta(encode_window(make_window()), **change)
    with pytest.raises(ReportFormatError, match=message.replace("[", r"\[")):
        decode_window(payload)


def test_deeply_nested_metadata_is_a_format_error() -> None:
    payload = encode_window(make_window())
    meta_len = struct.unpack_from("<I", payload, HEADER_SIZE - 5)[0]
    block = b"[" * 100_000 + b"]" * 100_000
    header = bytearray(payload[:HEADER_SIZE])
    struct.pack_into("<I", header, HEADER_SIZE - 5, len(block))
    with pytest.raises(ReportFormatError, match="not JSON"):
        decode_window(bytes(header) + block + payload[HEADER_SIZE + meta_len :])


@pytest.mark.parametrize("value", [-5, np.iinfo(np.int64).max])
def test_out_of_range_durations_are_a_format_error(value: int) -> None:
    window = make_window()
    durations = window.durations_ns.copy()
    durations[1, 2] = value
    payload = encode_window(make_window(durations_ns=durations))
    with pytest.raises(ReportFormatError, match="outside"):
        decode_window(payload)


def test_unknown_flag_bits_are_a_format_error() -> None:
    payload = bytearray(encode_window(make_window()))
    payload[HEADER_SIZE - 1] |= 0x80
    with pytest.raises(ReportFormatError, match="unknown flag bits"):
        decode_window(bytes(payload))
