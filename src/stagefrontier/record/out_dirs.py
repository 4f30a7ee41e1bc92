"""One open timer per output folder in a process: two timers writing one ``out_dir`` would
interleave their ``windows.jsonl``, packets and incidents, so the second is refused when built.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from ..errors import TimerSettingError


class Writer(Protocol):
    """What is held per folder: the timer writing there, and whether it is closed yet."""

    out_dir: str
    _closed: bool


_HELD: dict[str, weakref.ref[Writer]] = {}
"""The out_dir of every open timer of this process that builds its own collector."""


def hold_out_dir(writer: Writer) -> str:
    """Hold ``writer.out_dir`` for it and return the folder's real path (for ``release``), or
    raise TimerSettingError when another open timer of this process writes there."""
    path = os.path.realpath(writer.out_dir)
    holder = _HELD.get(path)
    other = holder() if holder is not None else None
    if other is not None and not other._closed:
        raise TimerSettingError(
            f"out_dir {writer.out_dir!r} is written by another StageTimer of this process (open "
            "and not closed): give each timer its own out_dir"
        )
    _HELD[path] = weakref.ref(writer)
    return path


def release_out_dir(path: str) -> None:
    """The timer that held ``path`` closed: another may write there now."""
    _HELD.pop(path, None)
