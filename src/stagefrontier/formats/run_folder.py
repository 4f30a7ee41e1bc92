"""A whole output folder (a demo's or a real job's): its analyzed windows, and the stage shares
of StageFrontier next to the five rank-local baselines on each window (``render.text`` prints
them as the run report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import baselines
from ..analysis.accounting import FloatArray
from ..errors import ReportFormatError, StageFrontierError
from .limits import LIMITS, limit
from .packet import Packet, read_packet
from .records import WINDOWS_FILE, read_records, window_name
from .summary_packet import read_summary_packet

PACKET_CELLS = 4096
"""What one packet counts for against ``STAGEFRONTIER_MAX_CELLS`` besides its durations: its
report and facts take about 22 kB in memory, as much as this many float64 cells do."""


@dataclass(frozen=True)
class RunWindows:
    """The analyzed windows of one output folder, in (restart attempt, window) order, and one
    line per packet that could not be read and was left out (``problems``). ``packetless``:
    the records of windows whose packet is missing while others have one (a packet not
    written, on a full disk say); they are reported from their record."""

    folder: Path
    packets: list[Packet]
    records: list[dict[str, Any]]
    problems: tuple[str, ...] = ()
    packetless: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stages(self) -> list[str]:
        return list(self.packets[0].stages) if self.packets else list(self.records[0]["stages"])

    def by_schema(self) -> list[RunWindows]:
        """The windows split by stage list, in order of first appearance: a run whose
        accumulation factor changed mid-run holds windows of different stages, which are
        reported and plotted apart."""
        keys = [tuple(p.stages) for p in self.packets] + [tuple(r["stages"]) for r in self.records]
        return [
            RunWindows(
                self.folder,
                [p for p in self.packets if tuple(p.stages) == key],
                [r for r in self.records if tuple(r["stages"]) == key],
                packetless=[r for r in self.packetless if tuple(r["stages"]) == key],
            )
            for key in dict.fromkeys(keys)
        ]


def load_run(folder: str | Path) -> RunWindows:
    """Read ``windows.jsonl`` and ``packets/`` from a folder. The per-rank packets are read one
    at a time and held to ``STAGEFRONTIER_MAX_CELLS`` cells in all (each packet counting
    ``PACKET_CELLS`` more for its report); a hierarchical run's summary packets are checked,
    and one that cannot be read is left out with a line in ``problems``.

    Raises:
        StageFrontierError: the folder does not exist or holds neither, or its packets hold
            more than the cell bound.
        ReportFormatError: a per-rank packet or a record is corrupt, naming its file (and line).
    """
    path = Path(folder)
    if not path.exists():
        raise StageFrontierError(f"{path} does not exist")
    if not path.is_dir():
        raise StageFrontierError(f"{path} is not a folder")
    packets = sorted(_bounded_packets(path), key=lambda packet: window_order(packet.meta))
    problems = _unreadable_summaries(path)
    jsonl = path / WINDOWS_FILE
    records = read_records(jsonl) if jsonl.exists() else []
    if not packets and not records:
        raise StageFrontierError(f"{path} holds no windows.jsonl and no packets/")
    lost = lost_windows(
        [window_order(p.meta) for p in packets] + [window_order(r) for r in records]
    )
    if lost:
        problems.append(f"{path}: {lost}")
    packetless = without_packet(records, packets)
    if packetless:
        problems.append(
            f"{path}: {packetless_line(packetless)}; the report shows them from windows.jsonl, "
            "the stage shares next to the baselines and the figures leave them out"
        )
    return RunWindows(path, packets, records, tuple(problems), packetless)


def without_packet(records: list[dict[str, Any]], packets: list[Packet]) -> list[dict[str, Any]]:
    """The records whose window has no per-rank packet, when some window has one (a run
    collected hierarchically writes none, and says so itself)."""
    if not packets:
        return []
    held = {window_order(packet.meta) for packet in packets}
    return [record for record in records if window_order(record) not in held]


def lost_windows(held: list[tuple[int, int]]) -> str:
    """A line naming the windows missing between the first and last of each restart attempt
    (neither a record nor a packet: lost on a full disk, or dropped by rank 0), or ``""``.
    The gaps are counted from the windows held, never by walking the index range."""
    by_attempt: dict[int, set[int]] = {}
    for attempt, window in held:
        by_attempt.setdefault(attempt, set()).add(window)
    count, named = 0, list[str]()
    for attempt, windows in sorted(by_attempt.items()):
        ordered = sorted(windows)
        for before, after in pairwise(ordered):
            count += after - before - 1
            for window in range(before + 1, min(after, before + 1 + 10 - len(named))):
                named.append(f"{attempt}/{window}" if attempt else str(window))
    if not count:
        return ""
    more = f" and {count - len(named)} more" if count > len(named) else ""
    return (
        f"{count} window(s) are missing, neither in windows.jsonl nor in packets/ "
        f"({', '.join(named)}{more}: lost on a full disk, or dropped by rank 0)"
    )


def packetless_line(records: list[dict[str, Any]]) -> str:
    """``window(s) 3, 7 have no packet (...)``, naming at most ten."""
    names = [window_name(record) for record in records[:10]]
    more = f" and {len(records) - 10} more" if len(records) > 10 else ""
    return (
        f"{len(records)} window(s) of windows.jsonl have no packet ({', '.join(names)}{more}: "
        "not written, on a full disk say)"
    )


def _bounded_packets(path: Path) -> list[Packet]:
    cap = limit("cells")
    held = 0
    packets: list[Packet] = []
    for file in sorted((path / "packets").glob("window-*.json")):
        packet = read_named_packet(file)
        held += packet.d.size + PACKET_CELLS
        if held > cap:
            raise StageFrontierError(
                f"{path}: its packets hold more than {cap} steps x ranks x stages in all (a "
                f"packet counts {PACKET_CELLS} more for its report), the most a report or a "
                f"figure reads (set {LIMITS['cells'].env} to raise it)"
            )
        packets.append(packet)
    return packets


def _unreadable_summaries(path: Path) -> list[str]:
    """One line per summary packet that cannot be read (each is read and dropped: the report
    of a hierarchical run comes from ``windows.jsonl``)."""
    problems = []
    for file in sorted((path / "packets").glob("summary-*.json")):
        try:
            read_summary_packet(file)
        except ReportFormatError as exc:
            problems.append(f"skipped {file}: {exc}")
    return problems


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


def method_shares(packet: Packet) -> dict[str, FloatArray]:
    """Stage shares of one window under StageFrontier and every baseline."""
    report = packet.report
    out = {"stagefrontier": np.array([report.shares[s] for s in report.stages])}
    for name, rule in baselines.BASELINES.items():
        out[name] = rule(packet.d)
    return out
