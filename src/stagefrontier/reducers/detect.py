"""Telling an input's format from its content (then its name), and reducing it by format name."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..formats.records import looks_like_records
from .errors import TraceFormatError
from .files import GZIP_MAGIC, KINETO_SUFFIXES, NSYS_SUFFIXES, open_maybe_gzip
from .nsys import SQLITE_MAGIC
from .options import TraceOptions
from .result import ReducedTrace

_PACKETS = ("packet", "summary_packet")
"""Format names of the packets ``stagefrontier analyze`` reads."""
FORMATS = ("auto", "packet", "windows", "npz", "kineto", "hta", "nsys")
TRACE_FORMATS = ("kineto", "hta", "nsys")
ZIP_MAGIC = b"PK\x03\x04"
_PEEK = 1 << 16
_TRACE_KEYS = (b'"traceEvents"', b'"schemaVersion"', b'"distributedInfo"')


def detect_format(path: Path) -> str:
    """``packet``, ``windows`` (a ``windows.jsonl``), ``npz``, ``kineto`` or ``nsys`` for a file
    or folder.

    A folder is read as PyTorch Profiler traces unless it holds only ``.sqlite`` exports. A file
    is told by its first bytes (zip, SQLite, gzip, a JSON packet or Chrome trace), then by its
    name; ``hta`` is never guessed (it reads the same files as ``kineto``).

    Raises:
        TraceFormatError: an Nsight ``.nsys-rep`` (export it first) or an unknown kind of file.
    """
    if path.is_dir():
        names = [p.name for p in path.iterdir() if p.is_file()]
        has_kineto = any(n.endswith(KINETO_SUFFIXES) for n in names)
        has_nsys = any(n.endswith(NSYS_SUFFIXES) for n in names)
        return "nsys" if has_nsys and not has_kineto else "kineto"
    with path.open("rb") as handle:
        head = handle.read(len(SQLITE_MAGIC))
    if head.startswith(ZIP_MAGIC):
        return "npz"
    if head.startswith(SQLITE_MAGIC):
        return "nsys"
    if head.startswith(GZIP_MAGIC):
        return "kineto"
    if path.name.endswith(".nsys-rep") or path.suffix == ".qdrep":
        raise TraceFormatError(
            f"{path}: an Nsight Systems report; export it first with "
            f"nsys export --type sqlite {path.name}"
        )
    text = _peek_text(path)
    if text.startswith(b"{"):
        if any(f'"stagefrontier.formats.{k}"'.encode() in text[:4096] for k in _PACKETS):
            return "packet"
        if looks_like_records(text):
            return "windows"
        if any(key in text for key in _TRACE_KEYS):
            return "kineto"
        return "packet"
    if text.startswith(b"["):
        return "kineto"
    for suffix, kind in (
        (".npz", "npz"),
        (".sqlite", "nsys"),
        (".jsonl", "windows"),
        (".json", "packet"),
    ):
        if path.name.endswith(suffix):
            return kind
    raise TraceFormatError(
        f"{path}: neither an .npz window nor a stagefrontier packet or windows.jsonl, a PyTorch "
        "Profiler trace (.json/.json.gz or a folder) or an Nsight Systems SQLite export"
    )


def _peek_text(path: Path) -> bytes:
    with open_maybe_gzip(path) as handle:
        return handle.read(_PEEK).lstrip()


def reduce_trace(
    paths: Path | Sequence[Path],
    fmt: str,
    stages: Sequence[str] | None = None,
    options: TraceOptions | None = None,
) -> ReducedTrace:
    """Run the reducer named ``fmt`` (``kineto``, ``hta`` or ``nsys``) with ``options``."""
    from .hta import reduce_hta
    from .kineto import reduce_kineto
    from .nsys import reduce_nsys

    reducers = {"kineto": reduce_kineto, "hta": reduce_hta, "nsys": reduce_nsys}
    if fmt not in reducers:
        raise TraceFormatError(f"unknown trace format {fmt!r}; one of {', '.join(reducers)}")
    return reducers[fmt](paths, stages, options)
