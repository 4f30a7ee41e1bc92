"""The binary envelope two payloads share: a fixed header (magic, version, metadata length, body
length), a JSON metadata block and a body. Node parts (``collect.node_wire``) and window
summaries (``summary_codec``) are both read through ``open_envelope``."""

from __future__ import annotations

import json
import struct
from typing import Any

from ..errors import ReportFormatError


def open_envelope(
    data: bytes, header: struct.Struct, magic: bytes, version: int, max_meta: int, what: str
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
    try:
        meta = json.loads(data[start : start + meta_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"{what} metadata is not JSON: {exc}") from None
    return meta, data[start + meta_len :]
