"""How long the training thread waited for a CPU: its run-queue wait, read per window.

Linux keeps, per thread, the time it was runnable but not running (the second field of
``/proc/<pid>/task/<tid>/schedstat``, in nanoseconds). A rank that reaches a collective late
because the machine gave it no CPU (other ranks or other jobs on its cores) shows it there; a
rank late because its own code slept or computed longer does not: sleeping is not runnable, and
computing is running. The late-rank rule (``analysis.collectives``) discounts the part of a
rank's lateness its extra run-queue wait explains.

One read per window, on the training thread at the hand-off, from a file descriptor opened on
that thread (a ``schedstat`` file names the thread that opened it). Where the file cannot be
read (not Linux, a kernel without scheduler statistics) the reason goes into the window record
once and the rule stays as it was without it.
"""

from __future__ import annotations

import contextlib
import os
import threading

SCHEDSTAT = "/proc/self/task/{tid}/schedstat"
UNREAD = "run-queue wait not read ({why}): a rank starved of CPU is judged as a late one"


class RunQueueClock:
    """The calling thread's run-queue wait since the previous ``since_last`` on the same
    thread; None when it cannot be read (``reason`` then says why)."""

    def __init__(self) -> None:
        self._thread: int | None = None
        self._fd = -1
        self._last = 0
        self.reason: str | None = None

    def since_last(self) -> int | None:
        """Nanoseconds waited for a CPU since the previous call, or None: the first call on a
        thread (it starts the count), or the file is unreadable."""
        if self.reason is not None:
            return None
        thread = threading.get_ident()
        try:
            if thread != self._thread:
                self._open(thread)
                return None
            now = _waited_ns(self._fd)
        except (OSError, ValueError, IndexError) as exc:
            self.reason = UNREAD.format(why=f"{type(exc).__name__}: {exc}"[:120])
            self.close()
            return None
        waited, self._last = now - self._last, now
        return max(waited, 0)

    def _open(self, thread: int) -> None:
        self.close()
        fd = os.open(SCHEDSTAT.format(tid=threading.get_native_id()), os.O_RDONLY)
        self._fd, self._thread = fd, thread
        self._last = _waited_ns(fd)

    def close(self) -> None:
        fd, self._fd, self._thread = self._fd, -1, None
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):  # already closed under us: nothing to release
            self.close()


def _waited_ns(fd: int) -> int:
    """The run-queue wait field of a ``schedstat`` file (on CPU, waiting, timeslices)."""
    return int(os.pread(fd, 128, 0).split()[1])
