"""How long the training thread waited for a CPU: its run-queue wait, per window and per
collective reached.

Linux keeps, per thread, the time it was runnable but not running (the second field of
``/proc/<pid>/task/<tid>/schedstat``, in nanoseconds). A rank that reaches a collective late
because the machine gave it no CPU (other ranks or other jobs on its cores) shows it there; a
rank late because its own code slept or computed longer does not: sleeping is not runnable, and
computing is running. The late-rank rule (``analysis.collectives``) discounts the part of a
rank's lateness its extra run-queue wait explains.

The count covers a window's recorded steps only: it starts as the window's first step begins
(``record.timer_state``), stops as a paused stretch begins and starts again at the first step
recorded after it, and is read at the hand-off; the set-up before the first window (compile,
warm-up) and a pause do not inflate the per-step wait the rule divides by the window's steps.
Each collective reached is read too (``since_last``): how long the thread waited for a CPU
since it last reached that collective, a step before. Between two arrivals the thread waited in
the collective (asleep, not runnable), woke when it completed (a moment every rank shares), ran
the rest of the step and the next one up to the collective: its run-queue wait over that cycle
is, step by step, how much later the scheduler made it arrive. A pause forgets those readings
(``pause``): a cycle across a pause would count the pause's waits. A few reads per window and
one per collective reached, all on the training thread, from a file descriptor opened on that
thread (a ``schedstat`` file names the thread that opened it). Where the file cannot be
read (not Linux, a kernel without scheduler statistics) the reason goes into the window record
once and the rule stays as it was without it.
"""

from __future__ import annotations

import contextlib
import os
import threading

SCHEDSTAT = "/proc/self/task/{tid}/schedstat"
MAX_ARRIVALS = 4096
"""Collectives whose last arrival is kept (as many as a window keeps keys)."""
UNREAD = "run-queue wait not read ({why}): a rank starved of CPU is judged as a late one"


class RunQueueClock:
    """The calling thread's run-queue wait over the stretches it is told to count: from
    ``start`` to ``stop`` (or ``take``), summed until ``take`` hands the sum over. A stretch
    started on one thread and stopped on another is dropped (the file names one thread)."""

    def __init__(self) -> None:
        self._thread: int | None = None
        self._fd = -1
        self._started: int | None = None  # the reading the running stretch counts from
        self._arrived: dict[object, int] = {}  # each collective's reading at its last arrival
        self._held = 0
        self._counted = False
        self.reason: str | None = None

    def start(self) -> None:
        """Count from now (nothing when counting already, or the file is unreadable)."""
        if self._started is None and self.reason is None:
            self._started = self._read()

    def stop(self) -> None:
        """Stop counting; the stretch since ``start`` is kept for ``take``."""
        started, self._started = self._started, None
        if started is None:
            return
        thread = self._thread
        now = self._read()
        if now is not None and self._thread == thread:
            self._held += max(now - started, 0)
            self._counted = True

    def pause(self) -> None:
        """A paused stretch begins: ``stop``, and the collectives' last arrivals forgotten."""
        self.stop()
        self._arrived.clear()

    def since_last(self, key: object) -> int | None:
        """Nanoseconds the calling thread waited for a CPU since it last reached the collective
        ``key``; None the first time (or after a pause), from a thread other than the one the
        count reads, or when the file is unreadable."""
        if self._thread != threading.get_ident() or self.reason is not None:
            return None
        now = self._read()
        if now is None:
            return None
        before = self._arrived.get(key)
        if before is None and len(self._arrived) >= MAX_ARRIVALS:
            return None
        self._arrived[key] = now
        return None if before is None else max(now - before, 0)

    def take(self) -> int | None:
        """Nanoseconds waited for a CPU over the stretches counted since the previous
        ``take``, and the count stops; None when none was counted (it never started, or the
        file is unreadable: ``reason`` then says why)."""
        self.stop()
        held, counted = self._held, self._counted
        self._held, self._counted = 0, False
        return held if counted and self.reason is None else None

    def _read(self) -> int | None:
        try:
            thread = threading.get_ident()
            if thread != self._thread:
                self._open(thread)
            return _waited_ns(self._fd)
        except (OSError, ValueError, IndexError) as exc:
            self.reason = UNREAD.format(why=f"{type(exc).__name__}: {exc}"[:120])
            self.close()
            return None

    def _open(self, thread: int) -> None:
        self.close()
        fd = os.open(SCHEDSTAT.format(tid=threading.get_native_id()), os.O_RDONLY)
        self._fd, self._thread = fd, thread

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
