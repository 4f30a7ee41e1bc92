"""The log sink: a short headline per window on the ``stagefrontier`` logger, and at DEBUG a
second line with everything else the window says."""

from __future__ import annotations

import logging
from typing import Any

from ..analysis.window_report import WindowReport
from ..render.headline import Headlines, window_headline
from ..render.text import window_details
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")


class LogSink:
    """One headline per window on the ``stagefrontier`` logger (shown where the application's
    logging configuration sends its INFO records, see ``stagefrontier.logs``): ``window 3
    steps 60-79 | exposed ... | top ... led by rank 2 | Next: ...``, or ``same as window 2``
    when it says what the window before it said. The details line follows at DEBUG."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level
        self.headlines = Headlines()

    def write(self, window: AnalyzedWindow) -> None:
        logger.log(self.level, "%s", self.headlines.line(window.report, window.record))
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s", window_details(window.report, window.record))

    def close(self) -> None:
        return None


def summary_line(record: dict[str, Any], report: WindowReport) -> str:
    """A window's headline on its own (no ``same as`` against earlier windows):
    ``window 3 steps 300-399 | exposed 212.4 ms/step | top ... led by rank 2 | Next: ...``."""
    return window_headline(report, record)
