"""The one deadline of a timer's ``close()``, and work run under it.

``StageTimer.close()`` returns within ``CLOSE_DEADLINE_S`` on every rank, whatever its sinks,
its store, its peers or its router do: the collector's close (its last windows, the sinks' own
close: a last OTLP export, a file's flush) gets ``CLOSE_DEADLINE_S - ROUTER_CLOSE_S`` on a
thread of its own, and the router's thread ``ROUTER_CLOSE_S``. Work still running at its bound
is left to its daemon thread, said in one line; nothing of it reaches the caller. While the
PyTorch profiler runs, the recorder closes its collector on the calling thread instead (a thread
started under the profiler's Python tracer crashed it): unbounded then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .failures import say_failed

CLOSE_DEADLINE_S = 30.0
"""The longest ``StageTimer.close()`` takes on any rank."""
ROUTER_CLOSE_S = 10.0
"""The part of the deadline left to the router's thread (its last export, rank 0's settle)."""


def call_within(call: Callable[[], None], seconds: float, what: str, log: logging.Logger) -> bool:
    """Run ``call`` on a daemon thread and wait at most ``seconds`` for it; True when it ended.
    A failure of ``call`` is said in one line; past the bound, one line says what is left.

    The wait is a join, not a signal from ``call``'s end: the thread drops its reference to
    ``call`` (and what it holds: the timer, the user's model) before it ends, so a thread that
    finished in time never frees them later, while the interpreter shuts down."""

    def run() -> None:
        try:
            call()
        except Exception as exc:  # telemetry never fails the caller
            say_failed(log, what, exc, "the timer closes without it")

    thread = threading.Thread(target=run, name="stagefrontier-close", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if not thread.is_alive():
        return True
    log.warning(
        "stagefrontier: %s still ran %.0f s into close(), its bound of the %.0f s close "
        "deadline; the timer returns without it (a last window or export may be missing)",
        what,
        seconds,
        CLOSE_DEADLINE_S,
    )
    return False
