"""A run folder's windows by (attempt, window), held as machine integers rather than Python
objects, so that a read-back of 100,000 windows keeps a few bytes per window where a set of
packet names or a list of key tuples kept a few hundred (``formats.run_folder``).

``PacketIndex``: the packets of ``packets/``, 8 bytes and a flag per packet. ``WindowKeys``:
every window read, 16 bytes per window, and the windows missing between the first and last of
each attempt, counted over the sorted keys.
"""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np

from .packet import packet_key, packet_name

_ATTEMPT_BITS = 32
"""A key is ``attempt << 32 | window``; a name whose numbers do not fit stays a name."""


class PacketIndex:
    """The per-rank packets of a ``packets/`` folder (``window-*.json``): each named as
    ``formats.packet.packet_name`` names it as a sorted key, any other as its name. ``take``
    tells whether a window has a packet and marks it taken; ``left`` lists the packets no
    window took, in order."""

    def __init__(self, folder: Path) -> None:
        keys, self._others = array("q"), list[str]()
        self.count = 0
        if folder.is_dir():
            for entry in os.scandir(folder):
                name = entry.name
                if not (name.startswith("window-") and name.endswith(".json")):
                    continue
                self.count += 1
                key = _key(packet_key(name))
                if key is None or packet_name(_facts(key)) != name:
                    self._others.append(name)
                else:
                    keys.append(key)
        self._keys = np.sort(np.frombuffer(keys, dtype=np.int64)) if keys else np.empty(0, "q")
        self._taken = bytearray(len(self._keys))

    def take(self, attempt: int, window: int) -> str | None:
        """The packet name of the window when the folder holds it (marked taken), else None."""
        key = _key((attempt, window))
        if key is None:
            return None
        at = int(np.searchsorted(self._keys, key))
        if at == len(self._keys) or self._keys[at] != key:
            return None
        self._taken[at] = 1
        return packet_name(_facts(key))

    def left(self) -> list[str]:
        """The names of the packets no window took, sorted."""
        untaken = np.flatnonzero(np.frombuffer(self._taken, dtype=np.uint8) == 0)
        return sorted([packet_name(_facts(int(self._keys[i]))) for i in untaken] + self._others)


class WindowKeys:
    """The (attempt, window) of every window read, in two arrays of machine integers."""

    def __init__(self) -> None:
        self.attempts, self.windows = array("q"), array("q")

    def add(self, attempt: int, window: int) -> None:
        self.attempts.append(attempt)
        self.windows.append(window)

    def lost_line(self) -> str:
        """A line naming the windows missing between the first and last of each restart
        attempt (neither a record nor a packet: lost on a full disk, or dropped by rank 0), or
        ``""``. The gaps are counted from the sorted keys, never by walking the index range."""
        if not self.windows:
            return ""
        attempts = np.frombuffer(self.attempts, dtype=np.int64)
        windows = np.frombuffer(self.windows, dtype=np.int64)
        order = np.lexsort((windows, attempts))
        attempts, windows = attempts[order], windows[order]
        same = attempts[1:] == attempts[:-1]
        step = windows[1:] - windows[:-1]
        gaps = np.flatnonzero(same & (step > 1))
        count = int((step[gaps] - 1).sum())
        if not count:
            return ""
        named: list[str] = []
        for at in gaps:
            attempt, before, after = int(attempts[at]), int(windows[at]), int(windows[at + 1])
            for window in range(before + 1, min(after, before + 1 + 10 - len(named))):
                named.append(f"{attempt}/{window}" if attempt else str(window))
            if len(named) >= 10:
                break
        more = f" and {count - len(named)} more" if count > len(named) else ""
        return (
            f"{count} window(s) are missing, neither in windows.jsonl nor in packets/ "
            f"({', '.join(named)}{more}: lost on a full disk, or dropped by rank 0)"
        )


def _key(order: tuple[int, int] | None) -> int | None:
    if order is None:
        return None
    attempt, window = order
    if not (0 <= attempt < 1 << 31 and 0 <= window < 1 << _ATTEMPT_BITS):
        return None
    return attempt << _ATTEMPT_BITS | window


def _facts(key: int) -> dict[str, int]:
    return {"attempt": key >> _ATTEMPT_BITS, "window": key & ((1 << _ATTEMPT_BITS) - 1)}
