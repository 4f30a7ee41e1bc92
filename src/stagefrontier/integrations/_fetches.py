"""The time a framework's training loop spends inside its DataLoader's own fetches.

A framework can do more between two steps than take the next batch. The Hugging Face Trainer
takes the step's micro-batches and then counts their label tokens across every rank with a
gather: a rank whose samples are slow reaches the gather last, and the others wait there for
it, so the whole time between two steps is about the same on every rank and says nothing of
whose data was late. :class:`FetchTimes` counts only the time inside the loader's iterators'
``_next_data`` (the batch itself: the sampler, the dataset, the collate function, or the wait
for a worker's batch), which stays the slow rank's own. While the profiler router captures,
each fetch is also a profiler range of the data wait (the instrumentation's wait range, opened
and closed around it), so a captured step's data stage is the same time as the live one's.

The iterators are reached through the loader's ``_get_iterator`` (which ``DataLoader.__iter__``
calls for each new iterator, once for persistent workers), set on the loader instance, as the
worker counters do (``record.loader_workers``): nothing of the class is changed, and another
loader is left as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..record.instrumentation import Instrumentation

_now = time.perf_counter_ns


class FetchTimes:
    """Nanoseconds spent in a DataLoader's fetches since the last :meth:`take`.
    ``instrumentation``: the timer's (``StageTimer.instrumentation``), whose wait range each
    fetch opens and closes."""

    __slots__ = ("_instrumentation", "_ns")

    def __init__(self, instrumentation: Instrumentation) -> None:
        self._instrumentation = instrumentation
        self._ns = 0

    def watch(self, loader: Any) -> bool:
        """Time the fetches of every iterator ``loader`` makes from now on; False (nothing
        changed) for anything but a torch ``DataLoader`` whose iterators it can reach."""
        make = getattr(loader, "_get_iterator", None)
        if make is None or not hasattr(loader, "num_workers"):
            return False
        loader._get_iterator = _TimedIterators(make, self)
        return True

    def take(self) -> int:
        """The fetch time since the last call, and start counting again."""
        ns, self._ns = self._ns, 0
        return ns

    def timed(self, fetch: Callable[[], Any]) -> Callable[[], Any]:
        """``fetch`` (an iterator's ``_next_data``), adding its duration to the count."""

        instrumentation = self._instrumentation

        def next_data() -> Any:
            instrumentation.open_wait_gap()
            start = _now()
            try:
                return fetch()
            finally:
                self._ns += _now() - start
                instrumentation.close_wait_gap()

        return next_data


class _TimedIterators:
    """Put in place of a watched loader's ``_get_iterator``: each new iterator's ``_next_data``
    is timed (an iterator without one is returned as it is)."""

    def __init__(self, make: Callable[[], Any], fetches: FetchTimes) -> None:
        self.make = make
        self.fetches = fetches

    def __call__(self) -> Any:
        iterator = self.make()
        fetch = getattr(iterator, "_next_data", None)
        if fetch is not None:
            iterator._next_data = self.fetches.timed(fetch)
        return iterator
