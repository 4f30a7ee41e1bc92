"""The Sink protocol and the three things a collector does with its sinks: start, emit, close.

A sink receives every analyzed window on rank 0's analysis thread. It has ``write(window)`` and
``close()``, and may have ``start()``: the collector that owns the sinks calls ``start()`` when it
is built (to open an endpoint or a file up front rather than at the first window) and ``close()``
after its last window. A sink that fails is logged (once per sink and kind of failure) and
skipped; nothing reaches training.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ..failures import say_failed
from ..window.merged import AnalyzedWindow

logger = logging.getLogger("stagefrontier")


class Sink(Protocol):
    """Receives every analyzed window on the analysis thread; must not block for long."""

    def write(self, window: AnalyzedWindow) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class StartableSink(Sink, Protocol):
    """A sink with something to open before the first window (an HTTP endpoint, an event file)."""

    def start(self) -> None: ...


def start_sinks(sinks: Sequence[Sink]) -> None:
    """Call ``start()`` on the sinks that have one."""
    for sink in sinks:
        if isinstance(sink, StartableSink):
            _guarded("starting", sink, sink.start)


def emit(sinks: Sequence[Sink], window: AnalyzedWindow) -> None:
    """Write one analyzed window to every sink; a failing sink does not stop the others."""
    for sink in sinks:
        _guarded("writing to", sink, functools.partial(sink.write, window))


def close_sinks(sinks: Sequence[Sink]) -> None:
    """Close every sink; a failing sink does not stop the others."""
    for sink in sinks:
        _guarded("closing", sink, sink.close)


_said: dict[int, set[tuple[str, str]]] = {}
"""Per sink (by identity), the failures said so far: a sink that fails at every window (a full
disk) is said once per kind of failure, its repeats at DEBUG."""


def _guarded(doing: str, sink: Sink, call: Callable[[], None]) -> None:
    try:
        call()
    except Exception as exc:
        name = type(sink).__name__
        said = _said.setdefault(id(sink), set())
        say_failed(logger, f"{doing} sink {name}", exc, "the other sinks go on", said)
