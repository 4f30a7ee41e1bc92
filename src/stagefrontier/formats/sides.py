"""What one side of ``stagefrontier compare`` names: an output folder, one packet, or a window
range of a folder (``DIR:3-7``, ``DIR:3-``, ``DIR:-7``, ``DIR:5``; both ends included)."""

from __future__ import annotations

import re
from pathlib import Path

from ..analysis.compare import CompareError, Side
from .packet import Packet, read_packet
from .run_folder import load_run

_RANGE = re.compile(r"^(?P<path>.+?):(?P<first>\d*)(?:(?P<dash>-)(?P<last>\d*))?$")


def load_side(spec: str) -> Side:
    """The packets ``spec`` names, as one comparison side; raises StageFrontierError."""
    path, first, last = parse_side(spec)
    if path.is_file():
        packets = [read_packet(path)]
    elif path.is_dir():
        packets = load_run(path).packets
        if not packets:
            raise CompareError(
                f"{path} has no per-rank packets (packets/window-*.json): comparing needs the "
                "per-rank matrices, which a run collected hierarchically keeps on its nodes"
            )
    else:
        raise CompareError(f"{path} does not exist")
    chosen = [p for p in packets if _in_range(p, first, last)]
    if not chosen:
        raise CompareError(f"{spec}: no window in that range (the folder has {_windows(packets)})")
    stages = {p.stages for p in chosen}
    if len(stages) != 1:
        raise CompareError(f"{spec}: its windows use different stage schemas")
    return Side.from_windows(
        spec, [p.d for p in chosen], chosen[0].stages, [p.report.labels for p in chosen]
    )


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
    indices = sorted({_window(p) for p in packets})
    return f"windows {indices[0]}-{indices[-1]}" if indices else "no windows"
