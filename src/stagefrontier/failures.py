"""A failure inside the library said in one line: what failed, why, and what the run does
instead (its downgrade).

Telemetry never raises into training and never puts a traceback in the user's log. Each place
that catches a failure, on the training thread or on a background thread (the collector, the
sinks, the router's threads, the relay, a trace's export), says it here: one WARNING line with
the exception's type and message, flattened and bounded. The traceback goes to DEBUG, for
whoever turns that level on. A failure that can repeat at every poll or window is said once per
place and kind of exception by the object that keeps the ``said`` set; its repeats go to DEBUG.
"""

from __future__ import annotations

import logging

MAX_REASON_CHARS = 300
"""How much of an exception's message the line keeps."""


def reason(exc: BaseException) -> str:
    """``ValueError: the message`` on one line, at most ``MAX_REASON_CHARS`` of the message."""
    text = " ".join(str(exc).split()) or "no message"
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def say_failed(
    logger: logging.Logger,
    doing: str,
    exc: BaseException,
    then: str,
    said: set[tuple[str, str]] | None = None,
) -> None:
    """Log ``stagefrontier: <doing> failed (<reason>); <then>`` at WARNING, the traceback at
    DEBUG. With ``said`` (the caller's own set, touched by one thread), a repeat of the same
    ``doing`` and exception type is DEBUG only."""
    line = f"stagefrontier: {doing} failed ({reason(exc)}); {then}"
    if said is not None:
        key = (doing, type(exc).__name__)
        if key in said:
            logger.debug("%s", line)
            return
        said.add(key)
    logger.warning("%s", line)
    logger.debug("stagefrontier: %s failed", doing, exc_info=exc)
