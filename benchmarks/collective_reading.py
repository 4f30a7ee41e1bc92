"""Rank 0's reading of a window's timed collectives (``analysis.collectives.read_collectives``).

Rank 0 reads each window's collectives twice: its labels judge the late rank, and the window's
record holds the reading. The facts the rule reads are kept on the window's ``CollectiveTimes``,
so the first reading computes them and the second judges them again against its own threshold.
This times both on a window as the demo makes one at 4 ranks (25 steps, one DDP bucket, each
rank's waits scattered by the scheduler and its run-queue wait before each arrival read), a
fresh ``CollectiveTimes`` a round, ``ROUNDS`` rounds: the median and quartiles of each reading's
CPU time on the thread (``time.thread_time_ns``).

Usage::

    python benchmarks/collective_reading.py   # writes benchmarks/results/collective_reading.md
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import harness_common as hc
from stagefrontier.analysis.collectives import CollectiveTimes, read_collectives

ROUNDS, RANKS, STEPS = 201, 4, 25
KEYS = (("all_reduce", 0, "model.backward_cpu_wall", 0),)


def window(seed: int = 0) -> CollectiveTimes:
    """Arrivals 200 ms into the step, 0-150 ms of CPU wait a step before each, rank 1 120 ms
    late: each rank's wait until the collective completes, 5 ms after the last arrival."""
    rng = np.random.default_rng(seed)
    queued = rng.uniform(0.0, 150.0, (STEPS, RANKS))
    arrived = rng.normal(200.0, 3.0, (STEPS, RANKS)) + queued
    arrived[:, 1] += 120.0
    wait = (arrived.max(axis=1, keepdims=True) + 5.0 - arrived)[:, :, None]
    return CollectiveTimes(
        KEYS, (1 << 20,), wait, arrived[:, :, None], queued_ms=queued[:, :, None]
    )


def collect(quick: bool, work: Path) -> list[dict[str, Any]]:
    base, ranks = window(), list(range(RANKS))
    first, second = [], []
    for _ in range(5 if quick else ROUNDS):
        times = replace(base)  # a fresh window: nothing kept from the round before
        start = time.thread_time_ns()
        read_collectives(times, ranks, 430.0)  # the labels' reading
        middle = time.thread_time_ns()
        read_collectives(times, ranks, 410.0)  # the record's, against its own threshold
        first.append(middle - start)
        second.append(time.thread_time_ns() - middle)
    return [{"first_ns": first, "second_ns": second}]


def render(rows: list[dict[str, Any]], result: hc.Result, quick: bool) -> None:
    lines = []
    for name in ("first", "second"):
        values = rows[0][f"{name}_ns"]
        q1, median, q3 = statistics.quantiles(values, n=4)
        lines.append([name, len(values), f"{median / 1e3:.0f}", f"{q1 / 1e3:.0f} - {q3 / 1e3:.0f}"])
    result.title = "Rank 0's reading of a window's timed collectives"
    result.summary = [
        f"A window of {STEPS} steps at {RANKS} ranks, one bucket: the first reading median"
        f" {lines[0][2]} us of thread CPU (quartiles {lines[0][3]}), the second {lines[1][2]}"
        f" us ({lines[1][3]})."
    ]
    result.section(
        "Per reading",
        hc.table(["Reading", "Rounds", "Median us", "Quartiles us"], lines),
    )


if __name__ == "__main__":
    raise SystemExit(hc.harness_main("collective_reading", __doc__ or "", collect, render))
