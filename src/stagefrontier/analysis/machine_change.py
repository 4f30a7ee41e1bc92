"""Did the machine change between two runs, and does that change account for NEW's slowdown?

The gate of ``compare --fail-above`` reads a slowdown spread evenly over every stage and rank
either as slower code (a larger model, a slower kernel everywhere) or as a slower machine (other
work on the host, a hypervisor taking CPU time, a CPU quota). The host signals rank 0 records
with each window (``collect.host_signals``) tell the two apart:

- **CPU per wall second** of rank 0's process: the CPU time its threads got per second of
  wall time. Code that does more work spends more CPU time per step at the same CPU per wall
  second; a machine whose CPUs other work takes gives the process less CPU per wall second
  for the same CPU time per step. NEW's median step scaled by the ratio of the two sides' CPU
  per wall second is the step NEW would take on BASE's machine; what it still exceeds BASE's
  median by is the part of the slowdown the CPU time per step accounts for (the code's), the
  rest is the machine's.
- **Contention**: a process gets less CPU per wall second also while it waits for something
  that is not a CPU (a GPU, a disk, the network). The machine is only named when a signal
  shows other work competing in NEW: a load average at or above one per CPU, or half again
  BASE's; CPU steal; CPU throttling of the cgroup.

The machine accounts for the slowdown when it took a share of it, the code's share stays under
the gate's bar or at most ``CODE_PER_MACHINE`` times the machine's, and a contention signal
shows in NEW. Contention itself costs CPU time (caches a neighbour evicts, more switches between
threads): two CPU-burning processes beside the demo's job on a loaded 2-CPU machine raised its
CPU time per step by about a third while its step grew three quarters, so the code's share of a
busier machine's slowdown is rarely nil. Sides whose windows carry no host signals (folders
written before they were recorded) give no reading: the gate then says the signals are missing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .regression import STEAL_SHARE

LOAD_PER_CPU = 1.0
"""A load average at or above this many runnable threads per CPU: more work than CPUs."""
LOAD_GROWTH = 1.5
"""A load average this many times BASE's is contention, whatever the CPUs."""
CODE_PER_MACHINE = 2.0
"""The most the code's share of a slowdown may be, in multiples of the machine's, for the
machine to account for it (contention's own cost in CPU time counts as the code's)."""


@dataclass(frozen=True)
class HostReading:
    """One side's host signals: each the median over the side's windows that carried it
    (None when none did)."""

    windows: int
    cpu_per_wall: float | None
    load_per_cpu: float | None
    steal_share: float | None
    throttled_periods_per_window: float | None


def host_reading(windows: Sequence[Mapping[str, Any]]) -> HostReading | None:
    """The side's reading from its windows' host signals; None when no window carried its
    process's CPU per wall second."""
    carried = [w for w in windows if w.get("cpu_per_wall") is not None]
    if not carried:
        return None
    loads = [
        w["load_average"] / w["cpus"] for w in carried if "load_average" in w and w.get("cpus")
    ]
    return HostReading(
        len(carried),
        _median([w["cpu_per_wall"] for w in carried]),
        _median(loads),
        _median([w["steal_share"] for w in carried if "steal_share" in w]),
        _median([w["throttled_periods"] for w in carried if "throttled_periods" in w]),
    )


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


@dataclass(frozen=True)
class MachineChange:
    """What the host signals say of NEW's slowdown against BASE."""

    explained: bool
    """The machine accounts for the slowdown (see the module's rule)."""
    scale: float
    """NEW's CPU per wall second over BASE's: a NEW step times this is the step NEW would
    take at BASE's."""
    code_ms: float
    """The shift of the median step that NEW's CPU time per step accounts for."""
    machine_ms: float
    """The rest of the shift: the process got less CPU per wall second."""
    signals: str
    """The signals that changed, or the ones read: ``CPU per wall 0.97 -> 0.55; load 1.2 ->
    9.8 per CPU``."""
    base: HostReading
    new: HostReading

    def to_dict(self) -> dict[str, Any]:
        """Its fields as the gate's JSON states them, both sides' readings nested."""
        return asdict(self)


def machine_change(
    base: HostReading | None,
    new: HostReading | None,
    base_median_ms: float,
    new_median_ms: float,
    bar_ms: float,
) -> MachineChange | None:
    """Whether the host signals account for the shift of the median step from
    ``base_median_ms`` to ``new_median_ms``; None when a side carries none."""
    if base is None or new is None or not base.cpu_per_wall or not new.cpu_per_wall:
        return None
    shift = new_median_ms - base_median_ms
    scale = new.cpu_per_wall / base.cpu_per_wall
    code = new_median_ms * scale - base_median_ms
    machine = shift - code
    contention = _contention(base, new)
    explained = machine > 0 and code <= max(bar_ms, CODE_PER_MACHINE * machine) and bool(contention)
    said = [f"CPU per wall {base.cpu_per_wall:.3g} -> {new.cpu_per_wall:.3g}", *contention]
    if not contention and new.load_per_cpu is not None:
        said.append(_load(base.load_per_cpu, new.load_per_cpu))
    return MachineChange(explained, scale, code, machine, "; ".join(said), base, new)


def _contention(base: HostReading, new: HostReading) -> list[str]:
    """The signals that show other work competing for NEW's CPUs, each as it reads."""
    said = []
    load, was = new.load_per_cpu, base.load_per_cpu
    if load is not None and (load >= LOAD_PER_CPU or (was and load >= LOAD_GROWTH * was)):
        said.append(_load(was, load))
    steal = new.steal_share
    if steal is not None and steal >= STEAL_SHARE and steal > (base.steal_share or 0.0):
        said.append(f"CPU steal {base.steal_share or 0.0:.0%} -> {steal:.0%}")
    throttled, before = new.throttled_periods_per_window, base.throttled_periods_per_window or 0.0
    if throttled is not None and throttled > before:
        said.append(f"CPU quota throttled {before:.0f} -> {throttled:.0f} times a window")
    return said


def _load(was: float | None, load: float) -> str:
    return f"load {'' if was is None else f'{was:.1f} -> '}{load:.1f} per CPU"
