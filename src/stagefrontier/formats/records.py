"""``windows.jsonl``: one JSON record per analyzed window (its metadata and its report).

A record holds the window's report and where it came from, not its matrix: re-analysis needs the
window's evidence packet. Records are matched by window index, and by restart attempt when a
torchelastic restart counted windows from 0 again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from ..analysis.window_report import REPORT_FORMAT, WindowReport
from ..errors import NotJsonError, ReportFormatError
from .limits import RECORD_LINE_BYTES, check_limit, limit, over_limit
from .stored_report import check_stored_report, check_window_meta
from .window_rows import WindowKey, decode_key

T = TypeVar("T")

logger = logging.getLogger("stagefrontier")

WINDOWS_FILE = "windows.jsonl"
REPORT_KEYS = frozenset(f.name for f in fields(WindowReport)) | {"format", "version"}
"""The record keys that belong to the report; the others describe the window."""


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a ``windows.jsonl`` file, in file order (blank lines skipped), each
    checked to be a window record holding a valid report. A last line cut short (no newline and
    not JSON: a writer stopped mid-line) is skipped with a warning, and so is a record cut short
    that a later record was appended onto (a full disk, freed again, under an older writer): the
    later record is kept. ``iter_records`` reads a file of any size one line at a time.

    Raises:
        ReportFormatError: the file is over the size limit (``formats.limits``), or a line is
            not UTF-8, not JSON, or not a valid window record, naming the file and line.
    """
    return [record for _, record in iter_records(path, checked_record, limit("records_bytes"))]


def iter_records(
    path: str | os.PathLike[str], decode: Callable[[bytes, str], T], cap: int | None = None
) -> Iterator[tuple[str, T]]:
    """Each line of a ``windows.jsonl`` file decoded by ``decode(line, label)``, with its label
    (``file:line``), one at a time; records cut short are skipped as ``read_records`` says.
    ``decode`` raises ``NotJsonError`` for a line that is not JSON, ReportFormatError naming the
    label for one that is not a record. With ``cap``, a file over that many bytes is refused.

    Raises:
        ReportFormatError: over ``cap``, a line over ``RECORD_LINE_BYTES``, or a line that is
            not a record, naming the file and line.
    """
    source = Path(path)
    with source.open("rb") as handle:
        if cap is not None:
            check_limit("records_bytes", os.fstat(handle.fileno()).st_size, f"{source} size")
        total = 0
        for number, line in enumerate(iter(lambda: handle.readline(RECORD_LINE_BYTES + 1), b""), 1):
            total += len(line)
            label = f"{source}:{number}"
            if cap is not None and total > cap:
                raise over_limit("records_bytes", f"{source} grew past {total} bytes")
            if len(line) > RECORD_LINE_BYTES:
                raise ReportFormatError(f"{label}: a line over {RECORD_LINE_BYTES} bytes")
            if not line.strip():
                continue
            try:
                found: tuple[T] | None = (decode(line, label),)
            except NotJsonError as exc:
                if not line.endswith(b"\n") and not handle.peek(1):
                    logger.warning("%s: last line is cut short (%s); skipped", label, exc)
                    continue
                if not line.startswith(RECORD_START):
                    raise ReportFormatError(f"{label}: not JSON: {exc}") from None
                found = _after_torn_record(line, label, exc, decode)
            if found is not None:
                yield label, found[0]


def checked_record(line: bytes, label: str) -> dict[str, Any]:
    """A line as a whole record, checked (``check_record``); NotJsonError when it is not JSON."""
    return check_record(_json_line(line), label)


def uncut_record(line: bytes, label: str) -> dict[str, Any] | None:
    """``checked_record``, or None for a record the disk budget cut down to its summary
    (``"compacted": true``), for a reader that wants every whole record."""
    return None if COMPACTED_MARK in line else checked_record(line, label)


def whole_record(line: bytes, label: str) -> dict[str, Any]:
    """A line a lean decoder took, as a whole record, checked; ReportFormatError when it is
    not (a byte that is not UTF-8 in a field the lean decoder skipped, say)."""
    try:
        return checked_record(line, label)
    except NotJsonError as exc:
        raise ReportFormatError(f"{label}: not JSON: {exc}") from None


def _json_line(line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise NotJsonError(str(exc)) from None


RECORD_START = b'{"run_id": '
"""How every record the library writes begins (``window``: the run id comes first)."""
COMPACTED_MARK = b'"compacted": true'
"""What a record the disk budget cut down to its summary holds
(``formats.window_rows.summary_record``)."""


def _after_torn_record(
    line: bytes, label: str, exc: Exception, decode: Callable[[bytes, str], T]
) -> tuple[T] | None:
    """The whole record a line holds after a record cut short (a write that failed on a full
    disk, by a writer that did not cut it off), or None when it holds none; either way said in
    one warning."""
    start = line.rfind(RECORD_START)
    if start > 0:
        try:
            record = decode(line[start:], label)
        except NotJsonError:
            pass
        else:
            logger.warning(
                "%s: a record cut short (%s) runs into the next one; the cut record is skipped",
                label,
                exc,
            )
            return (record,)
    logger.warning("%s: a record cut short (%s); skipped", label, exc)
    return None


def check_record(record: Any, label: str) -> dict[str, Any]:
    """``record`` when it is a window record: a JSON object with a ``window`` index and its
    steps, an optional restart ``attempt``, well-formed window facts (``check_window_meta``)
    and a valid report (``record_report``).

    Raises:
        ReportFormatError: anything else, prefixed with ``label``.
    """
    if not isinstance(record, dict):
        raise ReportFormatError(f"{label}: not a window record (a JSON object)")
    if record.get("compacted") is True:
        raise ReportFormatError(
            f"{label}: window {window_name(record)} keeps only its summary: the disk budget "
            "cut its record down (see compacted.jsonl)"
        )
    if "window" not in record:
        raise ReportFormatError(f"{label}: not a window record (no 'window' index)")
    if not {"first_step", "last_step"} <= record.keys():
        raise ReportFormatError(f"{label}: a window record without first_step and last_step")
    try:
        check_window_meta(record_meta(record))
    except ReportFormatError as exc:
        raise ReportFormatError(f"{label}: {exc}") from None
    record_report(record, label)
    return record


def looks_like_records(head: bytes) -> bool:
    """Whether the first bytes of a file are a ``windows.jsonl`` record: a one-line JSON object
    that carries a window report."""
    first = head.split(b"\n", 1)[0]
    return first.startswith(b"{") and f'"{REPORT_FORMAT}"'.encode() in first


def records_of_window(
    path: str | os.PathLike[str], window: int | None, attempt: int | None
) -> tuple[list[dict[str, Any]], int, str]:
    """The records of ``window`` (in ``attempt`` when given; none for None) in a
    ``windows.jsonl`` of any size, read a line at a time (``iter_records``), each checked whole;
    how many records the file holds, and the first eight windows, for a message
    (``0, 1, 2, ...``).

    Raises:
        ReportFormatError: as ``iter_records``, or a matching record is not valid.
    """
    found, names = [], list[str]()
    count = 0
    for label, (key, line) in iter_records(path, _key_and_line):
        count += 1
        if len(names) < 8:
            names.append(window_name({"window": key.window, "attempt": key.attempt}))
        if key.window == window and (attempt is None or key.attempt == attempt):
            found.append(whole_record(line, label))
    return found, count, ", ".join(names) + (", ..." if count > len(names) else "")


def _key_and_line(line: bytes, label: str) -> tuple[WindowKey, bytes]:
    return record_key(line, label), line


def record_key(line: bytes, label: str) -> WindowKey:
    """Which window a line is (``WindowKey``), the rest of it left undecoded."""
    return lean(decode_key, line, label)


def lean(decode: Callable[[bytes], T], line: bytes, label: str) -> T:
    """``decode(line)``: a few fields of a record, typed (``formats.window_rows``). A line it
    refuses is checked whole, so that the refusal names what ``check_record`` names."""
    try:
        return decode(line)
    except ReportFormatError as exc:
        whole_record(line, label)
        raise ReportFormatError(f"{label}: {exc}") from None


def select_record(
    records: list[dict[str, Any]],
    window: int,
    attempt: int | None,
    label: str,
    held: str | None = None,
) -> dict[str, Any]:
    """The record of ``window`` (in ``attempt``, needed only when a restart repeats the index).

    Raises:
        ReportFormatError: no such window, or several attempts hold it and none was named.
    """
    found = [
        r
        for r in records
        if r.get("window") == window and (attempt is None or r.get("attempt", 0) == attempt)
    ]
    if len(found) == 1:
        return found[0]
    if found:
        attempts = ", ".join(str(r.get("attempt", 0)) for r in found)
        raise ReportFormatError(
            f"{label}: window {window} is in restart attempts {attempts}; name one as "
            f"ATTEMPT/{window}"
        )
    held = held or ", ".join(window_name(r) for r in records) or "none"
    wanted = f"{attempt}/{window}" if attempt is not None else str(window)
    raise ReportFormatError(f"{label}: no window {wanted}; it holds windows {held}")


def window_name(record: dict[str, Any]) -> str:
    """``3``, or ``1/3`` for window 3 of restart attempt 1 (as ``stagefrontier report`` lists)."""
    attempt = record.get("attempt", 0)
    return f"{attempt}/{record.get('window', '?')}" if attempt else str(record.get("window", "?"))


def record_report(record: dict[str, Any], label: str) -> WindowReport:
    """The report stored in a record, every value checked (``check_stored_report``)."""
    try:
        report = WindowReport.from_dict({k: v for k, v in record.items() if k in REPORT_KEYS})
        return check_stored_report(report)
    except ReportFormatError as exc:
        raise ReportFormatError(f"{label}: {exc}") from None


def record_meta(record: dict[str, Any]) -> dict[str, Any]:
    """The record's description of its window (everything but the report)."""
    return {k: v for k, v in record.items() if k not in REPORT_KEYS}
