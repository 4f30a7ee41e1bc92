"""Typed records read strictly: JSON decoded into msgspec Structs whose declarations carry every
field's type and range, under a size and a nesting limit, and each record type's JSON Schema.

A record's declaration is its check: a value of the wrong type, out of its range, or a required
field that is missing is refused with the path of the field (``$.ranks[2]``). Bounds that depend
on the environment (the world size limit, ``formats.limits``) and rules across fields are checked
in the Struct's ``__post_init__``, which raises ``ValueError``. Every refusal is one
``ReportFormatError``: never a ``RecursionError`` or a msgspec error.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

import msgspec

from ..errors import ReportFormatError
from .limits import MAX_NAMED_RANKS, MAX_STEP, MAX_TEXT, limit
from .names import PLAIN_NAME

T = TypeVar("T")

MAX_DEPTH = 16
"""The deepest nesting of arrays and objects a record may hold (an incident's is 4)."""

Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]
_PLAIN_NAME_PATTERN = f"^{PLAIN_NAME.pattern}(?![\\s\\S])"
PlainName = Annotated[str, msgspec.Meta(pattern=_PLAIN_NAME_PATTERN)]
"""A plain name (``formats.names``): the pattern ends where the text does (a ``$`` would let a
trailing newline through)."""
Step = Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
Rank = Annotated[int, msgspec.Meta(ge=0)]
"""A rank number; its upper bound, the world size limit, is checked by ``check_ranks``."""
RankList = Annotated[list[Rank], msgspec.Meta(max_length=MAX_NAMED_RANKS)]
Number = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
"""A finite number."""
Amount = Annotated[float, msgspec.Meta(ge=0, le=sys.float_info.max)]
"""A finite number >= 0."""
Count = Annotated[int, msgspec.Meta(ge=0, le=2**62)]

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def nesting_depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped), read without
    parsing it, so that a crafted file cannot exhaust a parser's recursion."""
    depth = deepest = 0
    for bracket in _BRACKET.findall(_STRING.sub(b"", data)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def check_ranks(ranks: Iterable[int], what: str) -> None:
    """Raise ValueError (a Struct's ``__post_init__`` refusal) when a rank is at or over the
    world size limit."""
    top = limit("world_size") - 1
    if any(r > top for r in ranks):
        raise ValueError(f"{what} must be rank numbers in 0..{top}")


def decode(data: bytes | str, kind: type[T], what: str, max_bytes: int) -> T:
    """``data`` decoded into ``kind``, every field checked; unknown fields are ignored.

    Raises:
        ReportFormatError: ``data`` is larger than ``max_bytes``, nested deeper than
            ``MAX_DEPTH``, not JSON, or not a valid ``kind`` (naming the field).
    """
    raw = data.encode() if isinstance(data, str) else bytes(data)
    _check_size_and_depth(raw, what, max_bytes)
    try:
        return msgspec.json.decode(raw, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise ReportFormatError(f"{what}: {_said(exc)}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"{what} is not JSON: {exc}") from None


def decode_json(data: bytes, where: str, kind: str, max_bytes: int) -> Any:
    """The JSON value in ``data`` (a ``kind`` read from ``where``), untyped: a record whose
    unknown fields must be kept as they stand is then checked with ``check``. Non-finite
    numbers are read, so that ``check`` names the field that holds one.

    Raises:
        ReportFormatError: as ``decode``, saying "not a readable ``kind``" for what is no JSON.
    """
    _check_size_and_depth(data, f"{where}: {kind}", max_bytes)
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ReportFormatError(f"{where}: not a readable {kind}: {exc}") from None


def check(obj: Any, kind: type[T], what: str) -> T:
    """``obj`` (a JSON value already in memory) checked as a ``kind``; raises
    ReportFormatError naming the first field that is wrong."""
    try:
        return msgspec.convert(obj, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise ReportFormatError(f"{what}: {_said(exc)}") from None


_PLAIN_NAME_CHECK = f"`str` matching regex {_PLAIN_NAME_PATTERN!r}"


def _said(exc: msgspec.ValidationError) -> str:
    """msgspec's message, a plain name's pattern said in words."""
    return str(exc).replace(
        _PLAIN_NAME_CHECK,
        "a plain name (letters, digits, '.', '_', '-'; at most 100, starting with a letter or "
        "digit)",
    )


def encode(record: Any) -> bytes:
    return msgspec.json.encode(record)


def json_schema(kind: type[Any]) -> dict[str, Any]:
    """The JSON Schema of a record type (what ``docs/schemas`` holds)."""
    return msgspec.json.schema(kind)


def _check_size_and_depth(data: bytes, what: str, max_bytes: int) -> None:
    if len(data) > max_bytes:
        raise ReportFormatError(f"{what} of {len(data)} bytes exceeds {max_bytes}")
    depth = nesting_depth(data)
    if depth > MAX_DEPTH:
        raise ReportFormatError(f"{what} is nested {depth} deep, deeper than {MAX_DEPTH}")
