"""The command line's last resort: an unexpected exception told in one line, with its full
traceback kept in a file for a bug report."""

from __future__ import annotations

import tempfile
import traceback

TRACEBACK_PREFIX = "stagefrontier-traceback-"


def last_resort_line(exc: BaseException) -> str:
    """One line for an exception no reader turned into a StageFrontierError: its type and
    message, and where its traceback was written (nothing when the file cannot be written, as
    when memory ran out)."""
    message = str(exc).splitlines()[0] if str(exc).strip() else ""
    line = f"unexpected {type(exc).__name__}{': ' + message if message else ''}"
    if isinstance(exc, MemoryError):
        return f"{line} (out of memory: the input is too large for this machine)"
    try:
        with tempfile.NamedTemporaryFile(
            "w", prefix=TRACEBACK_PREFIX, suffix=".txt", delete=False, encoding="utf-8"
        ) as handle:
            handle.write("".join(traceback.format_exception(exc)))
    except OSError:
        return line
    return f"{line} (a bug: please report it with the traceback in {handle.name})"
