"""Where the ``stagefrontier`` logger's records go: nowhere, unless someone says so.

The library installs no handler of its own: the package gives its logger a
``logging.NullHandler`` at import, and the application's logging configuration decides what is
shown (the window line is an INFO record; a failure said in one line is a WARNING). The
``stagefrontier`` command and the demo are applications: they call ``show_on_stderr`` (or its
context manager ``shown_on_stderr``) for the lines they print.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from .render.escape import printable

logger = logging.getLogger("stagefrontier")


class _OneLine(logging.Formatter):
    """The record's message kept on its line: it may quote names another rank sent."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


class _CurrentStderr(logging.Handler):
    """Writes each record to ``sys.stderr`` as it is at that moment (as logging's own last
    resort does), so a replaced ``sys.stderr`` is honoured."""

    def emit(self, record: logging.LogRecord) -> None:
        stream: TextIO = sys.stderr
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # a closed stderr: logging's own policy for a handler that fails
            self.handleError(record)


def show_on_stderr(level: int = logging.WARNING, fmt: str = "%(message)s") -> logging.Handler:
    """Show the ``stagefrontier`` logger's records at ``level`` and above on stderr, one line
    each; returns the handler (``stop_showing`` removes it). For applications, never called by
    the library itself."""
    handler = _CurrentStderr(level)
    handler.setFormatter(_OneLine(fmt))
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    return handler


def stop_showing(handler: logging.Handler) -> None:
    """Remove a handler ``show_on_stderr`` added."""
    logger.removeHandler(handler)


@contextmanager
def shown_on_stderr(level: int = logging.WARNING, fmt: str = "%(message)s") -> Iterator[None]:
    """``show_on_stderr`` for the duration of a block (the command line's one command)."""
    before = logger.level
    handler = show_on_stderr(level, fmt)
    try:
        yield
    finally:
        stop_showing(handler)
        logger.setLevel(before)
