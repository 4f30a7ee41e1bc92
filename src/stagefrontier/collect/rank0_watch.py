"""A sending rank's watch on rank 0: its windows are kept on local disk once rank 0 is gone.

Rank 0 publishes how many windows it has finished (the store's done counter, ``store_keys``);
every sender reads it with each window it sends. When rank 0 dies with the store still up (it
was killed, the store lives in the launcher's agent), the counter stops while the other ranks
train on and their windows pile up in a store nobody reads. A sender whose windows run
``SILENT_WINDOWS`` ahead of a counter that has not moved for twice its collection timeout and
``SILENT_MARGIN_S`` more (under hierarchical collection one timeout more for each tree level
the watched collector heads, as it waits that much longer for its children's parts; counted
once rank 0 has begun collecting: it claims the store's keys as it gathers its first window;
a rank 0 slow to start is not gone) says so once, stops
sending, takes back its windows rank 0 never collected (those still in the store: at most
``MAX_UNCOLLECTED``) and analyzes them and every later window itself, writing them under
``out_dir/rank-<r>/`` (``windows.jsonl`` and packets, as a one-rank run).

Under hierarchical collection (``collect.hierarchical``) a node's leader watches the counter
the same way as it sends its node's part up, and keeps every window of its node, each rank's in
its own folder; a member whose node store fails (its leader died) keeps its own. Neither can
read back what it sent (a part is condensed; the node store is gone), so each holds its windows
(``RecentWindows``) until the collector's counter passes them.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
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
"""What a stopped counter must last beyond the watched collector's longest wait for a window
(``level_wait_s`` of its top level) and one collection timeout more."""


class Rank0Watch:
    """Told by a sender, after each window it sent, how many windows rank 0 has finished."""

    def __init__(
        self, rank: int, out_dir: str | os.PathLike[str], timeout_s: float, levels: int = 0
    ) -> None:
        """``levels``: the node tree levels the watched collector heads (0 when flat); it
        waits one collect timeout more for each before it finishes a window
        (``node_tree.level_wait_s``)."""
        self.rank = rank
        self.out_dir = Path(out_dir)
        self.silent_after_s = (levels + 2) * timeout_s + SILENT_MARGIN_S
        self._done = -1
        self._since = time.monotonic()
        self.collecting = False
        """Whether rank 0 was seen collecting (its claim on the keys): until then its counter's
        standstill is a slow start, not a death. A rank 0 that dies before it gathers its first
        window is never judged gone."""
        self.gone = False
        """Whether this rank keeps its windows itself (rank 0, or its node's leader, is gone)."""
        self._kept: dict[int, LocalCollector] = {}
        """A collector per rank whose windows this rank keeps: its own, and under hierarchical
        collection a node leader's members'."""

    @property
    def done(self) -> int:
        """Rank 0's done counter as last read (-1 before the first read)."""
        return self._done

    def silent(self, window: int, done: int) -> bool:
        """Whether rank 0, having finished ``done`` windows when this rank sent ``window``,
        is gone."""
        now = time.monotonic()
        if done != self._done or not self.collecting:
            self._done, self._since = done, now
        return window - done >= SILENT_WINDOWS and now - self._since > self.silent_after_s

    def take_over(self, kept: list[RankWindow], why: str = "", whose: str = "its own") -> None:
        """Say once that rank 0 is gone (or ``why`` this rank keeps its windows), then analyze
        and write ``kept`` (windows rank 0 never collected) and every later window here, each
        rank's under ``out_dir/rank-<r>/`` (``whose``: whose windows those are, for the line)."""
        if self.gone:
            return
        first = kept[0].window if kept else self._done
        freed = (
            f" (windows {self._done}-{first - 1} were freed unread: a sender keeps at most "
            f"{MAX_UNCOLLECTED} in the store)"
            if first > self._done >= 0
            else ""
        )
        if not why:
            why = (
                f"rank 0 has collected no window for {time.monotonic() - self._since:.0f} s (it "
                f"finished {self._done} window(s); it may have died)"
            )
        logger.warning(
            "stagefrontier: rank %d: %s; this rank stops sending and keeps %s windows in %s, "
            "from window %d on%s",
            self.rank,
            why,
            whose,
            self.out_dir / (f"rank-{self.rank}" if whose == "its own" else "rank-<r>"),
            max(first, 0),
            freed,
        )
        self.gone = True
        for window in kept:
            self.keep(window)

    def keep(self, window: RankWindow) -> None:
        """Once rank 0 is gone: analyze and write ``window`` here, under its rank's folder."""
        if not self.gone:
            return
        local = self._kept.get(window.rank)
        if local is None:
            folder = self.out_dir / f"rank-{window.rank}"
            local = self._kept[window.rank] = LocalCollector(
                out_dir=folder,
                queue_size=MAX_UNCOLLECTED + 1,
                sinks=[JsonlSink(folder), PacketSink(folder)],
                regression=None,
            )
        local.submit(window)

    def close(self) -> None:
        for local in self._kept.values():
            local.close()


class RecentWindows:
    """Windows a rank (or a node's leader) passed on that its collector has not finished yet,
    so they can be kept here if the collector is gone (at most ``MAX_UNCOLLECTED`` windows)."""

    def __init__(self) -> None:
        self._held: deque[list[RankWindow]] = deque(maxlen=MAX_UNCOLLECTED)

    def add(self, windows: list[RankWindow]) -> None:
        """One window index's windows (one rank's, or every rank's of a node)."""
        if windows:
            self._held.append(windows)

    def passed(self, done: int) -> None:
        """The collector finished the windows before ``done``: they are no longer held."""
        while self._held and self._held[0][0].window < done:
            self._held.popleft()

    def held(self) -> list[RankWindow]:
        """Every window held, oldest first."""
        return [window for windows in self._held for window in windows]
