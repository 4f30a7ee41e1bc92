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
replaces it, and the application's own then decides.

Where the close runs. Python runs a signal handler on the main thread between two bytecodes of
whatever it was doing: inside one of the timer's contexts, inside the router's capture while it
starts or stops the profiler, or holding a lock that the close needs. The close does not run
there. It runs on a thread of this module's, started with the handler (before any profiler
session, so no thread starts in the handler or under the profiler), while the handler waits for
it, bounded: the interrupted code does not run beside it, and a lock it held costs at most the
deadline, never a hang. The interrupted code may have stopped halfway through handing a window
off (``TimerState._hand_off``, flagged while it runs): the close then says that window is lost
rather than write a half-copied or repeated one. A capture running then is dropped with a
reason and its profiler session left to end with the process (a session is the training
thread's to stop; this thread never touches the profiler). The handler itself only sets an
event and waits on it.

A main thread inside one C call. Python's handler runs only once the main thread is back in
bytecode, and a training thread waiting in a collective for a dead peer, a CUDA sync or a C
lock may never be: SIGTERM would then do nothing until the launcher's SIGKILL. So the handler
also takes the signal wakeup fd (``signal.set_wakeup_fd``: the C-level handler writes each
signal's number to it at once, on whatever thread) when no one else holds it, and a watcher
thread reads it. On SIGTERM it gives the main thread ``MAIN_THREAD_GRACE_S`` to begin the
handler; when it has not, the watcher asks for the close itself, waits for it (bounded), and,
where SIGTERM's action before was the default one, sets that action back at the C level
(Python's ``signal.signal`` works on the main thread only) and sends the signal again: the
process ends by SIGTERM within the close deadline and a second, as without the handler. A
handler the application installed before is Python's and runs on the main thread only: then the
watcher only closes the timers, and that handler runs when the main thread returns, as it would
without ours. When another holder has the wakeup fd (asyncio's signal handlers), the watcher is
not started and such a process waits for its main thread, as before; one that takes the fd
later takes it over the same way.

A forked child (a DataLoader worker, ``mp.start_processes`` with fork, Lightning's
``ddp_fork``) gets SIGTERM's action back as it was before the handler, gives up the wakeup fd,
and forgets the parent's timers: the parent's watcher never hears the child's signals, a
worker hung in C ends on ``terminate()``, and a timer the child builds installs the handler
anew for the child's own timers.
"""

from __future__ import annotations

import ctypes
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
MAIN_THREAD_GRACE_S = 0.25
"""How long the watcher leaves the main thread to begin the handler before it closes itself."""

_open: weakref.WeakSet[Any] = weakref.WeakSet()
"""Every open timer of this process (each has ``_close(process_ends)``)."""
_installed: _Handler | None = None


class _Handler:
    """The installed handler: the closing thread, the watcher, what the signal passes on to."""

    def __init__(self, before: Callable[[int, FrameType | None], Any] | int) -> None:
        self.pid = os.getpid()
        self.before = before
        self.asked = threading.Event()
        self.done = threading.Event()
        self.entered = threading.Event()  # the main thread began the handler
        self.wakeup: tuple[int, int] | None = None  # the pipe the watcher reads, when it runs
        self.thread = threading.Thread(target=self._run, name="stagefrontier-sigterm", daemon=True)
        self.thread.start()

    def watch(self) -> None:
        """Installed: take the wakeup fd, when free, and start the watcher reading it."""
        self.wakeup = _take_wakeup_fd()
        if self.wakeup is not None:
            watcher = threading.Thread(
                target=self._watch, args=(self.wakeup[0],), name="stagefrontier-sigterm-watch"
            )
            watcher.daemon = True
            watcher.start()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid or self.entered.is_set():  # not ours, or a second SIGTERM
            self._pass_on(signum, frame)
            return
        self.entered.set()
        self._close_bounded()
        self._pass_on(signum, frame)

    def _close_bounded(self) -> None:
        """Ask the closing thread to close every open timer and wait for it, bounded."""
        timers = len(_open)
        self.asked.set()
        self.done.wait(max(timers, 1) * close_deadline_s(logger) + WAIT_MARGIN_S)

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

    def _watch(self, fd: int) -> None:
        """Wake on SIGTERM's byte; close and end the process if the main thread is in C."""
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:  # the fd was closed: the handler was given up
                return
            if not data:
                return
            if signal.SIGTERM in data and self._is_installed():
                break
        if self.entered.wait(MAIN_THREAD_GRACE_S):
            return  # the main thread runs the handler: it closes and passes the signal on
        logger.info("stagefrontier: SIGTERM while the main thread is inside a C call")
        self._close_bounded()
        if self.before == signal.SIG_DFL and not self.entered.is_set():
            _end_by_default_action(signal.SIGTERM)

    def _is_installed(self) -> bool:
        """Whether SIGTERM's Python handler is still this one (none installed after it)."""
        current: object = signal.getsignal(signal.SIGTERM)
        return current is self

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        """What SIGTERM did before this handler: the default action, or the handler found."""
        before = self.before
        if callable(before):
            before(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def give_up_in_child(self) -> None:
        """In a forked child: SIGTERM's action and the wakeup fd back as they were before."""
        try:
            if self._is_installed():
                signal.signal(signal.SIGTERM, self.before)
            if self.wakeup is not None:
                held = signal.set_wakeup_fd(-1)
                if held != self.wakeup[1]:  # another took it after us: theirs stays
                    signal.set_wakeup_fd(held)
                for fd in self.wakeup:
                    os.close(fd)
        except (ValueError, OSError) as exc:  # never fail the fork
            logger.debug("stagefrontier: restoring SIGTERM in a forked child failed: %s", exc)


def _take_wakeup_fd() -> tuple[int, int] | None:
    """A pipe whose write end is the signal wakeup fd, or None when another holds that fd."""
    try:
        read_fd, write_fd = os.pipe()
    except OSError:  # out of file descriptors: the main thread's handler alone, as before
        return None
    try:
        os.set_blocking(write_fd, False)
        held = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if held == -1:
            return read_fd, write_fd
        signal.set_wakeup_fd(held)  # another's: left to it
    except (ValueError, OSError):
        pass
    os.close(read_fd)
    os.close(write_fd)
    return None


def _end_by_default_action(signum: int) -> None:
    """Set ``signum``'s default action at the C level (from any thread) and send it again."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signum, None)  # NULL is SIG_DFL
    except (OSError, AttributeError) as exc:  # no C library to call: the main thread decides
        logger.debug("stagefrontier: setting SIGTERM's default action failed: %s", exc)
        return
    os.kill(os.getpid(), signum)


def _forget_in_child() -> None:
    """After a fork, in the child: the parent's handler and timers are not the child's."""
    global _installed
    handler, _installed = _installed, None
    _open.clear()
    if handler is not None:
        handler.give_up_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


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
    handler.watch()


def closed(timer: Any) -> None:
    """``timer`` closed: a SIGTERM no longer needs to close it."""
    _open.discard(timer)
