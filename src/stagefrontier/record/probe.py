"""``timer.probe(name)``: a side-channel span that may nest anywhere and never enters the prefix
vector; its count, total and maximum are reported per window."""

from __future__ import annotations

import time

_now = time.perf_counter_ns


class Probe:
    """One named probe's running totals for the open window."""

    __slots__ = ("_start", "count", "max_ns", "total_ns")

    def __init__(self) -> None:
        self._start = 0
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    def __enter__(self) -> None:
        self._start = _now()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        elapsed = _now() - self._start
        self.count += 1
        self.total_ns += elapsed
        if elapsed > self.max_ns:
            self.max_ns = elapsed

    def drain(self) -> dict[str, float]:
        """The window's totals, in seconds; the probe starts over."""
        out = {
            "count": float(self.count),
            "total_s": self.total_ns * 1e-9,
            "max_s": self.max_ns * 1e-9,
        }
        self.count = self.total_ns = self.max_ns = 0
        return out
