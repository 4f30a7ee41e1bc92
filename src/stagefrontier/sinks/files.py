"""The sinks that write files under the output folder: ``windows.jsonl`` and evidence packets."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..window.merged import AnalyzedWindow


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


class PacketSink:
    """Writes one evidence packet per window to ``out_dir/packets/``: ``window-<i>.json``
    (``formats.packet``), or ``summary-<i>.json`` (``formats.summary_packet``) for a window
    analyzed from node summaries."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.folder = Path(out_dir) / "packets"
        self._swept = False

    def write(self, window: AnalyzedWindow) -> None:
        from ..formats.packet import Packet, packet_name, remove_temporaries, write_packet

        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._swept:  # before this run's first packet: an earlier run's leftovers
            self._swept = True
            remove_temporaries(self.folder, ".*.tmp")
        meta = {k: v for k, v in window.record.items() if k in PACKET_META}
        if window.summary is not None:  # hierarchical: the node summaries, not rank columns
            from ..formats.summary_packet import SummaryPacket, write_summary_packet

            name = "summary-" + packet_name(window.record).removeprefix("window-")
            packet = SummaryPacket.of_summary(
                window.summary, window.report, side=window.side, meta=meta
            )
            write_summary_packet(self.folder / name, packet)
            return
        full = Packet.of_window(
            window.d,
            window.report,
            roles=window.roles,
            side=window.side,
            meta=meta,
        )
        write_packet(self.folder / packet_name(window.record), full)

    def close(self) -> None:
        return None


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
    "regression",
    "gain_reference_windows",
    "paused_steps",
    "self_cost",
    "nodes",
    "n_ranks_present",
    "loader_workers",
    "block_lead",
)
