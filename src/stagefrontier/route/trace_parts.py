"""A capture's trace: its stopped profiler session's JSON saved and gzipped into the rank's trace
file, by the process ``trace_writer`` forks (or on the router thread where it cannot fork).

The session belongs to the thread that started it: its stop runs there (the training thread).
Its JSON export (Kineto's writer, which holds the GIL throughout) runs apart from it, so that
the step after a capture does not carry it; the training thread hands the stopped session over
and starts no other session until the export is done (with an export on the router thread while
the training thread started the next session, a rank of a test job once died of SIGSEGV). The
writer reads the saved JSON, gzips it into the trace under way and removes it
(``TraceParts.append``), and ends the file (``TraceParts.join``). A capture runs one session
(see ``capture``); the file is written as parts so that a capture split into several sessions
joins into one trace.

Kineto writes a trace as one JSON object whose ``traceEvents`` array is followed only by its
``traceName``. Parts are joined as text, without parsing them: the first part's head, every
part's events in order, the last part's tail. Every part shares the process, its threads and the
time base (Kineto's timestamps count from the start of a fixed ~91-day period), so the events
read as one session's; each part's few metadata events (process and thread names) repeat.
"""

from __future__ import annotations

import errno
import gzip
import logging
import secrets
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import msgspec

from ..failures import say_failed
from ..formats.packet import atomic_file, remove_temporaries

logger = logging.getLogger("stagefrontier")

TRACE_GZIP_LEVEL = 1
"""Fast compression: the export runs on a training rank's CPU, and a level-1 trace is about a
fifth larger than the default level's."""
EVENTS_OPEN = b'"traceEvents": ['
TRACE_NAME = b'"traceName"'
BASE_TIME = b'"baseTimeNanoseconds":'


def gzip_writer() -> Any:
    """The class that gzips a trace: isal's ``igzip.GzipFile`` where installed (the ``router``
    extra: ISA-L compresses a profiler's trace at level 1 in about a quarter of zlib's CPU, to
    the same size), else the standard library's. Both write a standard gzip file."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.GzipFile
    return igzip.GzipFile


class GzipTarget:
    """A gzipped file written a chunk at a time, across calls, that replaces ``target`` only at
    ``commit`` (through ``atomic_file``: written under a temporary name in the same folder,
    synced, renamed); ``discard`` removes what was written and leaves ``target`` as it was."""

    def __init__(self, target: Path) -> None:
        self._stack = ExitStack()
        raw = self._stack.enter_context(atomic_file(target))
        self._zipped = self._stack.enter_context(
            gzip_writer()(target.name.removesuffix(".gz"), "wb", TRACE_GZIP_LEVEL, raw, mtime=0)
        )

    def write(self, chunk: bytes) -> None:
        self._zipped.write(chunk)

    def commit(self) -> None:
        """Finish the file and put it in place; raises OSError (the temporary file is then
        removed)."""
        self._stack.close()

    def discard(self) -> None:
        # closing the compressor may fail again on the disk that failed the write
        with suppress(OSError):
            self._stack.__exit__(OSError, OSError(errno.ECANCELED, "discarded"), None)


def split_trace(data: bytes) -> tuple[int, int]:
    """Where a Kineto trace's events lie in its text: from just after the ``traceEvents``
    array's bracket to its closing bracket. Raises OSError (EIO) on any other layout."""
    start = data.find(EVENTS_OPEN)
    name = data.rfind(TRACE_NAME)
    end = data.rfind(b"]", start, name if name >= 0 else len(data))
    if start < 0 or end < start:
        raise OSError(errno.EIO, "the profiler's trace is not in Kineto's layout")
    return start + len(EVENTS_OPEN), end


def base_time(data: bytes, events_at: int) -> bytes:
    """The ``baseTimeNanoseconds`` value in a trace's head (empty when it has none)."""
    at = data.find(BASE_TIME, 0, events_at)
    if at < 0:
        return b""
    return data[at + len(BASE_TIME) :].split(b",", 1)[0].strip()


class TraceParts:
    """One capture's trace, a part at a time, on the router thread: ``save`` writes a stopped
    session's JSON, ``append`` adds its events to the gzipped trace under way and ``join`` ends
    it.

    A part that fails is not retried: the capture's trace is then reported failed, with the
    first error, and nothing of it is kept."""

    def __init__(self, folder: Path, name: str) -> None:
        """``folder``: the incident's; ``name``: the trace's file name there."""
        self.folder = folder
        self.name = name
        self.parts = 0
        """Parts appended to the trace."""
        self._saved = 0
        self.error: Exception | None = None
        self._out: GzipTarget | None = None
        self._base = b""
        self._events = False  # an event was written (the next part's go after a comma)
        self._tail = b""  # the last part's text after its events

    def save(self, prof: Any) -> Path | None:
        """A stopped session's JSON as the next part (None after a failure, which is kept for
        ``join``); no other profiler session of the capture's may start while it runs."""
        if self.error is not None:
            return None
        return self._save(prof)

    def _save(self, prof: Any) -> Path | None:
        # Kineto writes ``path`` under a temporary name first, then renames it; every name ends
        # in ``.tmp``, like the temporary files the coordinator removes after a killed run.
        path = self.folder / f".{self.name}.part{self._saved}.{secrets.token_hex(6)}.json.tmp"
        self._saved += 1
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(path))
            if not path.is_file():  # Kineto reports a failed write only in its own log
                raise OSError(errno.EIO, "the profiler could not write its trace (disk full?)")
        except Exception as exc:
            self.error = exc
            _remove_part(path)
            return None
        return path

    def append(self, path: Path | None) -> None:
        """On the router thread: the saved part's events appended to the trace, the part
        removed (nothing after a failure)."""
        if path is None:
            return
        try:
            if self.error is None:
                self._append(path.read_bytes())
                self.parts += 1
        except Exception as exc:
            self.error = exc
            self.discard()
        finally:
            _remove_part(path)

    def _append(self, data: bytes) -> None:
        start, end = split_trace(data)
        base = base_time(data, start)
        if self._out is None:
            self._out = GzipTarget(self.folder / self.name)
            self._base = base
            self._out.write(data[:start])
        elif base != self._base:  # a capture across the turn of Kineto's period
            raise OSError(errno.EIO, "the trace's parts count time from different bases")
        events = data[start:end].strip()
        if events:
            if self._events:
                self._out.write(b",\n")
            self._out.write(events)
            self._events = True
        self._tail = data[end:]

    def append_events(self, make: Callable[[int], list[dict[str, Any]]]) -> None:
        """On the router thread, after the parts: the events ``make`` builds, given the trace's
        base time in nanoseconds (0 where the trace counts from the epoch), written after the
        parts' own (the sampled Python stacks). A failure to build them is said in one line
        and the trace kept without them."""
        if self._out is None or self.error is not None:
            return
        try:
            try:
                events = make(int(self._base or b"0"))
            except Exception as exc:
                say_failed(logger, "building the sampled Python stacks", exc, "the trace has none")
                return
            if events:
                body = b",\n".join(map(msgspec.json.Encoder().encode, events))
                self._out.write((b",\n" if self._events else b"") + body)
                self._events = True
        except Exception as exc:
            self.error = exc
            self.discard()

    def join(self) -> Path:
        """End the trace (``folder / name``, in place whole or not at all). Raises what a
        part's write raised, or OSError."""
        out, self._out = self._out, None
        try:
            if self.error is not None:
                raise self.error
            if out is None:
                raise OSError(errno.EIO, "the capture recorded no profiler session")
            out.write(self._tail)
            out.commit()
        except BaseException:
            if out is not None:
                out.discard()
            raise
        return self.folder / self.name

    def discard(self) -> None:
        """Drop the trace under way (its temporary file)."""
        out, self._out = self._out, None
        if out is not None:
            out.discard()

    def remove(self) -> None:
        """Remove what a failed write left: the temporary files, and the trace itself (a
        writer killed after it was in place reports no path: the trace is not kept)."""
        remove_temporaries(self.folder, f".{self.name}*.tmp")
        with suppress(OSError):
            (self.folder / self.name).unlink(missing_ok=True)


def _remove_part(path: Path) -> None:
    """A part's file and what Kineto may have left beside it (its own temporary name)."""
    with suppress(OSError):  # an unusable folder fails the unlinks too
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".tmp").unlink(missing_ok=True)
