"""A whole output folder (a demo's or a real job's), read one window at a time: the windows a
report shows in full, and the rest summarized (``formats.run_digest``), so that a run of any
length is read in memory that does not grow with its windows and in time linear in them.

Each ``windows.jsonl`` line is decoded into its lean row (``formats.window_rows``) and each
packet's matrix is decoded once, for the worst step and (a bounded sample of them) the stage
shares of the five rank-local baselines; ``render.text``, ``render.run_html`` and
``render.plots`` draw the report from what is kept.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.window_report import WindowReport
from ..errors import ReportFormatError, StageFrontierError
from .compacted import MissingPackets, summarized_line
from .limits import read_capped
from .packet import Packet, decode_array, read_packet
from .records import WINDOWS_FILE, iter_records, lean, record_report, whole_record
from .run_digest import COMPARED, Bucket, MethodShares, SchemaDigest, Source, Tallies
from .summary_packet import read_summary_packet
from .window_keys import PacketIndex, WindowKeys
from .window_rows import WindowRow, decode_lean_packet, decode_row, packet_row

PACKET_GLOB = "window-*.json"


@dataclass(frozen=True)
class Slowed:
    """The windows the profiler router slowed (their facts and ms/step, at most
    ``run_digest.MAX_FLAGGED``), and the median ms/step of the others (None when none)."""

    windows: list[tuple[dict[str, Any], float]]
    typical_ms: float | None


@dataclass(frozen=True)
class RunWindows:
    """The windows of one output folder with one stage list, in run order.

    ``windows``: those shown in full (every window of a run of at most ``run_digest.SHOWN_ALL``;
    else the first, the last, the last full one, the costliest and the flagged ones), each as
    its report and its record (or its packet's ``meta``); ``count``: how many there are in all;
    ``tallies``: counts over every window; ``buckets``: every window summarized (empty when
    every window is shown); ``flagged``: the flagged windows of a summarized run,
    ``flagged_over`` those beyond the number kept; ``methods``: the comparison with the
    baselines (None without packets); ``worst``: the packet holding the worst step (None
    without packets), ``worst_slowed`` whether the profiler router slowed every packet's
    window; ``slowed``: the windows it slowed; ``captured``: the packets of the steps an
    incident captured; ``problems``: one line per window lost or packet that could not be
    read; ``packetless``: the line naming windows of ``windows.jsonl`` with no packet, or
    ``""``; ``schemas``: every stage list's windows, when the stage list changed mid-run
    (``by_schema``)."""

    folder: Path
    stages: list[str]
    windows: list[tuple[WindowReport, dict[str, Any]]]
    count: int
    tallies: Tallies
    buckets: list[Bucket] = field(default_factory=list)
    flagged: int = 0
    flagged_over: int = 0
    methods: MethodShares | None = None
    worst: Packet | None = None
    worst_slowed: bool = False
    slowed: Slowed = Slowed([], None)
    captured: list[Packet] = field(default_factory=list)
    problems: tuple[str, ...] = ()
    packetless: str = ""
    schemas: tuple[RunWindows, ...] = ()

    @property
    def summarized(self) -> bool:
        """Whether some windows are counted in ``buckets`` rather than shown one by one."""
        return bool(self.buckets)

    def by_schema(self) -> list[RunWindows]:
        """The windows split by stage list, in order of first appearance: a run whose
        accumulation factor changed mid-run holds windows of different stages, which are
        reported and plotted apart."""
        return list(self.schemas) or [self]


def load_run(folder: str | Path) -> RunWindows:
    """Read ``windows.jsonl`` and ``packets/`` from a folder, one window at a time; a
    hierarchical run's summary packets are checked, and one that cannot be read is left out
    with a line in ``problems``.

    Raises:
        StageFrontierError: the folder does not exist or holds neither.
        ReportFormatError: a per-rank packet or a record is corrupt, naming its file (and line).
    """
    path = Path(folder)
    if not path.exists():
        raise StageFrontierError(f"{path} does not exist")
    if not path.is_dir():
        raise StageFrontierError(f"{path} is not a folder")
    return _RunReader(path).read()


class _RunReader:
    """One pass over a folder's windows: its records in file order, each with its packet, then
    the packets that have no record."""

    def __init__(self, path: Path) -> None:
        from .incident import list_incidents

        self.path = path
        self.jsonl = path / WINDOWS_FILE
        self.packets = PacketIndex(path / "packets")
        self.total = max(_line_count(self.jsonl), self.packets.count)
        self.stride = max(1, math.ceil(self.packets.count / COMPARED))
        self.captured = [
            (int(i["steps"][0]), int(i["steps"][1]))
            for i in list_incidents(path)
            if i["captured"] and i["steps"]
        ]
        self.digests: dict[tuple[str, ...], SchemaDigest] = {}
        self.keys = WindowKeys()
        self.missing = MissingPackets(path)
        self.packets_read = 0

    def read(self) -> RunWindows:
        had_packets = bool(self.packets.count) or bool(self.missing.compacted)
        position = 0
        if self.jsonl.exists():
            for label, (row, line) in iter_records(self.jsonl, _row_and_line):
                name = self.packets.take(row.attempt, row.window)
                packet = None if name is None else self.path / "packets" / name
                if packet is None and had_packets:
                    self.missing.add(row.attempt, row.window)
                self._add(row, Source(position, label, line=line), packet, None)
                position += 1
        for name in self.packets.left():
            file = self.path / "packets" / name
            read = lean_packet(file)
            row = named(file, packet_row, read)
            self._add(row, Source(position, str(file), packet=file), file, read)
            position += 1
        if not self.digests:
            raise StageFrontierError(f"{self.path} holds no windows.jsonl and no packets/")
        return self._result()

    def _add(self, row: WindowRow, source: Source, packet: Path | None, read: Any) -> None:
        """Count one window; ``read``: its packet's ``LeanPacket`` when already read."""
        key = tuple(row.stages)
        if key not in self.digests:
            cut = bool(self.missing.compacted.records_cut)
            self.digests[key] = SchemaDigest(list(key), self.total, self.captured, cut)
        digest = self.digests[key]
        self.keys.add(row.attempt, row.window)
        slowed = digest.add(row, source)
        if packet is not None:
            read = read if read is not None else lean_packet(packet)
            if read.stages != row.stages:
                raise ReportFormatError(f"{packet}: its stages are not its window's record's")
            d = packet_matrix(packet, read)
            digest.add_packet(row, d, packet, slowed, self.packets_read % self.stride == 0)
            self.packets_read += 1

    def _result(self) -> RunWindows:
        problems = _unreadable_summaries(self.path)
        lost = self.keys.lost_line()
        if lost:
            problems.append(f"{self.path}: {lost}")
        lines = self.missing.lines()
        for line in lines:
            problems.append(
                f"{self.path}: {line}; the report shows them from windows.jsonl, "
                "the stage shares next to the baselines and the figures leave them out"
            )
        cut = [digest.tallies for digest in self.digests.values() if digest.tallies.cut]
        if cut:
            windows = sorted(w for tallies in cut for w in tallies.cut_windows)[:10]
            count = sum(tallies.cut for tallies in cut)
            problems.append(f"{self.path}: {summarized_line(windows, count)}")
        packetless = "; ".join(lines)
        runs = tuple(self._schema_run(digest, packetless) for digest in self.digests.values())
        return replace(runs[0], problems=tuple(problems), schemas=runs if len(runs) > 1 else ())

    def _schema_run(self, digest: SchemaDigest, packetless: str) -> RunWindows:
        worst = digest.worst if digest.worst.path is not None else digest.worst_slowed
        others = digest.others_ms
        typical = sorted(others)[len(others) // 2] if others else None
        return RunWindows(
            folder=self.path,
            stages=digest.stages,
            windows=[_read_source(source) for source in digest.kept()],
            count=digest.tallies.windows,
            tallies=digest.tallies,
            buckets=digest.bucket_list(),
            flagged=len(digest.flagged) + digest.flagged_over,
            flagged_over=digest.flagged_over,
            methods=digest.methods if digest.methods.compared else None,
            worst=None if worst.path is None else read_named_packet(worst.path),
            worst_slowed=worst is digest.worst_slowed and bool(digest.slowed),
            slowed=Slowed(digest.slowed, typical),
            captured=[read_named_packet(p) for p in digest.captured_packets],
            packetless=packetless,
        )


def _row_and_line(line: bytes, label: str) -> tuple[WindowRow, bytes]:
    return lean(decode_row, line, label), line


def _read_source(source: Source) -> tuple[WindowReport, dict[str, Any]]:
    """A window kept in full: its record checked whole, or its packet read whole."""
    if source.line is not None:
        record = whole_record(source.line, source.label)
        return record_report(record, source.label), record
    assert source.packet is not None
    packet = read_named_packet(source.packet)
    return packet.report, packet.meta


def lean_packet(file: Path) -> Any:
    """A packet's matrix and stages (``LeanPacket``); one it refuses is read whole, so that
    the refusal names what ``read_packet`` names."""
    try:
        return named(file, decode_lean_packet, read_capped(file, "packet_bytes"))
    except ReportFormatError:
        read_named_packet(file)
        raise


def packet_matrix(file: Path, read: Any) -> Any:
    """A packet's duration matrix: one value per stage on its last axis, finite and not
    negative (the checks ``analysis.accounting.as_window`` makes that its worst step needs)."""
    d = named(file, lambda obj: decode_array(obj, "d", ndim=3), read.d)
    with np.errstate(over="ignore", invalid="ignore"):
        fine = d.size and np.isfinite(d.sum()) and d.min() >= 0
    if d.shape[2] != len(read.stages) or not fine:
        raise ReportFormatError(
            f"{file}: its matrix of shape {list(d.shape)} is empty, has other than one column "
            f"per stage ({len(read.stages)}), or holds a negative or non-finite duration"
        )
    return d


def named(file: Path, decode: Any, data: Any) -> Any:
    """``decode(data)``, a ReportFormatError it raises prefixed with ``file``."""
    try:
        return decode(data)
    except ReportFormatError as exc:
        raise ReportFormatError(f"{file}: {exc}") from None


def _line_count(path: Path) -> int:
    """The lines of a file (0 when absent), counted a megabyte at a time."""
    if not path.is_file():
        return 0
    count = 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            count += chunk.count(b"\n")
    return count


def _unreadable_summaries(path: Path) -> list[str]:
    """One line per summary packet that cannot be read (each is read and dropped: the report
    of a hierarchical run comes from ``windows.jsonl``)."""
    folder = path / "packets"
    if not folder.is_dir():
        return []
    problems = []
    with os.scandir(folder) as entries:  # one entry at a time: a glob lists the whole folder
        for entry in entries:
            if not (entry.name.startswith("summary-") and entry.name.endswith(".json")):
                continue
            file = folder / entry.name
            try:
                read_summary_packet(file)
            except ReportFormatError as exc:
                problems.append((entry.name, f"skipped {file}: {exc}"))
    return [problem for _, problem in sorted(problems)]


def read_named_packet(path: Path) -> Packet:
    """A packet file, its defects named with its path (ReportFormatError)."""
    try:
        return read_packet(path)
    except ReportFormatError as exc:
        raise ReportFormatError(f"{path}: {exc}") from None


def window_order(meta: dict[str, Any]) -> tuple[int, int]:
    """Where a packet sorts in its run: (restart attempt, window)."""
    return _index(meta, "attempt"), _index(meta, "window")


def _index(meta: dict[str, Any], key: str) -> int:
    """A packet's window or attempt for ordering (a packet's meta is free-form: 0 if not an
    int)."""
    value = meta.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
