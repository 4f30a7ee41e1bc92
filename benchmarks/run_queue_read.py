"""The cost of reading the training thread's run-queue wait (``record.run_queue``).

A rank that times its collectives reads its training thread's ``schedstat`` twice per window,
from a file descriptor kept open: as the window's first step begins (``RunQueueClock.start``) and
at the hand-off (``RunQueueClock.take``); a pause adds one read as it begins and one at the first
step after it. This times a window's pair on this thread, ``CALLS`` pairs a round, over
``ROUNDS`` rounds: the median and quartiles of one pair's CPU time on the thread
(``time.thread_time_ns``: the system calls included, the time the thread spends descheduled on a
busy machine not).

Usage::

    python benchmarks/run_queue_read.py   # writes benchmarks/results/run_queue_read.md
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import harness_common as hc
from stagefrontier.record.run_queue import RunQueueClock

ROUNDS, CALLS = 31, 1000


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    clock = RunQueueClock()
    clock.start()  # the first read opens the file on this thread
    clock.take()
    per_window = []
    for _ in range(3 if quick else ROUNDS):
        start = time.thread_time_ns()
        for _ in range(CALLS):
            clock.start()
            clock.take()
        per_window.append((time.thread_time_ns() - start) / CALLS)
    return [{"ns_per_window": per_window, "unreadable": clock.reason}]


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    row = rows[0]
    values = row["ns_per_window"]
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    result.title = "The run-queue wait read twice per window: cost of a window's reads"
    result.summary = [
        "A window's two reads of the training thread's run-queue wait (its first step's and"
        f" the hand-off's): median {median:.0f} ns of thread CPU (quartiles"
        f" {q1:.0f} - {q3:.0f}) over {len(values)} rounds of {CALLS} windows."
        + (f" Unreadable here: {row['unreadable']}." if row["unreadable"] else "")
    ]
    result.section(
        "Per window",
        hc.table(
            ["Rounds", "Windows a round", "Median ns", "Quartiles ns"],
            [[len(values), CALLS, f"{median:.0f}", f"{q1:.0f} - {q3:.0f}"]],
        ),
    )


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("run_queue_read", __doc__ or "", collect, render))
