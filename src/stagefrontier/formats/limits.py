"""Size limits on what the readers take in, and the one size-capped reader they all use.

A file must never cost more than a small multiple of its size in memory, and a small file must
never declare its way into a large allocation. Every reader therefore checks a file's size (and
a compressed file's inflated size) before parsing it, and every declared shape before building
the array. Each limit has a default and an environment variable that overrides it (both
in ``environment.VARIABLES``):

=================================  ==========  =================================================
variable                           default     bounds
=================================  ==========  =================================================
``STAGEFRONTIER_MAX_PACKET_BYTES`` 64 MiB      an evidence packet file
``STAGEFRONTIER_MAX_RECORDS_BYTES`` 256 MiB    a ``windows.jsonl`` file (16 MiB a line)
``STAGEFRONTIER_MAX_INCIDENT_BYTES`` 16 MiB    an ``incident.json`` file
``STAGEFRONTIER_MAX_TRACE_BYTES``  1 GiB       a JSON trace, after decompression
``STAGEFRONTIER_MAX_INFLATE_RATIO`` 50         inflated / compressed size (``.json.gz``, ``.npz``)
``STAGEFRONTIER_MAX_CELLS``        2**25       steps x ranks x stages of a packet or ``.npz``
``STAGEFRONTIER_MAX_WORLD_SIZE``   2**17       a world size stated by a trace or asked for
=================================  ==========  =================================================

Only regular files are read: a FIFO, a device (``/dev/zero``) or a socket is refused before a
byte is read, so a path planted in an input can neither block a reader nor feed it without end.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..environment import LIMITS as LIMIT_VARIABLES
from ..environment import positive_int
from ..errors import ReportFormatError

MiB = 1 << 20


@dataclass(frozen=True)
class Limit:
    """One bound: its environment variable (``environment.LIMITS``) and what it bounds."""

    env: str
    what: str


LIMITS = {name: Limit(variable.name, variable.what) for name, variable in LIMIT_VARIABLES.items()}
MAX_CAPTURE_STEPS = 100
"""The most steps one profiler capture spans: the profiler holds every event in memory until it
stops. A request for more is refused where a person makes it (``request_capture``,
``stagefrontier capture``) and capped, with a reason, where it is read from the store; an
incident on disk stating a longer span is refused."""
MAX_NAMED_RANKS = 64
"""The most ranks one capture request or incident may name (a suspect and a reference are two)."""
MAX_TEXT = 4096
"""The longest stage name, reason, path or host a capture request, answer or incident carries."""
MAX_STEP = 2**62
"""A global step number beyond any run's length, within int64."""
RECORD_LINE_BYTES = 16 * MiB
"""The longest ``windows.jsonl`` line read (a record is a few kB)."""
_CHUNK = MiB


def limit(name: str) -> int:
    """The current value of limit ``name``: its environment variable when set, else the default.

    Raises:
        ReportFormatError: the variable is set to anything but a positive integer.
    """
    return positive_int(LIMITS[name].env)


def over_limit(
    name: str, label: str, error: type[ReportFormatError] = ReportFormatError
) -> ReportFormatError:
    """The error (``error``, a ReportFormatError kind) for ``label``, what exceeds limit
    ``name``, saying how to raise the limit."""
    spec = LIMITS[name]
    return error(
        f"{label}, over the limit of {limit(name)} {spec.what} (set {spec.env} to raise it)"
    )


def check_limit(
    name: str, amount: int, label: str, error: type[ReportFormatError] = ReportFormatError
) -> None:
    """Refuse ``amount`` (what ``label`` names) when it exceeds limit ``name``."""
    if amount > limit(name):
        raise over_limit(name, f"{label}: {amount}", error)


def read_capped(path: str | os.PathLike[str], name: str) -> bytes:
    """A whole file of at most limit ``name`` bytes; the size is checked before reading, and a
    file that grows (or a device such as ``/dev/zero``) is cut at the limit and refused. The
    message says "the file": callers name it, as they do for the other defects they find.

    Raises:
        ReportFormatError: the file is larger than the limit.
        OSError: the file cannot be read.
    """
    with open_regular(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > limit(name):
            raise over_limit(name, f"the file is {size} bytes")
        return read_stream(handle, limit(name), name, "the file")


def open_regular(path: str | os.PathLike[str]) -> io.BufferedReader:
    """``path`` opened for binary reading when it is a regular file (symbolic links followed).
    The open never blocks: a FIFO is opened without waiting for a writer, then refused with a
    device or a socket.

    Raises:
        ReportFormatError: the path is not a regular file ("the file is not a regular file":
            callers name it).
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReportFormatError(
                "the file is not a regular file (a FIFO, a device or a socket): not read"
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def regular_file_inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path | None:
    """``path`` resolved (links followed) when it is a regular file inside folder ``root``; None
    when it is missing, outside ``root`` or not a regular file. For paths an input names, such
    as a trace an incident points to: only files of the run folder are ever opened."""
    try:
        real = Path(path).resolve(strict=True)
        inside = real.is_relative_to(Path(root).resolve(strict=True))
        return real if inside and stat.S_ISREG(real.stat().st_mode) else None
    except (OSError, RuntimeError):  # missing, unreadable, or a loop of links
        return None


def read_stream(
    handle: io.BufferedIOBase,
    cap: int,
    name: str,
    label: str,
    *,
    keep: bool = True,
    error: type[ReportFormatError] = ReportFormatError,
) -> bytes:
    """At most ``cap`` bytes of an open stream, read in chunks (a decompressing stream is never
    inflated past the cap); more raises ``over_limit(name)``. With ``keep`` False the stream is
    only measured (for a reader that parses the file itself) and ``b""`` is returned."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = handle.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        if keep:
            chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise over_limit(name, f"{label} holds more than {cap} bytes", error)
