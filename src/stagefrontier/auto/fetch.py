"""The DataLoader fetch of the automatic hooks: the iterators' ``__next__`` while they are
installed (``AutoDriver.fetcher``). One ``next()`` of the original ``__next__``, timed while the
driver times: charged as ``timer.fetch`` charges a wait (to the next step, or with accumulation
after a backward to the next microstep, which it opens), through ``timer.fetch`` itself while a
capture records profiler ranges, and counted for the training loader's worker counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

_now = time.perf_counter_ns  # the timer's own clock


def timed_fetch(driver: Any, next_batch: Callable[[Any], Any], timing: str) -> Callable[[Any], Any]:
    """The ``__next__`` of every DataLoader iterator: ``next_batch`` (the original), timed
    while ``driver.phase`` (an ``AutoDriver``'s) is ``timing``. A function, not a method of the
    driver: a class attribute that is a function binds to the iterator it is called on, and the
    wrapper is then the only Python call a fetch adds."""
    grad_on = driver._grad_on

    def fetch(iterator: Any) -> Any:
        if (driver.phase is not timing or not grad_on()) and not driver._timing_starts():
            return next_batch(iterator)
        try:
            loader = iterator._stagefrontier_loader  # set by the patched DataLoader.__iter__
        except AttributeError:  # an iterator made before the hooks, or with slots
            loader = None
        driver._fetched_from = loader
        if driver._after_backward and driver.accumulate and driver._step is not None:
            driver._after_backward = False
            try:
                driver._next_microstep()  # the next micro-batch's own wait
            except Exception as exc:
                driver._fail(exc)
                return next_batch(iterator)
        if driver._instrumentation.records_ranges:  # a capture: the wait is a profiler range
            timer: Any = driver.timer
            batch = timer.fetch(next_batch, iterator)
        else:
            # timed here and charged as ``timer.fetch`` charges a fetch: calling it would
            # add a Python call, an argument tuple and a keyword dict to every batch
            start = _now()
            batch = next_batch(iterator)
            charge = driver._charge_fetch
            charge(_now() - start)
        counters = driver._counters
        if counters is not None and loader is driver._loader:
            counters.consumed += 1
        return batch

    return fetch
