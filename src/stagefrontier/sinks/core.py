"""Where analyzed windows go: ``windows.jsonl`` and one log line per window by default."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from ..analysis.window_report import WindowReport
from ..logs import show_window_lines
from ..record.window import AnalyzedWindow
from ..render.text import window_line

logger = logging.getLogger("stagefrontier")


class Sink(Protocol):
    """Receives every analyzed window on the analysis thread; must not block for long."""

    def write(self, window: AnalyzedWindow) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per window to ``out_dir/windows.jsonl``."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.path = Path(out_dir) / "windows.jsonl"
        self._file: Any = None

    def write(self, window: AnalyzedWindow) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(window.record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class LogSink:
    """One concise line per window on the ``stagefrontier`` logger (on stderr when the
    application configured no logging, see ``stagefrontier.logs``)."""

    def __init__(self, level: int = logging.INFO) -> None:
        self.level = level

    def write(self, window: AnalyzedWindow) -> None:
        show_window_lines()
        logger.log(self.level, "%s", summary_line(window.record, window.report))

    def close(self) -> None:
        return None


def summary_line(record: dict[str, Any], report: WindowReport) -> str:
    """``window 3 steps 300-399 | exposed 212.4 ms/step ... | top ... led by rank 2@host ...``"""
    return window_line(report, record)


class PacketSink:
    """Writes one evidence packet per window to ``out_dir/packets/``."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.folder = Path(out_dir) / "packets"

    def write(self, window: AnalyzedWindow) -> None:
        from ..formats.packet import Packet, write_packet

        self.folder.mkdir(parents=True, exist_ok=True)
        packet = Packet.of_window(
            window.d,
            window.report,
            roles=window.roles,
            side=window.side,
            meta={k: v for k, v in window.record.items() if k in PACKET_META},
        )
        write_packet(self.folder / packet_name(window.record), packet)

    def close(self) -> None:
        return None


def packet_name(record: dict[str, Any]) -> str:
    """``window-000003.json``; a restarted job's attempt k writes ``window-000003.attempt-k.json``
    instead of overwriting the first attempt's packet of the same window index."""
    attempt = record.get("attempt", 0)
    suffix = f".attempt-{attempt}" if attempt else ""
    return f"window-{record['window']:06d}{suffix}.json"


PACKET_META = (
    "run_id",
    "attempt",
    "window",
    "first_step",
    "last_step",
    "world_size",
    "ranks_present",
    "gather_ok",
    "missing_ranks",
    "mismatched_ranks",
    "hosts",
    "local_ranks",
    "pids",
    "lead",
    "accumulation_factor",
    "contract_violations",
)


def default_sinks(
    out_dir: str | os.PathLike[str], packets: bool = False, log: bool = True
) -> list[Sink]:
    """JSONL and (unless ``log`` is False) the log line; with ``packets``, an evidence packet
    per window too."""
    sinks: list[Sink] = [JsonlSink(out_dir)]
    if log:
        sinks.append(LogSink())
    if packets:
        sinks.append(PacketSink(out_dir))
    return sinks


def emit(sinks: Sequence[Sink], window: AnalyzedWindow) -> None:
    """Write one analyzed window to every sink; a failing sink does not stop the others."""
    for sink in sinks:
        try:
            sink.write(window)
        except Exception:
            logger.exception("stagefrontier: sink %s failed", type(sink).__name__)
