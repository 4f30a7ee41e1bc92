"""The binary form of what a node leader sends up to rank 0: one envelope per node and window.

Layout: a fixed header (magic, version, metadata length, body length), a UTF-8 JSON metadata
block (the window, the node, which of its ranks arrived, which did not and why), then the body:
the node's summary as its own codec writes it. Nothing is unpickled; every size and field is
checked before use, and a bad envelope raises ReportFormatError (the root then reports that node
missing with the error as the reason).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import ReportFormatError
from .wire_checks import check_meta_value

MAGIC = b"SFN1"
NODE_WIRE_VERSION = 1
_HEADER = struct.Struct("<4sHIQ")
MAX_META_BYTES = 1 << 20


@dataclass(frozen=True)
class NodePart:
    """One node's share of one window, as its leader saw it."""

    window: int
    node: int
    first_step: int
    last_step: int
    host: str
    ranks_present: tuple[int, ...]
    missing_ranks: tuple[int, ...]
    """The node's ranks whose window did not reach the leader (or was rejected there)."""
    notes: tuple[str, ...]
    """Why, in the leader's words (late ranks, rejected payloads, a failed node store)."""
    body: bytes


_FIELDS = {
    "window": "count",
    "node": "count",
    "first_step": "count",
    "last_step": "count",
    "host": "text",
    "ranks_present": "counts",
    "missing_ranks": "counts",
    "notes": "names",
}


def encode_node_part(part: NodePart) -> bytes:
    meta = {name: _jsonable(getattr(part, name)) for name in _FIELDS}
    meta_bytes = json.dumps(meta, allow_nan=False).encode("utf-8")
    header = _HEADER.pack(MAGIC, NODE_WIRE_VERSION, len(meta_bytes), len(part.body))
    return b"".join((header, meta_bytes, part.body))


def decode_node_part(data: bytes) -> NodePart:
    """Parse and validate one envelope; raises ReportFormatError."""
    if len(data) < _HEADER.size:
        raise ReportFormatError(f"node payload too short for a header ({len(data)} bytes)")
    magic, version, meta_len, body_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ReportFormatError(f"bad node payload magic {magic!r}")
    if version != NODE_WIRE_VERSION:
        raise ReportFormatError(f"node payload version {version} is not {NODE_WIRE_VERSION}")
    if meta_len > MAX_META_BYTES or len(data) != _HEADER.size + meta_len + body_len:
        raise ReportFormatError(
            f"node payload has {len(data)} bytes, its header declares "
            f"{_HEADER.size + meta_len + body_len}"
        )
    start = _HEADER.size
    try:
        meta = json.loads(data[start : start + meta_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"node payload metadata is not JSON: {exc}") from None
    if not isinstance(meta, dict) or set(meta) != set(_FIELDS):
        raise ReportFormatError(f"node payload metadata must hold exactly {sorted(_FIELDS)}")
    values: dict[str, Any] = {}
    for name, kind in _FIELDS.items():
        if kind == "counts":
            items = meta[name]
            if not isinstance(items, list):
                raise ReportFormatError(f"node payload {name} is not a list")
            values[name] = tuple(
                check_meta_value("count", v, f"node payload {name}") for v in items
            )
        else:
            values[name] = check_meta_value(kind, meta[name], f"node payload {name}")
    return NodePart(body=bytes(data[start + meta_len :]), **values)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
