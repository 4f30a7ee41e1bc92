"""SIGTERM closes every open timer before the process ends (``STAGEFRONTIER_SIGTERM=1``).

A launcher ends a job's processes with SIGTERM: torchrun when a rank fails, Slurm at the time
limit, a scheduler's preemption. The signal's default action ends the process at once, and the
steps of the window being recorded, the windows queued for analysis and rank 0's sinks go with
it. With ``STAGEFRONTIER_SIGTERM=1``, the first enabled timer built on the main thread, in a
process that still has that default, installs a handler that closes every open timer (each
``close()`` bounded by its deadline, ``deadline.CLOSE_DEADLINE_S``) and then ends the process by
the signal as before, so its exit status is still the signal's; a second SIGTERM during that
close ends it at once. A handler the application installed is left alone. A process forked
from the one that installed it (a DataLoader worker) ends at once, as by default. It is off by
default: with the handler installed, a rank running a profiler capture under the profiler's
Python tracer (which captures no longer run: ``route.stack_sampler``) was seen to crash (SIGSEGV)
in this project's tests, cause not found.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Any

from ..environment import closes_on_sigterm

logger = logging.getLogger("stagefrontier")

_open: weakref.WeakSet[Any] = weakref.WeakSet()
_installed_in: int | None = None
"""The process that installed the handler."""


def close_on_sigterm(timer: Any) -> None:
    """Have ``timer`` (anything with ``close()``) closed by a SIGTERM while it is open."""
    global _installed_in
    _open.add(timer)
    if _installed_in is not None or not closes_on_sigterm():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or no such signal here
        return
    _installed_in = os.getpid()


def closed(timer: Any) -> None:
    """``timer`` closed: a SIGTERM no longer needs to close it."""
    _open.discard(timer)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if os.getpid() == _installed_in:
        timers = list(_open)
        if timers:
            logger.info("stagefrontier: SIGTERM: closing %d open timer(s) first", len(timers))
        for timer in timers:
            try:
                timer.close()
            except Exception as exc:  # the process ends by the signal whatever happens here
                logger.debug("stagefrontier: closing a timer on SIGTERM failed: %s", exc)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
