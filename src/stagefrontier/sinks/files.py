"""The sinks that write files under the output folder: ``windows.jsonl`` and evidence packets."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..window.merged import AnalyzedWindow
from .output_folder import shared_folder


class JsonlSink:
    """Appends one JSON object per window to ``out_dir/windows.jsonl``.

    A record is whole on disk or absent. A write that fails part way (a full disk) leaves the
    bytes it wrote; before the next record goes on, the file is cut back to the end of the last
    whole record, so a disk that filled and was freed again does not leave a torn record run into
    the next one. A file that an earlier run left ending mid-record is cut back the same way when
    it is opened.

    Each record carries the window's attempt in the folder, and the folder is held to its disk
    budget (``sinks.output_folder``; ``disk_budget_bytes``, else
    ``STAGEFRONTIER_DISK_BUDGET_MB``), which may rewrite the file with old records cut down
    to their summary (``sinks.record_compaction``): the next record goes to the new file.
    """

    def __init__(
        self, out_dir: str | os.PathLike[str], disk_budget_bytes: int | None = None
    ) -> None:
        self.path = Path(out_dir) / "windows.jsonl"
        self.folder = shared_folder(out_dir, disk_budget_bytes)
        self._fd: int | None = None
        self._cut_at: int | None = None
        """Where the record a failed write left cut short begins."""
        self._rewrites = 0
        """The disk budget's rewrites of the file when it was opened."""

    def write(self, window: AnalyzedWindow) -> None:
        record = self.folder.stamp(window)
        data = (json.dumps(record, allow_nan=False) + "\n").encode("utf-8")
        if self._fd is not None and self._rewrites != self.folder.budget.records_rewrites:
            os.close(self._fd)  # the budget renamed a rewritten file into place: append there
            self._fd = None
        if self._fd is None:
            self._rewrites = self.folder.budget.records_rewrites
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
            self._cut_at = _whole_records_end(self._fd)
        if self._cut_at is not None and os.fstat(self._fd).st_size > self._cut_at:
            os.ftruncate(self._fd, self._cut_at)
        self._cut_at = os.fstat(self._fd).st_size
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self._cut_at = None  # whole: a write that raised left it at the record's start
        self.folder.written(record, self.path, len(data))

    def close(self) -> None:
        self.folder.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _whole_records_end(fd: int) -> int:
    """The offset just past the last newline of the file open at ``fd`` (0 when none): where
    its whole records end."""
    size = os.fstat(fd).st_size
    position = size
    while position > 0:
        start = max(0, position - 65536)
        chunk = os.pread(fd, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        position = start
    return 0


class PacketSink:
    """Writes one evidence packet per window to ``out_dir/packets/``: ``window-<i>.json``
    (``formats.packet``), or ``summary-<i>.json`` (``formats.summary_packet``) for a window
    analyzed from node summaries; each named by its attempt in the folder, and the packets of
    older windows deleted past the folder's disk budget (``sinks.disk_budget``)."""

    def __init__(
        self, out_dir: str | os.PathLike[str], disk_budget_bytes: int | None = None
    ) -> None:
        self.folder = Path(out_dir) / "packets"
        self.output = shared_folder(out_dir, disk_budget_bytes)
        self._swept = False

    def write(self, window: AnalyzedWindow) -> None:
        from ..formats.packet import Packet, packet_name, remove_temporaries, write_packet

        self.folder.mkdir(parents=True, exist_ok=True)
        if not self._swept:  # before this run's first packet: an earlier run's leftovers
            self._swept = True
            remove_temporaries(self.folder, ".*.tmp")
        record = self.output.stamp(window)
        meta = {k: v for k, v in record.items() if k in PACKET_META}
        if window.summary is not None:  # hierarchical: the node summaries, not rank columns
            from ..formats.summary_packet import SummaryPacket, write_summary_packet

            path = self.folder / ("summary-" + packet_name(record).removeprefix("window-"))
            packet = SummaryPacket.of_summary(
                window.summary, window.report, side=window.side, meta=meta
            )
            write_summary_packet(path, packet)
        else:
            full = Packet.of_window(
                window.d,
                window.report,
                roles=window.roles,
                side=window.side,
                meta=meta,
            )
            path = write_packet(self.folder / packet_name(record), full)
        self.output.written(record, path, path.stat().st_size)

    def close(self) -> None:
        self.output.close()


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
    "lead_below_top",
    "wall_clock",
    "host_signals",
)
