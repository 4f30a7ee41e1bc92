"""The do-nothing context returned by a disabled timer and by unsampled or invalid spans."""

from __future__ import annotations


class NoopContext:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None


NOOP = NoopContext()
