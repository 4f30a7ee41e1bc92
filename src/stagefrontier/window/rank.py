"""RankWindow: what one rank hands off at a window boundary, declared once.

The recorder fills a window on the training thread (a copy of its buffers, nothing more) and a
collector builds the RankWindow from it on its own thread; the wire format, the merge and the
``windows.jsonl`` record all read the one field list declared here. Rank 0's summary of what
StageFrontier cost the ranks (the record's ``self_cost`` object) is computed here too, from the
cost fields each RankWindow carries (measured by ``record.self_cost``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..analysis.schema import (
    RESIDUAL_STAGE,
    SCHEMA_VERSION,
    expand_microsteps,
    stage_order_hash,
)

NS = 1e-9


class CostFields(Protocol):
    """What measures a rank's own cost (the recorder's ``record.self_cost.CostMeter``): the
    window's cost fields from its copied rows."""

    def window_fields(self, raw: npt.NDArray[np.int64]) -> dict[str, int]: ...


def _meta(kind: str, record: str | None = None) -> dict[str, str | None]:
    """Field metadata: ``kind`` says how the wire decoder checks the value, ``record`` under
    which key ``windows.jsonl`` keeps it per rank (``{rank: value}``), if at all."""
    return {"kind": kind, "record": record}


@dataclass(frozen=True)
class RankWindow:
    """One rank's completed window.

    ``durations_ns`` is ``[N, S]`` integer nanoseconds in schema order, residual included;
    ``wall_ns`` the rank-local step wall times. Event arrays are per step (this rank only).

    This declaration is the one list of a window's fields: the wire format (``collect/wire.py``)
    sends every field whose metadata has a ``kind`` in its JSON block and checks it on receipt,
    and ``window_record`` keeps those with a ``record`` key per rank. A new field is one line.
    """

    window: int
    first_step: int = field(metadata=_meta("count"))
    last_step: int = field(metadata=_meta("count"))
    rank: int
    stages: tuple[str, ...] = field(metadata=_meta("names"))
    durations_ns: npt.NDArray[np.int64]
    wall_ns: npt.NDArray[np.int64]
    event_ms: npt.NDArray[np.float64] | None = None
    event_state: npt.NDArray[np.int8] | None = None
    forward_stage: str | None = field(default=None, metadata=_meta("optional_text"))
    accumulation_factor: int = field(default=1, metadata=_meta("positive"))
    accumulation_mixed: bool = field(default=False, metadata=_meta("flag"))
    contract_violations: int = field(default=0, metadata=_meta("count"))
    violation_reasons: tuple[str, ...] = field(default=(), metadata=_meta("names"))
    probes: dict[str, dict[str, float]] = field(default_factory=dict, metadata=_meta("probes"))
    dropped_windows: int = field(default=0, metadata=_meta("count"))
    hostname: str = field(default="", metadata=_meta("text", record="hosts"))
    local_rank: int = field(default=0, metadata=_meta("count", record="local_ranks"))
    pid: int = field(default=0, metadata=_meta("count", record="pids"))
    role: str | None = field(default=None, metadata=_meta("optional_text"))
    role_set: tuple[str, ...] = field(default=(), metadata=_meta("names"))
    """The job's full role set when the rank knows it (roles from a device mesh)."""
    paused_ranges: tuple[tuple[int, int], ...] = field(
        default=(), metadata=_meta("ranges", record="paused_ranges")
    )
    """Steps in ``[first_step, last_step]`` that ran while the timer was paused (not recorded),
    as inclusive ``(first, last)`` ranges."""
    phase: str | None = field(default=None, metadata=_meta("optional_text"))
    """The phase of the run in force at the window's end (``StageTimer.set_phase``)."""
    phase_changed: bool = field(default=False, metadata=_meta("flag"))
    """Whether the phase changed inside the window (after its first step)."""
    contexts_entered: int = field(default=0, metadata=_meta("count"))
    """Step and stage contexts the window's recorded steps entered (``record.self_cost``)."""
    context_cost_ns: int = field(default=0, metadata=_meta("count"))
    """The calibrated cost of one context on this rank's machine."""
    handoff_ns: int = field(default=0, metadata=_meta("count"))
    """The training thread's time in the window boundary before this window's first step."""
    thread_cpu_ns: int = field(default=0, metadata=_meta("count"))
    """CPU time of the library's collection threads since the previous window was built."""
    router_cpu_ns: int = field(default=0, metadata=_meta("count"))
    """CPU time of the profiler router's thread since the previous window was built."""
    capture_ns: int = field(default=0, metadata=_meta("count"))
    """The training thread's time in profiler captures since the previous window was built."""
    loader: dict[str, Any] = field(default_factory=dict, metadata=_meta("loader"))
    """A DataLoader's worker counts over the window (``record.loader_workers``), or a note
    saying why there are none; empty when the data does not come through ``timer.iter``."""
    collectives: dict[str, Any] = field(default_factory=dict, metadata=_meta("collectives"))
    """The collectives the rank timed in the window (``record.collectives``): their keys, each
    call's arrival and wait, and what could not be timed; empty when none are watched."""
    started_unix_ns: int = field(default=0, metadata=_meta("count"))
    """The wall clock (ns since the epoch) as the window's first step began; 0 when unknown."""
    ended_unix_ns: int = field(default=0, metadata=_meta("count"))
    """The wall clock as the window's last step ended."""
    schema_version: int = field(default=SCHEMA_VERSION, metadata=_meta("positive"))

    @property
    def n_steps(self) -> int:
        return int(self.durations_ns.shape[0])

    @property
    def paused_steps(self) -> int:
        """Steps of the window's span that were paused, not recorded."""
        return sum(last - first + 1 for first, last in self.paused_ranges)

    def build(self) -> RankWindow:
        """Already built (see WindowSnapshot.build)."""
        return self

    @property
    def schema_hash(self) -> str:
        return stage_order_hash(self.stages, self.schema_version)

    @property
    def overlap_ns(self) -> int:
        """Total time the timed spans exceed the step wall (nested or double-counted spans)."""
        covered = self.durations_ns.sum(axis=1)
        return int(np.maximum(covered - self.wall_ns, 0).sum())


@dataclass(slots=True)
class WindowSnapshot:
    """What the training thread hands over at a window boundary: the window's buffer itself (the
    timer starts the next window in a fresh one) and its bookkeeping. Collectors call
    ``build()`` on their own thread, so the array, the residual, the stage names and the
    RankWindow are all made off the training thread. (Not frozen: it is built on the training
    thread, and a frozen dataclass's ``__init__`` sets each field through a call.)"""

    buffer: list[int]
    """Row-major ``[rows, width]`` nanoseconds: column 0 the step wall time, then ``K *
    factor`` stage columns; the first ``n`` rows are the window's."""
    n: int
    width: int
    timed_stages: tuple[str, ...]
    fields: dict[str, Any]
    """Every other RankWindow field, as recorded."""
    cost: CostFields | None = None
    """The timer's self-cost meter; ``build()`` adds the window's cost fields from it."""

    @property
    def window(self) -> int:
        return int(self.fields["window"])

    def build(self) -> RankWindow:
        n, width = self.n, self.width
        raw = np.array(self.buffer[: n * width], dtype=np.int64).reshape(n, width)
        factor = int(self.fields["accumulation_factor"])
        k = len(self.timed_stages) * factor
        wall = raw[:, 0].copy()
        durations = np.empty((n, k + 1), dtype=np.int64)
        durations[:, :k] = raw[:, 1 : 1 + k]
        durations[:, k] = np.maximum(wall - durations[:, :k].sum(axis=1), 0)
        timed = self.timed_stages if factor == 1 else expand_microsteps(self.timed_stages, factor)
        cost: dict[str, Any] = {} if self.cost is None else self.cost.window_fields(raw)
        return RankWindow(
            stages=(*timed, RESIDUAL_STAGE),
            durations_ns=durations,
            wall_ns=wall,
            **self.fields,
            **cost,
        )


PendingWindow = RankWindow | WindowSnapshot
"""What a collector's ``submit`` receives; ``.build()`` gives the RankWindow."""


def wire_fields() -> list[Field[Any]]:
    """The RankWindow fields that travel in the wire format's JSON block, in declaration order."""
    return [f for f in fields(RankWindow) if "kind" in f.metadata]


def per_rank_fields(ranks: Sequence[RankWindow]) -> dict[str, dict[str, Any]]:
    """``{record key: {rank: value}}`` for every field declared with a ``record`` key."""
    return {
        f.metadata["record"]: {str(w.rank): getattr(w, f.name) for w in ranks}
        for f in fields(RankWindow)
        if f.metadata.get("record")
    }


COMPONENTS = ("hot_path_s", "handoff_s", "threads_cpu_s", "router_cpu_s", "capture_s", "total_s")


def rank_cost_s(w: RankWindow) -> dict[str, float]:
    """One rank's parts and their total, in seconds."""
    hot = w.contexts_entered * w.context_cost_ns * 1e-9
    handoff = w.handoff_ns * 1e-9
    threads = w.thread_cpu_ns * 1e-9
    router = w.router_cpu_ns * 1e-9
    capture = w.capture_ns * 1e-9
    return {
        "hot_path_s": hot,
        "handoff_s": handoff,
        "threads_cpu_s": threads,
        "router_cpu_s": router,
        "capture_s": capture,
        "total_s": hot + handoff + threads + router + capture,
    }


def self_cost_summary(ranks: Sequence[RankWindow]) -> dict[str, Any]:
    """The ``self_cost`` object of a window record: per component the max and median over
    ``ranks`` (seconds), the calibrated context cost, and the fraction of step time (each rank's
    total over its own summed step wall time)."""
    costs = [rank_cost_s(w) for w in ranks]
    walls = [float(w.wall_ns.sum()) * 1e-9 for w in ranks]
    fractions = [
        c["total_s"] / wall if wall > 0 else 0.0 for c, wall in zip(costs, walls, strict=True)
    ]
    out: dict[str, Any] = {name: _spread([c[name] for c in costs]) for name in COMPONENTS}
    out["context_cost_ns"] = _spread([float(w.context_cost_ns) for w in ranks])
    out["fraction"] = _spread(fractions)
    return out


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"max": 0.0, "median": 0.0}
    return {"max": float(max(values)), "median": float(statistics.median(values))}
