"""The do-nothing context returned by a disabled timer and by unsampled or invalid spans."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING


class NoopContext:
    """``with`` over it runs no Python frame: its enter and exit are C-level callables stored
    on the class (neither binds to the instance, so the ``with`` statement calls them as they
    are). The enter returns None; the exit is an int's ``object.__init__``, which accepts and
    ignores the three exception arguments and returns None, so an exception always propagates.
    A disabled timer's stage is then a dict lookup and two C calls."""

    __slots__ = ()

    if TYPE_CHECKING:

        def __enter__(self) -> None: ...
        def __exit__(self, exc_type: object, exc: object, tb: object) -> None: ...

    else:
        __enter__ = itertools.repeat(None).__next__
        __exit__ = (0).__init__


NOOP = NoopContext()
