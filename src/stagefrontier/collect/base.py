"""The collector interface the recorder hands windows to, and the shared analysis worker."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

from ..window import RankWindow

logger = logging.getLogger("stagefrontier")


class Collector(Protocol):
    """Receives this rank's completed windows. ``submit`` is called on the training thread and
    must return at once: True when the window was queued, False when it was dropped."""

    rank: int
    world_size: int

    def submit(self, window: RankWindow) -> bool: ...

    def close(self) -> None: ...


_STOP = object()


class BackgroundWorker:
    """One daemon thread fed by a bounded queue; the training thread only ever calls ``offer``."""

    def __init__(self, name: str, handle: object, queue_size: int, join_timeout_s: float) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, queue_size))
        self._handle = handle
        self._join_timeout_s = join_timeout_s
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, item: object) -> bool:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                self._handle(item)  # type: ignore[operator]
            except Exception:  # a telemetry failure is logged, never raised into training
                logger.exception("stagefrontier: background window processing failed")

    def close(self) -> None:
        """Let queued work finish, waiting at most ``join_timeout_s`` in total."""
        try:
            self._queue.put(_STOP, timeout=self._join_timeout_s)
        except queue.Full:
            logger.warning("stagefrontier: analysis queue still full at close; not waiting")
            return
        self._thread.join(self._join_timeout_s)
        if self._thread.is_alive():
            logger.warning(
                "stagefrontier: analysis still running after %.1f s at close; leaving it",
                self._join_timeout_s,
            )
