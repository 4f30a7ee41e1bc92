"""Where analyzed windows go: ``windows.jsonl`` and one log line per window by default."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .report import WindowReport
from .window import MergedWindow, window_record

logger = logging.getLogger("stagefrontier")


class Sink(Protocol):
    def write(self, record: dict[str, Any], report: WindowReport) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per window to ``out_dir/windows.jsonl``."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.path = Path(out_dir) / "windows.jsonl"
        self._file: Any = None

    def write(self, record: dict[str, Any], report: WindowReport) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class LogSink:
    """One concise line per window on the ``stagefrontier`` logger."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level

    def write(self, record: dict[str, Any], report: WindowReport) -> None:
        logger.log(self.level, "%s", summary_line(record, report))

    def close(self) -> None:
        return None


def summary_line(record: dict[str, Any], report: WindowReport) -> str:
    """``window 3 steps 300-399 | exposed 212.4 ms/step ... | top ... led by rank 2@host ...``"""
    head = f"window {record['window']} steps {record['first_step']}-{record['last_step']}"
    line = report.summary()
    lead = report.leaders.get(report.top1) if report.top1 else None
    host = record.get("hosts", {}).get(str(lead)) if lead is not None else None
    if host:
        line = line.replace(f"led by rank {lead}", f"led by rank {lead}@{host}", 1)
    if not record.get("gather_ok", True):
        line += f" | missing ranks {record.get('missing_ranks')}"
    return f"{head} | {line}"


def default_sinks(out_dir: str | os.PathLike[str]) -> list[Sink]:
    return [JsonlSink(out_dir), LogSink()]


def emit(sinks: Sequence[Sink], merged: MergedWindow, report: WindowReport) -> None:
    """Write one analyzed window to every sink; a failing sink does not stop the others."""
    record = window_record(merged, report)
    for sink in sinks:
        try:
            sink.write(record, report)
        except Exception:
            logger.exception("stagefrontier: sink %s failed", type(sink).__name__)
