"""Finding trace files, opening them (plain or gzip) and telling which rank each belongs to."""

from __future__ import annotations

import gzip
import io
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import ReportFormatError
from ..formats.limits import limit, open_regular, over_limit, read_stream
from .errors import TraceFormatError

PathLike = str | os.PathLike[str]
Paths = PathLike | Sequence[PathLike]
RankMap = Mapping[PathLike, int]
"""An explicit rank per trace file, keyed by path or by file name."""

GZIP_MAGIC = b"\x1f\x8b"
KINETO_SUFFIXES = (".json", ".json.gz")
NSYS_SUFFIXES = (".sqlite",)

_RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"[_\-.](\d+)$")


def trace_files(paths: Paths, suffixes: Sequence[str], kind: str) -> list[Path]:
    """The files named by ``paths``: files as given, folders expanded to their files ending in
    one of ``suffixes`` (sorted by name).

    Raises:
        TraceFormatError: a path does not exist, or a folder holds no such file.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise TraceFormatError(f"no {kind} trace files given")
    found: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            inside = sorted(
                p for p in path.iterdir() if p.is_file() and p.name.endswith(tuple(suffixes))
            )
            if not inside:
                raise TraceFormatError(
                    f"{path}: folder holds no {kind} trace ({' or '.join(suffixes)} files)"
                )
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise TraceFormatError(f"{path}: no such file or folder")
    return found


def open_maybe_gzip(path: Path) -> io.BufferedIOBase:
    """Open a regular file for binary reading, decompressing it when it starts with the gzip
    magic (a FIFO or a device is refused, never waited on or read without end).

    Raises:
        TraceFormatError: not a regular file.
        OSError: it cannot be opened.
    """
    try:
        handle = open_regular(path)
    except ReportFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from None
    if handle.peek(2)[:2] != GZIP_MAGIC:
        return handle
    inflating = gzip.GzipFile(fileobj=handle, mode="rb")
    inflating.myfileobj = handle  # type: ignore[assignment]  # closed with it
    return inflating


def read_trace_bytes(path: Path, *, keep: bool = True) -> bytes:
    """A trace file's text, inflated when gzip'd, bounded by the trace size limit and, for a
    gzip file, by the inflate ratio times its compressed size (``formats.limits``): a small
    archive of whitespace is refused before it fills memory. With ``keep`` False the text is
    only measured against the limits (for HTA, which reads the file itself).

    Raises:
        ReportFormatError: the file or its inflated text is over a limit.
        TraceFormatError: a gzip file that does not inflate.
        OSError: the file cannot be read.
    """
    size = path.stat().st_size
    cap, name = limit("trace_bytes"), "trace_bytes"
    if size > cap:
        raise over_limit(name, f"{path} is {size} bytes", TraceFormatError)
    with open_maybe_gzip(path) as handle:
        if isinstance(handle, gzip.GzipFile):
            ratio_cap = limit("inflate_ratio") * max(size, 1 << 16)
            if ratio_cap < cap:
                cap, name = ratio_cap, "inflate_ratio"
        try:
            return read_stream(handle, cap, name, str(path), keep=keep, error=TraceFormatError)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise TraceFormatError(f"{path}: not a readable JSON trace: {exc}") from None


def mapped_rank(path: Path, ranks: RankMap | None) -> int | None:
    """The rank an explicit mapping gives ``path`` (matched by full path, then by file name)."""
    if not ranks:
        return None
    resolved = path.resolve()
    for key, rank in ranks.items():
        if Path(key).resolve() == resolved:
            return _rank_value(rank, path)
    for key, rank in ranks.items():
        if Path(key).name == path.name:
            return _rank_value(rank, path)
    return None


def _rank_value(rank: object, path: Path) -> int:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise TraceFormatError(f"{path}: the rank mapping gives {rank!r}; ranks are ints >= 0")
    return rank


def rank_from_name(path: Path) -> int | None:
    """A rank spelled in a file name: ``...rank3...`` first, else a trailing ``_3``/``-3``/``.3``
    (what ``nsys profile -o report_%q{RANK}`` writes). None when the name has neither."""
    stem = path.name
    for suffix in (".nsys-rep", ".sqlite", ".json.gz", ".json", ".gz"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    match = _RANK_IN_NAME.search(stem) or _TRAILING_NUMBER.search(stem)
    return int(match.group(1)) if match else None


def check_unmapped(ranks: RankMap | None, files: Sequence[Path]) -> None:
    """Refuse a mapping entry that matches none of the files (a typo would go unnoticed)."""
    if not ranks:
        return
    names = {p.name for p in files}
    resolved = {p.resolve() for p in files}
    for key in ranks:
        if Path(key).name not in names and Path(key).resolve() not in resolved:
            raise TraceFormatError(
                f"rank mapping names {os.fspath(key)!r}, which is not a trace file given"
            )
