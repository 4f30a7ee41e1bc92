"""The binary form of a RankWindow on the store: a validated header plus raw little-endian arrays.

Layout: a fixed header (magic, format version, window, rank, N, K, schema hash, metadata length,
flags), a UTF-8 JSON metadata block (stage names and rank identity), then ``[N, K]`` int64
durations, ``[N]`` int64 step walls and, when events were sampled, ``[N]`` float64 milliseconds and
``[N]`` int8 states. Nothing is ever unpickled; sizes are checked before any array is built.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import MISSING
from typing import Any

import numpy as np

from ..errors import ReportFormatError
from ..window.rank import RankWindow, wire_fields
from .wire_checks import check_meta_value

MAGIC = b"SFW1"
WIRE_VERSION = 1
_HEADER = struct.Struct("<4sHIIII16sIB")
HEADER_SIZE = _HEADER.size
_HAS_EVENTS = 1
MAX_META_BYTES = 1 << 20
MAX_DURATION_NS = 1 << 50
"""About 13 days: a longer stage is corrupt, and sums of such values stay exact in float64."""


def encode_window(w: RankWindow) -> bytes:
    meta = {f.name: _jsonable(getattr(w, f.name)) for f in wire_fields()}
    meta_bytes = json.dumps(meta, allow_nan=False).encode("utf-8")
    n, k = w.durations_ns.shape
    has_events = w.event_ms is not None and w.event_state is not None
    header = _HEADER.pack(
        MAGIC,
        WIRE_VERSION,
        w.window,
        w.rank,
        n,
        k,
        w.schema_hash.encode("ascii"),
        len(meta_bytes),
        _HAS_EVENTS if has_events else 0,
    )
    arrays = (
        np.ascontiguousarray(getattr(w, name), dtype=dtype).tobytes()
        for name, dtype, _ in _arrays(n, k, has_events)
    )
    return b"".join((header, meta_bytes, *arrays))


def _arrays(n: int, k: int, events: bool) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """The arrays after the metadata, in order: the field, its dtype on the wire, its shape."""
    steps = (("durations_ns", "<i8", (n, k)), ("wall_ns", "<i8", (n,)))
    if not events:
        return steps
    return (*steps, ("event_ms", "<f8", (n,)), ("event_state", "i1", (n,)))


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def read_header(data: bytes) -> tuple[int, int, int, int, str, int, int]:
    """(window, rank, N, K, schema hash, metadata length, flags); raises ReportFormatError."""
    if len(data) < HEADER_SIZE:
        raise ReportFormatError(f"window payload too short for a header ({len(data)} bytes)")
    magic, version, window, rank, n, k, schema, meta_len, flags = _HEADER.unpack_from(data)
    if flags & ~_HAS_EVENTS:
        raise ReportFormatError(f"window payload has unknown flag bits {flags:#x}")
    if magic != MAGIC:
        raise ReportFormatError(f"bad window payload magic {magic!r}")
    if version != WIRE_VERSION:
        raise ReportFormatError(f"window payload version {version} is not {WIRE_VERSION}")
    if meta_len > MAX_META_BYTES:
        raise ReportFormatError(f"window metadata of {meta_len} bytes exceeds the limit")
    return window, rank, n, k, schema.decode("ascii", "replace"), meta_len, flags


def payload_size(n: int, k: int, meta_len: int, flags: int) -> int:
    layout = _arrays(n, k, bool(flags & _HAS_EVENTS))
    body = sum(np.dtype(dtype).itemsize * math.prod(shape) for _, dtype, shape in layout)
    return HEADER_SIZE + meta_len + body


def decode_window(data: bytes) -> RankWindow:
    """Parse and validate one payload."""
    window, rank, n, k, schema, meta_len, flags = read_header(data)
    expected = payload_size(n, k, meta_len, flags)
    if len(data) != expected:
        raise ReportFormatError(
            f"window payload of rank {rank} has {len(data)} bytes, header declares {expected}"
        )
    offset = HEADER_SIZE
    try:
        meta: dict[str, Any] = json.loads(data[offset : offset + meta_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"window metadata of rank {rank} is not JSON: {exc}") from None
    offset += meta_len

    def take(dtype: str, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        nonlocal offset
        count = math.prod(shape)
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += np.dtype(dtype).itemsize * count
        return arr.astype(dtype.lstrip("<"), copy=True)

    layout = _arrays(n, k, bool(flags & _HAS_EVENTS))
    arrays: dict[str, Any] = {name: take(dtype, shape) for name, dtype, shape in layout}
    for name, array in (("durations", arrays["durations_ns"]), ("step walls", arrays["wall_ns"])):
        if array.size and (array.min() < 0 or array.max() > MAX_DURATION_NS):
            raise ReportFormatError(
                f"window payload of rank {rank} holds {name} outside [0, 2**50] ns"
            )
    if not isinstance(meta, dict):
        raise ReportFormatError(f"window metadata of rank {rank} is not a JSON object")
    values = {}
    for f in wire_fields():
        if f.name not in meta:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ReportFormatError(f"window metadata of rank {rank} lacks {f.name!r}")
            continue
        values[f.name] = check_meta_value(f.metadata["kind"], meta[f.name], f"rank {rank} {f.name}")
    result = RankWindow(window=window, rank=rank, **arrays, **values)
    span = result.last_step - result.first_step + 1
    if result.first_step > result.last_step or span != n + result.paused_steps:
        paused = f" and {result.paused_steps} paused step(s)" if result.paused_steps else ""
        raise ReportFormatError(
            f"rank {rank} window covers steps {result.first_step}-{result.last_step} "
            f"but holds {n} rows{paused}"
        )
    if any(not result.first_step <= a <= b <= result.last_step for a, b in result.paused_ranges):
        raise ReportFormatError(f"rank {rank} paused ranges fall outside its window's steps")
    if len(result.stages) != k:
        raise ReportFormatError(f"rank {rank} sent {len(result.stages)} stage names for K={k}")
    if result.schema_hash != schema:
        raise ReportFormatError(f"rank {rank} schema hash does not match its stage names")
    return result
