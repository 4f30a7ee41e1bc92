"""SIGTERM closes every open timer before the process ends (unless ``STAGEFRONTIER_SIGTERM=0``).

A launcher ends a job's processes with SIGTERM: torchrun when a rank fails, Slurm at the time
limit, a scheduler's preemption. The signal's default action ends the process at once, and the
steps of the window being recorded, the windows queued for analysis and rank 0's sinks go with
it. So the first enabled timer built on the main thread installs a handler that closes every
open timer (each ``close()`` bounded by its deadline, ``deadline.CLOSE_DEADLINE_S``) and then
passes the signal on to what was there before: the default action ends the process by the
signal, so its exit status is still the signal's; a handler the application (or a framework)
installed before is called next; an ignored SIGTERM stays ignored (nothing is installed then).
A second SIGTERM during the close passes the signal on at once. A handler installed after ours
replaces it, and the application's own then decides. A process forked from the one that
installed it (a DataLoader worker) passes the signal on at once.

Where the close runs. Python runs a signal handler on the main thread between two bytecodes of
whatever it was doing: inside one of the timer's contexts, inside the router's capture while it
starts or stops the profiler, or holding a lock that the close needs. The close does not run
there. It runs on a thread of this module's, started with the handler (before any profiler
session, so no thread starts in the handler or under the profiler), while the handler waits for
it, bounded: the interrupted code never runs beside it, and a lock it held costs at most the
deadline, never a hang. A capture running then is dropped with a reason and its profiler
session left to end with the process (a session is the training thread's to stop; this thread
never touches the profiler). The handler itself only sets an event and waits on it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..deadline import close_deadline_s
from ..environment import closes_on_sigterm

logger = logging.getLogger("stagefrontier")

WAIT_MARGIN_S = 1.0
"""What the handler waits beyond the timers' close deadlines for the closing thread."""

_open: weakref.WeakSet[Any] = weakref.WeakSet()
"""Every open timer of this process (each has ``_close(process_ends)``)."""
_installed: _Handler | None = None


class _Handler:
    """The installed handler: the closing thread, and what the signal passes on to."""

    def __init__(self, before: Callable[[int, FrameType | None], Any] | int) -> None:
        self.pid = os.getpid()
        self.before = before
        self.asked = threading.Event()
        self.done = threading.Event()
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="stagefrontier-sigterm", daemon=True)
        self.thread.start()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid or self.closing:  # a forked worker, or a second SIGTERM
            self._pass_on(signum, frame)
            return
        self.closing = True
        timers = len(_open)
        self.asked.set()
        self.done.wait(max(timers, 1) * close_deadline_s(logger) + WAIT_MARGIN_S)
        self._pass_on(signum, frame)

    def _run(self) -> None:
        self.asked.wait()
        timers = list(_open)
        if timers:
            logger.info("stagefrontier: SIGTERM: closing %d open timer(s) first", len(timers))
        for timer in timers:
            try:
                timer._close(process_ends=True)
            except Exception as exc:  # the process ends by the signal whatever happens here
                logger.debug("stagefrontier: closing a timer on SIGTERM failed: %s", exc)
        self.done.set()

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        """What SIGTERM did before this handler: the default action, or the handler found."""
        before = self.before
        if callable(before):
            before(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def close_on_sigterm(timer: Any) -> None:
    """Have ``timer`` (a ``StageTimer``) closed by a SIGTERM while it is open."""
    global _installed
    _open.add(timer)
    if _installed is not None or not closes_on_sigterm():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        before = signal.getsignal(signal.SIGTERM)
        if before is None or before is signal.SIG_IGN:  # set outside Python, or ignored
            return
        handler = _Handler(before)
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # not the main interpreter, or no such signal here
        return
    _installed = handler


def closed(timer: Any) -> None:
    """``timer`` closed: a SIGTERM no longer needs to close it."""
    _open.discard(timer)
