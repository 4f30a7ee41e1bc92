"""The one deadline of a timer's ``close()``, and work run under it.

``StageTimer.close()`` returns within ``CLOSE_DEADLINE_S`` on every rank (or the seconds
``STAGEFRONTIER_CLOSE_DEADLINE_S`` gives, read at each close), whatever its sinks, its store,
its peers or its router do, counted from the call: the collector's close (its last windows, the
sinks' own close: a last OTLP export, a file's flush) runs on a thread of its own until a third
of the deadline is left (``router_close_s``), and the router's thread gets what is left (when
the collector closed early, more than its third). Work still running at its bound
is left to its daemon thread, said in one line; nothing of it reaches the caller. The same
holds while a PyTorch profiler runs at close (the application's own, its Python tracer on, or a
capture still running): a thread started and ended under the profiler's Python tracer is safe
in the torch this project supports (``tests/test_close_deadline.py`` and ``tests/test_sigterm.py``
run such closes in real processes).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from .environment import CLOSE_DEADLINE, close_deadline_text
from .failures import say_failed

CLOSE_DEADLINE_S = 30.0
"""The longest ``StageTimer.close()`` takes on any rank, unless ``DEADLINE_VARIABLE`` sets it."""
ROUTER_CLOSE_S = 10.0
"""The part of the default deadline left to the router's thread (its last export, rank 0's
settle): a third."""
FINISH_S = 0.25
"""The end of the deadline the last wait leaves to close()'s own last steps (a waiting thread's
wake-up on a loaded machine, a warning line): the router's thread is waited for until then."""
DEADLINE_VARIABLE = CLOSE_DEADLINE.name
"""The environment variable that sets the close deadline in seconds, from ``DEADLINE_RANGE``."""
DEADLINE_RANGE = (1.0, 3600.0)

_said_invalid: set[str] = set()


def close_deadline_s(log: logging.Logger) -> float:
    """The close deadline: ``DEADLINE_VARIABLE``'s seconds when it holds a number in
    ``DEADLINE_RANGE``, else ``CLOSE_DEADLINE_S`` (another value is said once)."""
    text = close_deadline_text()
    if not text:
        return CLOSE_DEADLINE_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low, high = DEADLINE_RANGE
    if low <= value <= high:
        return value
    if text not in _said_invalid:
        _said_invalid.add(text)
        log.warning(
            "stagefrontier: %s=%.40r is not a number of seconds in [%g, %g]; the close "
            "deadline stays %.0f s",
            DEADLINE_VARIABLE,
            text,
            low,
            high,
            CLOSE_DEADLINE_S,
        )
    return CLOSE_DEADLINE_S


def router_close_s(deadline_s: float) -> float:
    """The router thread's part of a close deadline of ``deadline_s``."""
    return deadline_s * ROUTER_CLOSE_S / CLOSE_DEADLINE_S


def call_within(
    call: Callable[[], None],
    seconds: float,
    what: str,
    log: logging.Logger,
    deadline_s: float = CLOSE_DEADLINE_S,
) -> bool:
    """Run ``call`` on a daemon thread and wait at most ``seconds`` for it (its part of the close
    deadline ``deadline_s``); True when it ended. A failure of ``call`` is said in one line;
    past the bound, one line says what is left.

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
        "stagefrontier: %s still ran %.3g s into close(), its bound of the %.3g s close "
        "deadline; the timer returns without it (a last window or export may be missing)",
        what,
        seconds,
        deadline_s,
    )
    return False
