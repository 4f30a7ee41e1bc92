"""The binary envelope two payloads share: a fixed header (magic, version, metadata length, body
length), a JSON metadata block and a body. Node parts (``collect.node_wire``) and window
summaries (``summary_codec``) are both read through ``open_envelope`` and written through
``seal_envelope``. A packed envelope's metadata block is its JSON compressed with zlib (what
travels up the tree at every window is then a few hundred bytes smaller)."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from ..errors import ReportFormatError


def open_envelope(
    data: bytes,
    header: struct.Struct,
    magic: bytes,
    version: int,
    max_meta: int,
    what: str,
    *,
    packed: bool = False,
) -> tuple[Any, bytes]:
    """The parsed metadata and the body of ``data``, after checking the header; any defect
    raises ReportFormatError naming ``what`` (``"node payload"``, ``"summary payload"``)."""
    if len(data) < header.size:
        raise ReportFormatError(f"{what} too short for a header ({len(data)} bytes)")
    found, found_version, meta_len, body_len = header.unpack_from(data)
    if found != magic:
        raise ReportFormatError(f"{what}: bad magic {found!r}, expected {magic!r}")
    if found_version != version:
        raise ReportFormatError(
            f"{what} version {found_version} is not supported (this stagefrontier reads {version})"
        )
    declared = header.size + meta_len + body_len
    if meta_len > max_meta or declared != len(data):
        raise ReportFormatError(f"{what} has {len(data)} bytes, its header declares {declared}")
    start = header.size
    block = data[start : start + meta_len]
    if packed:
        block = _inflated(block, max_meta, what)
    try:
        meta = json.loads(block.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"{what} metadata is not JSON: {exc}") from None
    return meta, data[start + meta_len :]


def seal_envelope(
    header: struct.Struct, magic: bytes, version: int, meta: Any, body: bytes, *, packed: bool
) -> bytes:
    """The envelope of ``meta`` (JSON) and ``body``; ``packed`` compresses the metadata."""
    block = json.dumps(meta, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if packed:
        block = zlib.compress(block, 9)
    return header.pack(magic, version, len(block), len(body)) + block + body


def _inflated(block: bytes, limit: int, what: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(block, limit + 1)
    except zlib.error as exc:
        raise ReportFormatError(f"{what} metadata is not valid zlib: {exc}") from None
    if len(raw) > limit or not inflater.eof or inflater.unused_data:
        raise ReportFormatError(f"{what} metadata is not one zlib stream of at most {limit} bytes")
    return raw
