"""What one side of ``stagefrontier compare`` names: an output folder, one packet, or a window
range of a folder (``DIR:3-7``, ``DIR:3-``, ``DIR:-7``, ``DIR:5``; both ends included).

A side is bounded: the windows it takes hold about :data:`SIDE_CELLS` steps x ranks x stages
at most, whatever the number of windows in its range. A range of more windows is compared on
whole windows evenly spaced over it (every k-th), said in one line. Which window a packet holds
is read from its file name, so only the packets compared are read.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..analysis.accounting import FloatArray
from ..analysis.compare import CompareError, Side
from .compacted import MissingPackets
from .packet import Packet, packet_key
from .records import WINDOWS_FILE, iter_records, record_key
from .run_folder import lean_packet, named, packet_matrix, read_named_packet
from .window_rows import packet_host_signals

_RANGE = re.compile(
    r"^(?P<path>.+?):(?:(?P<attempt>\d+)/)?(?P<first>\d*)(?:(?P<dash>-)(?P<last>\d*))?$"
)


Span = tuple[int | None, int | None, int | None]
"""A side's windows: (restart attempt, first window, last window), None for any."""

SIDE_CELLS = 1 << 20
"""About the most steps x ranks x stages one side of a comparison holds (8 MiB of durations):
a longer range is compared on every k-th window; a single window larger than this is taken
whole (``STAGEFRONTIER_MAX_CELLS`` bounds a window)."""


def load_side(spec: str, warn: Callable[[str], None] | None = None) -> Side:
    """The windows ``spec`` names, as one comparison side; raises StageFrontierError. The
    windows of a folder's ``windows.jsonl`` in the range that have no packet are left out,
    and a range sampled to :data:`SIDE_CELLS`, each said in one line to ``warn``. Of each
    packet only its matrix, stages, labels and host signals are kept."""
    path, attempt, first, last = parse_side(spec)
    if path.is_file():
        packet = read_named_packet(path)
        if not _in_range(packet, first, last) or attempt not in (None, _attempt(packet)):
            held = _span([_window(packet)])
            raise CompareError(f"{spec}: no window in that range (the folder has {held})")
        signals = packet.meta.get("host_signals") or {}
        chosen = [SideWindow(packet.d, packet.stages, packet.report.labels, signals)]
    elif path.is_dir():
        chosen = _folder_side(spec, path, (attempt, first, last), warn or _silent)
    elif path.exists():
        raise CompareError(f"{path} is neither a packet file nor an output folder")
    else:
        raise CompareError(f"{path} does not exist")
    if len({w.stages for w in chosen}) != 1:
        raise CompareError(f"{spec}: its windows use different stage schemas")
    return Side.from_windows(
        spec,
        [w.d for w in chosen],
        chosen[0].stages,
        [w.labels for w in chosen],
        [w.host_signals for w in chosen],
    )


class SideWindow(NamedTuple):
    """What a comparison reads of a window: its matrix, stages, labels and host signals."""

    d: FloatArray
    stages: tuple[str, ...]
    labels: list[str]
    host_signals: dict[str, Any]


def _silent(_: str) -> None:
    pass


def _folder_side(
    spec: str, path: Path, span: Span, warn: Callable[[str], None]
) -> list[SideWindow]:
    """The folder's windows in the range, in window order: every k-th one when they would
    hold more than :data:`SIDE_CELLS` cells (k from the first packet's size)."""
    files = packet_files(path / "packets")
    if not files:
        raise CompareError(
            f"{path} has no per-rank packets (packets/window-*.json): comparing needs the "
            "per-rank matrices, which a run collected hierarchically keeps on its nodes"
        )
    attempts = sorted({key[0] for key, _ in files})
    attempt, first, last = span
    if attempt is None and len(attempts) > 1 and (first is not None or last is not None):
        named = ", ".join(
            f"{spec.rpartition(':')[0]}:{a}/{spec.rpartition(':')[2]}" for a in attempts
        )
        raise CompareError(
            f"{spec}: the folder holds restart attempts {', '.join(map(str, attempts))}, "
            f"whose window indices repeat; name one: {named}"
        )
    in_range = [(key, file) for key, file in files if _inside(key, span)]
    if not in_range:
        held = _span([key[1] for key, _ in files if attempt in (None, key[0])])
        raise CompareError(f"{spec}: no window in that range (the folder has {held})")
    _say_packetless(spec, path, {key for key, _ in in_range}, span, warn)
    head = _side_window(in_range[0][1])
    stride = max(1, math.ceil(len(in_range) * head.d.size / SIDE_CELLS))
    picked = in_range[::stride]
    if stride > 1:
        warn(
            f"{spec}: its {len(in_range)} windows hold more than {SIDE_CELLS} steps x ranks x "
            f"stages, the most one side of a comparison holds; comparing one window "
            f"in {stride} ({len(picked)} windows, evenly spaced; name a narrower range "
            "DIR:FIRST-LAST to compare every window of it)"
        )
    return [head, *(_side_window(file) for _, file in picked[1:])]


def _side_window(file: Path) -> SideWindow:
    read = lean_packet(file)
    signals = named(file, packet_host_signals, read)
    return SideWindow(packet_matrix(file, read), tuple(read.stages), read.report.labels, signals)


def packet_files(folder: Path) -> list[tuple[tuple[int, int], Path]]:
    """A ``packets/`` folder's per-rank packets by (restart attempt, window), in that order,
    read from their names (``formats.packet.packet_name``); other files are left alone."""
    if not folder.is_dir():
        return []
    found = []
    for entry in os.scandir(folder):
        key = packet_key(entry.name)
        if key is not None:
            found.append((key, Path(entry.path)))
    return sorted(found)


def _say_packetless(
    spec: str, path: Path, held: set[tuple[int, int]], span: Span, warn: Callable[[str], None]
) -> None:
    records = path / WINDOWS_FILE
    if not records.exists():
        return
    missing = MissingPackets(path)
    for _, key in iter_records(records, record_key):
        order = (key.attempt, key.window)
        if _inside(order, span) and order not in held:
            missing.add(key.attempt, key.window)
    for line in missing.lines():
        warn(f"{spec}: {line}; the comparison leaves them out")


def parse_side(spec: str) -> tuple[Path, int | None, int | None, int | None]:
    """``(path, restart attempt, first window, last window)`` of ``DIR:[A/]FIRST-LAST``; a
    path that exists is taken whole."""
    if Path(spec).exists():
        return Path(spec), None, None, None
    match = _RANGE.match(spec)
    if not match or not (match["attempt"] or match["first"] or match["last"]):
        return Path(spec), None, None, None
    attempt = int(match["attempt"]) if match["attempt"] else None
    first = int(match["first"]) if match["first"] else None
    last = int(match["last"]) if match["last"] else (None if match["dash"] else first)
    if first is not None and last is not None and first > last:
        raise CompareError(f"{spec}: the range starts after it ends")
    return Path(match["path"]), attempt, first, last


def _window(packet: Packet) -> int:
    return int(packet.meta.get("window", 0))


def _attempt(packet: Packet) -> int:
    return int(packet.meta.get("attempt", 0))


def _inside(order: tuple[int, int], span: Span) -> bool:
    """Whether window (attempt, index) is in ``span`` (attempt, first, last; None: any)."""
    attempt, first, last = span
    window = order[1]
    return (
        attempt in (None, order[0])
        and (first is None or window >= first)
        and (last is None or window <= last)
    )


def _in_range(packet: Packet, first: int | None, last: int | None) -> bool:
    w = _window(packet)
    return (first is None or w >= first) and (last is None or w <= last)


def _span(indices: list[int]) -> str:
    ordered = sorted(set(indices))
    return f"windows {ordered[0]}-{ordered[-1]}" if ordered else "no windows"
