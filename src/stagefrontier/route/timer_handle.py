"""What the router reads and drives of the timer it is attached to: a typed handle.

``StageTimer`` attaches its router with its instrumentation (``record.instrumentation``), and
the router sees it only through ``TimerHandle``, which lists what the router uses: nothing of
the timer's own fields.
"""

from __future__ import annotations

from typing import Any, Protocol


class TimerHandle(Protocol):
    """The part of a timer's ``Instrumentation`` the router uses."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def out_dir(self) -> str: ...

    @property
    def step(self) -> int: ...

    @property
    def collector(self) -> Any: ...

    @property
    def closed(self) -> bool: ...

    @property
    def loader_workers(self) -> Any: ...

    def tell_steps(self, on: bool) -> None: ...

    def charge(self, ns: int) -> None: ...

    def record_ranges(self) -> None: ...

    def stop_ranges(self) -> None: ...
