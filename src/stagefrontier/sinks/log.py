"""The log sink: one concise line per window on the ``stagefrontier`` logger."""

from __future__ import annotations

import logging
from typing import Any

from ..analysis.window_report import WindowReport
from ..render.text import window_line
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")


class LogSink:
    """One concise line per window on the ``stagefrontier`` logger (shown where the
    application's logging configuration sends its INFO records, see ``stagefrontier.logs``)."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level

    def write(self, window: AnalyzedWindow) -> None:
        logger.log(self.level, "%s", summary_line(window.record, window.report))

    def close(self) -> None:
        return None


def summary_line(record: dict[str, Any], report: WindowReport) -> str:
    """``window 3 steps 300-399 | exposed 212.4 ms/step ... | top ... led by rank 2@host ...``"""
    return window_line(report, record)
