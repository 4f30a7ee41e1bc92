"""A sending rank's watch on rank 0: its windows are kept on local disk once rank 0 is gone.

Rank 0 publishes how many windows it has finished (the store's done counter, ``store_keys``);
every sender reads it with each window it sends. When rank 0 dies with the store still up (it
was killed, the store lives in the launcher's agent), the counter stops while the other ranks
train on and their windows pile up in a store nobody reads. A sender whose windows run
``SILENT_WINDOWS`` ahead of a counter that has not moved for twice its collection timeout and
``SILENT_MARGIN_S`` more (counted once rank 0 has begun collecting: it claims the store's keys
as it gathers its first window; a rank 0 slow to start is not gone) says so once, stops
sending, takes back its windows rank 0 never collected (those still in the store: at most
``MAX_UNCOLLECTED``) and analyzes them and every later window itself, writing them under
``out_dir/rank-<r>/`` (``windows.jsonl`` and packets, as a one-rank run).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from ..sinks import JsonlSink, PacketSink
from ..window.rank import RankWindow
from .local import LocalCollector
from .store_keys import MAX_UNCOLLECTED

logger = logging.getLogger("stagefrontier")

SILENT_WINDOWS = 3
"""How many windows a sender runs ahead of rank 0's done counter before it may judge rank 0
gone (rank 0 may lag a window or two behind a live job)."""
SILENT_MARGIN_S = 5.0
"""What a stopped counter must last beyond twice the collection timeout."""


class Rank0Watch:
    """Told by a sender, after each window it sent, how many windows rank 0 has finished."""

    def __init__(self, rank: int, out_dir: str | os.PathLike[str], timeout_s: float) -> None:
        self.rank = rank
        self.folder = Path(out_dir) / f"rank-{rank}"
        self.silent_after_s = 2 * timeout_s + SILENT_MARGIN_S
        self._done = -1
        self._since = time.monotonic()
        self.collecting = False
        """Whether rank 0 was seen collecting (its claim on the keys): until then its counter's
        standstill is a slow start, not a death. A rank 0 that dies before it gathers its first
        window is never judged gone."""
        self.local: LocalCollector | None = None
        """This rank's own collector once rank 0 is judged gone."""

    @property
    def gone(self) -> bool:
        return self.local is not None

    def silent(self, window: int, done: int) -> bool:
        """Whether rank 0, having finished ``done`` windows when this rank sent ``window``,
        is gone."""
        now = time.monotonic()
        if done != self._done or not self.collecting:
            self._done, self._since = done, now
        return window - done >= SILENT_WINDOWS and now - self._since > self.silent_after_s

    def take_over(self, kept: list[RankWindow]) -> None:
        """Say once that rank 0 is gone, then analyze and write ``kept`` (this rank's windows
        rank 0 never collected, still in the store) and every later window here."""
        first = kept[0].window if kept else self._done
        freed = (
            f" (windows {self._done}-{first - 1} were freed unread: a sender keeps at most "
            f"{MAX_UNCOLLECTED} in the store)"
            if first > self._done
            else ""
        )
        logger.warning(
            "stagefrontier: rank %d: rank 0 has collected no window for %.0f s (it finished %d "
            "window(s); it may have died); this rank stops sending and keeps its own windows "
            "in %s, from window %d on%s",
            self.rank,
            time.monotonic() - self._since,
            self._done,
            self.folder,
            first,
            freed,
        )
        self.local = LocalCollector(
            out_dir=self.folder,
            queue_size=MAX_UNCOLLECTED + 1,
            sinks=[JsonlSink(self.folder), PacketSink(self.folder)],
            regression=None,
        )
        for window in kept:
            self.local.submit(window)

    def keep(self, window: RankWindow) -> None:
        """Once rank 0 is gone: analyze and write ``window`` here."""
        if self.local is not None:
            self.local.submit(window)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
