"""Cheap signals of rank 0's host between two windows: what else wants its CPUs.

Read where they exist (Linux), each a file read of a few hundred bytes per window on the
collector thread, never on the training thread:

* the 1-minute load average (``/proc/loadavg``): runnable processes, this job's among them;
* CPU steal (``/proc/stat``): the share of CPU time the hypervisor gave to other guests;
* CPU throttling of the process's cgroup (``cpu.stat``: ``nr_throttled`` and ``throttled_usec``
  under cgroup v2, ``throttled_time`` in ns under v1): periods its quota ran out;
* this process's CPU time against the wall time (``os.times``): its threads got less CPU while
  waiting as long;
* the CPUs the process may run on (``os.sched_getaffinity``), which scale the load average.

A signal that cannot be read is left out, never raised: a window on another OS carries fewer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_STAT = Path("/proc/stat")
LOADAVG = Path("/proc/loadavg")
CGROUP_STATS = (
    (Path("/sys/fs/cgroup/cpu.stat"), "throttled_usec", 1e-3),
    (Path("/sys/fs/cgroup/cpu/cpu.stat"), "throttled_time", 1e-6),
    (Path("/sys/fs/cgroup/cpu,cpuacct/cpu.stat"), "throttled_time", 1e-6),
)
"""Where the cgroup's CPU counters may be, the field of its throttled time and that field's
unit in ms."""
STEAL_COLUMN = 8
"""``/proc/stat``'s ``cpu`` line: user nice system idle iowait irq softirq steal ..."""


@dataclass(frozen=True)
class Snapshot:
    wall_s: float
    cpu_s: float
    steal: tuple[int, int] | None  # (steal, total) jiffies
    throttled: tuple[int, float] | None  # (periods, ms)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None


def _steal() -> tuple[int, int] | None:
    text = _read(PROC_STAT)
    if not text or not text.startswith("cpu "):
        return None
    try:
        values = [int(x) for x in text.splitlines()[0].split()[1:]]
    except ValueError:
        return None
    if len(values) < STEAL_COLUMN:
        return None
    # guest time is already inside user time
    return values[STEAL_COLUMN - 1], sum(values[:STEAL_COLUMN])


def _throttled() -> tuple[int, float] | None:
    for path, field, to_ms in CGROUP_STATS:
        text = _read(path)
        if text is None:
            continue
        counters: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if value.strip().isdigit():
                counters[name] = int(value)
        if "nr_throttled" in counters and field in counters:
            return counters["nr_throttled"], counters[field] * to_ms
    return None


def load_average() -> float | None:
    fields = (_read(LOADAVG) or "").split()
    try:
        return float(fields[0]) if fields else None
    except ValueError:
        return None


def usable_cpus() -> int | None:
    """The CPUs this process may run on (all of the host's where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def snapshot() -> Snapshot:
    times = os.times()
    return Snapshot(time.monotonic(), times.user + times.system, _steal(), _throttled())


def between(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """The signals over the interval from ``before`` to ``after`` (the ones that exist)."""
    signals: dict[str, Any] = {}
    load = load_average()
    if load is not None:
        signals["load_average"] = round(load, 2)
    cpus = usable_cpus()
    if cpus:
        signals["cpus"] = cpus
    wall = after.wall_s - before.wall_s
    if wall > 0:
        # four significant digits: a busy host's process may get a hundredth of a CPU
        signals["cpu_per_wall"] = float(f"{(after.cpu_s - before.cpu_s) / wall:.4g}")
    if before.steal and after.steal and after.steal[1] > before.steal[1]:
        stolen = after.steal[0] - before.steal[0]
        share = stolen / (after.steal[1] - before.steal[1])
        signals["steal_share"] = round(min(max(share, 0.0), 1.0), 4)
    if before.throttled and after.throttled:  # counters only grow, unless the cgroup changed
        signals["throttled_periods"] = max(after.throttled[0] - before.throttled[0], 0)
        signals["throttled_ms"] = round(max(after.throttled[1] - before.throttled[1], 0.0), 1)
    return signals
