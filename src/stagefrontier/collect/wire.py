"""The binary form of a RankWindow on the store: a validated header plus raw little-endian arrays.

Layout: a fixed header (magic, format version, window, rank, N, K, schema hash, metadata length,
flags), a UTF-8 JSON metadata block (stage names and rank identity), then ``[N, K]`` int64
durations, ``[N]`` int64 step walls and, when events were sampled, ``[N]`` float64 milliseconds and
``[N]`` int8 states. Nothing is ever unpickled; sizes are checked before any array is built.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from ..errors import ReportFormatError
from ..record.window import RankWindow

MAGIC = b"SFW1"
WIRE_VERSION = 1
_HEADER = struct.Struct("<4sHIIII16sIB")
HEADER_SIZE = _HEADER.size
_HAS_EVENTS = 1
MAX_META_BYTES = 1 << 20


def encode_window(w: RankWindow) -> bytes:
    meta = {
        "stages": list(w.stages),
        "first_step": w.first_step,
        "last_step": w.last_step,
        "schema_version": w.schema_version,
        "forward_stage": w.forward_stage,
        "accumulation_factor": w.accumulation_factor,
        "accumulation_mixed": w.accumulation_mixed,
        "contract_violations": w.contract_violations,
        "violation_reasons": list(w.violation_reasons),
        "probes": w.probes,
        "dropped_windows": w.dropped_windows,
        "hostname": w.hostname,
        "local_rank": w.local_rank,
        "pid": w.pid,
        "role": w.role,
    }
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
    parts = [
        header,
        meta_bytes,
        np.ascontiguousarray(w.durations_ns, dtype="<i8").tobytes(),
        np.ascontiguousarray(w.wall_ns, dtype="<i8").tobytes(),
    ]
    if has_events:
        parts.append(np.ascontiguousarray(w.event_ms, dtype="<f8").tobytes())
        parts.append(np.ascontiguousarray(w.event_state, dtype="i1").tobytes())
    return b"".join(parts)


def read_header(data: bytes) -> tuple[int, int, int, int, str, int, int]:
    """(window, rank, N, K, schema hash, metadata length, flags); raises ReportFormatError."""
    if len(data) < HEADER_SIZE:
        raise ReportFormatError(f"window payload too short for a header ({len(data)} bytes)")
    magic, version, window, rank, n, k, schema, meta_len, flags = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ReportFormatError(f"bad window payload magic {magic!r}")
    if version != WIRE_VERSION:
        raise ReportFormatError(f"window payload version {version} is not {WIRE_VERSION}")
    if meta_len > MAX_META_BYTES:
        raise ReportFormatError(f"window metadata of {meta_len} bytes exceeds the limit")
    return window, rank, n, k, schema.decode("ascii", "replace"), meta_len, flags


def payload_size(n: int, k: int, meta_len: int, flags: int) -> int:
    events = n * 9 if flags & _HAS_EVENTS else 0
    return HEADER_SIZE + meta_len + 8 * n * k + 8 * n + events


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
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportFormatError(f"window metadata of rank {rank} is not JSON: {exc}") from None
    offset += meta_len

    def take(dtype: str, count: int, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        nonlocal offset
        size = np.dtype(dtype).itemsize * count
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += size
        return arr.astype(dtype.lstrip("<"), copy=True)

    durations = take("<i8", n * k, (n, k))
    wall = take("<i8", n, (n,))
    event_ms = take("<f8", n, (n,)) if flags & _HAS_EVENTS else None
    event_state = take("i1", n, (n,)) if flags & _HAS_EVENTS else None
    try:
        result = RankWindow(
            window=window,
            first_step=int(meta["first_step"]),
            last_step=int(meta["last_step"]),
            rank=rank,
            stages=tuple(str(s) for s in meta["stages"]),
            durations_ns=durations,
            wall_ns=wall,
            event_ms=event_ms,
            event_state=event_state,
            forward_stage=meta.get("forward_stage"),
            accumulation_factor=int(meta.get("accumulation_factor", 1)),
            accumulation_mixed=bool(meta.get("accumulation_mixed", False)),
            contract_violations=int(meta.get("contract_violations", 0)),
            violation_reasons=tuple(str(r) for r in meta.get("violation_reasons", ())),
            probes=dict(meta.get("probes", {})),
            dropped_windows=int(meta.get("dropped_windows", 0)),
            hostname=str(meta.get("hostname", "")),
            local_rank=int(meta.get("local_rank", 0)),
            pid=int(meta.get("pid", 0)),
            role=meta.get("role"),
            schema_version=int(meta.get("schema_version", 1)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportFormatError(f"window metadata of rank {rank} is malformed: {exc}") from None
    if len(result.stages) != k:
        raise ReportFormatError(f"rank {rank} sent {len(result.stages)} stage names for K={k}")
    if result.schema_hash != schema:
        raise ReportFormatError(f"rank {rank} schema hash does not match its stage names")
    return result
