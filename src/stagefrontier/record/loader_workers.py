"""A DataLoader's worker processes, timed from inside: how fast they supply batches.

When ``timer.iter`` is given a ``torch.utils.data.DataLoader`` with ``num_workers > 0``, the
timer chains its own ``worker_init_fn`` before the user's (the user's still runs, unchanged). In
each worker that hook wraps the fetcher the worker builds (``_DatasetKind.create_fetcher``, read
again for every epoch of persistent workers), so each batch's fetch plus collate is timed where
it runs. A worker adds its busy nanoseconds and its batch count to its row of one small int64
tensor put in shared memory before the workers start; the main process reads the rows at each
window boundary (never per step) and hands the window the differences.

Rank 0 turns a rank's counts into the window's loader figures (``window.loader``): a worker's
time per batch, how busy the workers were, how often the step needs a batch (its own time per
batch, data wait excluded), whether the workers are saturated, and the worker count that would
keep up. While the profiler router captures this rank, the control row asks the workers to
profile their batches too (``route.worker_profile``).
"""

from __future__ import annotations

import cProfile
import logging
import marshal
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ..failures import reason, say_failed

logger = logging.getLogger("stagefrontier")

BATCHES, BUSY_NS, PID, STARTS, STARTED_NS = range(5)
"""Columns of a worker's row: batches finished, busy nanoseconds, its pid, fetches started, when
the fetch in progress started (``perf_counter_ns``, one monotonic clock for every process; 0
between fetches)."""
COLUMNS = 5
CAPTURE = 0
"""Column of the control row (row 0) holding the capture in progress (0: none)."""
HUNG_AFTER_S = 60.0
"""A batch in progress this long (or the loader's own ``timeout``, when it sets one) is hung."""
PF_EXITING = 0x4
"""The kernel's flag of a process already inside its exit (``/proc/<pid>/stat``, field 9)."""
ATTRIBUTE = "_stagefrontier_workers"
"""Where a loader keeps its WorkerCounters, so each epoch's ``timer.iter`` finds the same one."""

_now = time.perf_counter_ns


class WorkerCounters:
    """One loader's shared counters (main process side) and the hook its workers run."""

    def __init__(self, loader: Any) -> None:
        import torch

        self.workers = int(loader.num_workers)
        timeout = float(getattr(loader, "timeout", 0) or 0)
        self.hung_after_ns = int((timeout if timeout > 0 else HUNG_AFTER_S) * 1e9)
        self.tensor = torch.zeros((1 + self.workers, COLUMNS), dtype=torch.int64).share_memory_()
        self._rows = self.tensor.numpy()
        self.scratch = tempfile.mkdtemp(prefix="stagefrontier-workers-")
        weakref.finalize(self, shutil.rmtree, self.scratch, True)
        self._last = self._rows[1:, :].copy()
        self._last_ns = _now()
        self._last_open = 0  # nanoseconds of batches in progress at the previous read
        self.consumed = 0
        """Batches the training loop took from the loader (``timer.iter`` counts them)."""
        self._procs: list[Any] = []
        loader.worker_init_fn = WorkerHook(self.tensor, loader.worker_init_fn, self.scratch)
        loader._get_iterator = _ReportIterators(loader._get_iterator, self)

    def started(self, iterator: Any) -> None:
        """A new iterator of the loader (an epoch's, or the one of persistent workers), told
        by the loader itself whoever iterates it (``timer.iter`` or a framework's loop). Its
        worker processes are kept, not the iterator, which shuts them down when dropped."""
        procs = getattr(iterator, "_workers", None)
        self._procs = list(procs) if isinstance(procs, list) else []

    def set_capture(self, capture: int) -> None:
        """Ask the workers to profile their batches (``capture`` > 0) or to stop (0)."""
        self._rows[0, CAPTURE] = capture

    def read(self) -> dict[str, Any]:
        """The window's counts since the previous read: a few reads of shared memory."""
        now = _now()
        rows = self._rows[1:, :].copy()
        delta = rows - self._last
        self._last = rows
        span, self._last_ns = now - self._last_ns, now
        # A batch in progress counts up to now here and the rest in the next window, so a
        # window's busy time does not jump by whole batches.
        fetching = rows[:, STARTED_NS] > 0
        age = now - rows[:, STARTED_NS]
        hung = [int(i) for i in np.flatnonzero(fetching & (age >= self.hung_after_ns))]
        dead = [i for i in self._dead_workers(rows) if i not in hung]
        fetching[dead] = False
        open_ns = int(np.maximum(now - rows[fetching, STARTED_NS], 0).sum())
        finished = float(delta[:, BUSY_NS].sum())
        busy_s = (finished + open_ns - self._last_open) * 1e-9
        self._last_open = open_ns
        consumed, self.consumed = self.consumed, 0
        figures: dict[str, Any] = {
            "workers": self.workers,
            "batches": int(delta[:, BATCHES].sum()),
            "busy_s": max(busy_s, 0.0),
            "finished_busy_s": finished * 1e-9,
            "span_s": span * 1e-9,
            "consumed": consumed,
        }
        if hung:
            # A worker stuck in one batch (the loader's timeout, a lock, a dead mount): neither
            # dead nor a measure of the workers' speed.
            figures["hung_s"] = float(age[hung].max()) * 1e-9
            figures["note"] = (
                f"worker(s) {', '.join(map(str, hung))} hung in one batch for "
                f"{figures['hung_s']:.0f} s"
            )
        elif dead:
            figures["note"] = f"worker(s) {', '.join(map(str, dead))} exited while in use"
        elif not rows[:, STARTS].any():
            figures["note"] = "no worker has fetched a batch yet"
        return figures

    def _dead_workers(self, rows: np.ndarray[Any, Any]) -> list[int]:
        """Workers whose process ended, or is ending, in the middle of a batch (the DataLoader
        raises in the training loop for those; the figures say it too). A worker that ended
        between batches was told to (an epoch's or an IterableDataset's end)."""
        try:
            return [
                i
                for i, p in enumerate(self._procs[: len(rows)])
                if rows[i, STARTED_NS] > 0 and (not p.is_alive() or _exiting(p.pid))
            ]
        except Exception:  # a process object from another torch version: say nothing
            return []


def _exiting(pid: int) -> bool:
    """Whether the process is inside its exit: its sockets are closed (the loader that reads
    from it has failed already) while it is not yet a zombie its parent could reap. Linux only
    (``/proc``); elsewhere False."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return bool(int(fields[6]) & PF_EXITING)
    except (OSError, IndexError, ValueError):
        return False


class _ReportIterators:
    """Put in place of a watched loader's ``_get_iterator``, which ``DataLoader.__iter__``
    calls for each new iterator (once for persistent workers): tells the counters of it."""

    def __init__(self, make: Callable[[], Any], counters: WorkerCounters) -> None:
        self.make = make
        self.counters = counters

    def __call__(self) -> Any:
        iterator = self.make()
        self.counters.started(iterator)
        return iterator


class WorkerHook:
    """The ``worker_init_fn`` a watched loader runs in each worker: time the worker's batches,
    then call the user's own hook. Picklable, so ``spawn`` workers receive it too."""

    def __init__(self, tensor: Any, user_init: Callable[[int], None] | None, scratch: str) -> None:
        self.tensor = tensor
        self.user_init = user_init
        self.scratch = scratch

    def __call__(self, worker_id: int) -> None:
        try:
            _time_fetches(self.tensor.numpy(), 1 + worker_id, self.scratch)
        except Exception as exc:  # the worker fetches untimed; the main process notes no batches
            say_failed(logger, f"timing DataLoader worker {worker_id}", exc, "it runs untimed")
        if self.user_init is not None:
            self.user_init(worker_id)


def _time_fetches(rows: np.ndarray[Any, Any], row: int, scratch: str) -> None:
    """In a worker: wrap every fetcher it creates so each batch adds to its row."""
    from torch.utils.data import dataloader

    kind = dataloader._DatasetKind
    create = kind.create_fetcher
    rows[row, PID] = os.getpid()
    profiler = WorkerProfiler(rows, row, scratch)

    def create_fetcher(*args: Any, **kwargs: Any) -> Any:
        fetcher = create(*args, **kwargs)
        fetch = fetcher.fetch

        def timed_fetch(index: Any) -> Any:
            profile = profiler.begin()
            start = _now()
            rows[row, STARTED_NS] = start
            rows[row, STARTS] += 1
            try:
                batch = fetch(index)
            finally:
                rows[row, BUSY_NS] += _now() - start
                rows[row, STARTED_NS] = 0
                if profile is not None:
                    profiler.end(profile)
            rows[row, BATCHES] += 1
            return batch

        fetcher.fetch = timed_fetch
        return fetcher

    kind.create_fetcher = staticmethod(create_fetcher)


PROFILE_NAME = "capture{capture}-worker{worker}.prof"
"""A worker's profile of one capture in the loader's scratch folder (``pstats`` format)."""


class WorkerProfiler:
    """In a worker: while the control row names a capture, each batch runs under cProfile and
    the capture's profile so far is written after it (``pstats`` format, atomically)."""

    def __init__(self, rows: np.ndarray[Any, Any], row: int, scratch: str) -> None:
        self._rows, self._row, self._scratch = rows, row, scratch
        self._capture = 0
        self._profile: cProfile.Profile | None = None

    def begin(self) -> cProfile.Profile | None:
        capture = int(self._rows[0, CAPTURE])
        if capture != self._capture:
            self._capture = capture
            self._profile = cProfile.Profile() if capture else None
        if self._profile is None:
            return None
        try:
            self._profile.enable()
        except ValueError:  # another profiler runs in this worker: leave it alone
            self._profile = None
            return None
        return self._profile

    def end(self, profile: cProfile.Profile) -> None:
        profile.disable()
        try:
            profile.snapshot_stats()
            name = PROFILE_NAME.format(capture=self._capture, worker=self._row - 1)
            path = os.path.join(self._scratch, name)
            with open(path + ".tmp", "wb") as f:
                marshal.dump(profile.stats, f)
            os.replace(path + ".tmp", path)
        except OSError:
            self._profile = None  # no room to write: profile no more batches


def watch_loader(loader: Any) -> tuple[WorkerCounters | None, str]:
    """The loader's counters (made once per loader), or None and why there are none."""
    data = sys.modules.get("torch.utils.data")  # never imported: not a DataLoader
    if data is None or not isinstance(loader, data.DataLoader):
        kind = type(loader).__name__
        return None, f"data from a {kind}, not a torch DataLoader: no worker figures"
    if not loader.num_workers:
        return None, ""
    counters = getattr(loader, ATTRIBUTE, None)
    if isinstance(counters, WorkerCounters):
        return counters, ""
    if loader.persistent_workers and getattr(loader, "_iterator", None) is not None:
        return None, "its persistent workers started before timer.iter saw the loader"
    try:
        counters = WorkerCounters(loader)
        setattr(loader, ATTRIBUTE, counters)
    except Exception as exc:
        say_failed(logger, "watching the DataLoader's workers", exc, "no worker figures")
        return None, f"watching the DataLoader's workers failed: {reason(exc)}"
    return counters, ""


def restart_persistent_workers(loader: Any) -> bool:
    """Shut down the persistent workers of ``loader`` and forget its iterator, so that its next
    epoch starts new workers (which then run the timer's hook); True when there were some. Only
    for a caller that starts the epoch again right after, before any batch of it is used:
    Lightning starts the first epoch's workers before a callback sees the loader. A DataLoader
    whose private iterator looks different is left as it is."""
    iterator = getattr(loader, "_iterator", None)
    if not getattr(loader, "persistent_workers", False) or iterator is None:
        return False
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return False
    shutdown()
    loader._iterator = None
    return True
