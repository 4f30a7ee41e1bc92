"""What one side of ``stagefrontier compare`` names: an output folder, one packet, or a window
range of a folder (``DIR:3-7``, ``DIR:3-``, ``DIR:-7``, ``DIR:5``; both ends included).

A side is bounded: the windows it takes hold at most ``STAGEFRONTIER_MAX_CELLS`` steps x ranks x
stages in all (the limit of one window, ``formats.limits``), so a comparison never holds more
than that many float64 durations per side, whatever the number of packets. A folder's packets
are read one at a time; those outside the range are dropped as soon as they are read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..analysis.compare import CompareError, Side
from .limits import LIMITS, limit
from .packet import Packet
from .records import WINDOWS_FILE, read_records
from .run_folder import packetless_line, read_named_packet, window_order, without_packet

_RANGE = re.compile(r"^(?P<path>.+?):(?P<first>\d*)(?:(?P<dash>-)(?P<last>\d*))?$")


def load_side(spec: str, warn: Callable[[str], None] | None = None) -> Side:
    """The packets ``spec`` names, as one comparison side; raises StageFrontierError. The
    windows of a folder's ``windows.jsonl`` in the range that have no packet are left out,
    said in one line to ``warn``."""
    path, first, last = parse_side(spec)
    if path.is_file():
        chosen = [read_named_packet(path)]
        held = _windows(chosen)
    elif path.is_dir():
        chosen, held = _folder_side(spec, path, first, last)
        if warn is not None:
            _say_packetless(spec, path, chosen, first, last, warn)
    elif path.exists():
        raise CompareError(f"{path} is neither a packet file nor an output folder")
    else:
        raise CompareError(f"{path} does not exist")
    chosen = [p for p in chosen if _in_range(p, first, last)]
    if not chosen:
        raise CompareError(f"{spec}: no window in that range (the folder has {held})")
    stages = {p.stages for p in chosen}
    if len(stages) != 1:
        raise CompareError(f"{spec}: its windows use different stage schemas")
    return Side.from_windows(
        spec, [p.d for p in chosen], chosen[0].stages, [p.report.labels for p in chosen]
    )


def _folder_side(
    spec: str, path: Path, first: int | None, last: int | None
) -> tuple[list[Packet], str]:
    """The folder's packets in the range, in window order, their cells summed against the
    bound as they are read; and which windows the folder holds (for a message)."""
    cap = limit("cells")
    chosen: list[Packet] = []
    indices: list[int] = []
    cells = 0
    for file in sorted((path / "packets").glob("window-*.json")):
        packet = read_named_packet(file)
        indices.append(_window(packet))
        if not _in_range(packet, first, last):
            continue
        cells += packet.d.size
        if cells > cap:
            raise CompareError(
                f"{spec}: its windows hold more than {cap} steps x ranks x stages in all, the "
                f"most one side of a comparison holds (set {LIMITS['cells'].env} to raise it, or "
                "compare a window range, DIR:FIRST-LAST)"
            )
        chosen.append(packet)
    if not indices:
        raise CompareError(
            f"{path} has no per-rank packets (packets/window-*.json): comparing needs the "
            "per-rank matrices, which a run collected hierarchically keeps on its nodes"
        )
    chosen.sort(key=lambda p: window_order(p.meta))
    return chosen, _span(indices)


def _say_packetless(
    spec: str,
    path: Path,
    chosen: list[Packet],
    first: int | None,
    last: int | None,
    warn: Callable[[str], None],
) -> None:
    records = path / WINDOWS_FILE
    if not chosen or not records.exists():
        return
    missing = [
        record
        for record in without_packet(read_records(records), chosen)
        if (first is None or record["window"] >= first)
        and (last is None or record["window"] <= last)
    ]
    if missing:
        warn(f"{spec}: {packetless_line(missing)}; the comparison leaves them out")


def parse_side(spec: str) -> tuple[Path, int | None, int | None]:
    """``(path, first window, last window)``; a path that exists is taken whole."""
    if Path(spec).exists():
        return Path(spec), None, None
    match = _RANGE.match(spec)
    if not match or not (match["first"] or match["last"]):
        return Path(spec), None, None
    first = int(match["first"]) if match["first"] else None
    last = int(match["last"]) if match["last"] else (None if match["dash"] else first)
    if first is not None and last is not None and first > last:
        raise CompareError(f"{spec}: the range starts after it ends")
    return Path(match["path"]), first, last


def _window(packet: Packet) -> int:
    return int(packet.meta.get("window", 0))


def _in_range(packet: Packet, first: int | None, last: int | None) -> bool:
    w = _window(packet)
    return (first is None or w >= first) and (last is None or w <= last)


def _windows(packets: list[Packet]) -> str:
    return _span([_window(p) for p in packets])


def _span(indices: list[int]) -> str:
    ordered = sorted(set(indices))
    return f"windows {ordered[0]}-{ordered[-1]}" if ordered else "no windows"
