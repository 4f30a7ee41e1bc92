"""Rank 0's window line on stderr when the application configured no logging.

The line is an INFO record of the ``stagefrontier`` logger. Python shows nothing below WARNING
until logging is configured, so when the first line is written and neither that logger nor the
root logger has a handler, a stderr handler is added to the ``stagefrontier`` logger (and its
level set to INFO if it had none). Once the application gives the root logger a handler, the
added one removes itself and the application's configuration decides alone: no line is ever
written twice. Nothing happens at import.
"""

from __future__ import annotations

import logging
import threading

from .render.escape import printable

logger = logging.getLogger("stagefrontier")

_lock = threading.Lock()
_installed: _UntilConfigured | None = None


class _Prefixed(logging.Formatter):
    """``stagefrontier: <message>``, without doubling a prefix the message has already."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if text.startswith("stagefrontier") else f"stagefrontier: {text}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        # The message may quote names another rank sent: keep it on its line (a traceback,
        # added after this, keeps its own lines).
        return printable(super().formatMessage(record))


class _FallbackHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The stderr handler; ``set_level``: whether the logger's level was NOTSET and set to INFO
    when it was added."""

    def __init__(self, set_level: bool) -> None:
        super().__init__()
        self.set_level = set_level
        self.setFormatter(_Prefixed("%(message)s"))


class _UntilConfigured(logging.Filter):
    """The logger's filter that goes with the handler: while no other handler would show the
    logger's records it passes every record; once the application adds one (to the root logger
    or to this one), it retires the handler (and itself) and passes only what the
    application's levels let through."""

    def __init__(self, handler: _FallbackHandler) -> None:
        super().__init__()
        self.handler = handler

    def filter(self, record: logging.LogRecord) -> bool:
        if not logging.root.handlers and logger.handlers == [self.handler]:
            return True
        _retire()
        return logger.isEnabledFor(record.levelno)


def show_window_lines() -> None:
    """Make the ``stagefrontier`` logger's INFO lines visible if nothing else would show them
    (called before each window line; cheap when a handler exists)."""
    global _installed
    if _installed is not None or logger.hasHandlers():
        return
    with _lock:
        if _installed is not None or logger.hasHandlers():
            return
        handler = _FallbackHandler(set_level=logger.level == logging.NOTSET)
        if handler.set_level:
            logger.setLevel(logging.INFO)
        _installed = _UntilConfigured(handler)
        logger.addHandler(handler)
        logger.addFilter(_installed)


def _retire() -> None:
    global _installed
    with _lock:
        installed, _installed = _installed, None
        if installed is None:
            return
        logger.removeFilter(installed)
        logger.removeHandler(installed.handler)
        if installed.handler.set_level and logger.level == logging.INFO:
            logger.setLevel(logging.NOTSET)
