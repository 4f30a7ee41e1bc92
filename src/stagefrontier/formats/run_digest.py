"""A run's windows of one stage list, summarized as they are read, in memory that does not grow
with the run (``formats.run_folder.load_run`` feeds it one window at a time).

A run of at most :data:`SHOWN_ALL` windows keeps every window. A longer one keeps in full only
the windows a reader looks for (the first and the last, the last full window the verdict is
taken from, the one StageFrontier cost most, and every flagged window: a regression, or the
profiler router at work, up to :data:`MAX_FLAGGED`); the rest count in :data:`BUCKETS` buckets
of consecutive windows (the exposed ms/step's min/median/max, the mean stage shares, the top
stage, the leading ranks) and in run-wide tallies (labels, routing sets). The comparison with
the rank-local baselines reads at most :data:`COMPARED` packets, evenly spaced; the frontier
figure's worst step is searched in every packet, and only the packet that holds it is kept.
What a reader holds per window is a few numbers (its ms/step, its key), never its report.
"""

from __future__ import annotations

import statistics
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis import baselines
from ..analysis.accounting import FloatArray
from ..analysis.leaders import window_leaders
from ..analysis.schema import semantic_stage
from .window_rows import WindowRow

SHOWN_ALL = 120
"""A run of at most this many windows is shown window by window."""
BUCKETS = 60
"""A longer run's windows are summarized in this many buckets of consecutive windows."""
MAX_FLAGGED = 500
"""The most flagged windows a long run's report keeps in full; more are counted and said."""
COMPARED = 2000
"""The most packets the comparison with the rank-local baselines reads (evenly spaced)."""
ROUTER_SLOWED_FRACTION = 0.01
"""A window counts as slowed by the profiler router when the router's CPU time on some rank
(``self_cost.router_cpu_s``) exceeds this fraction of the window's exposed time."""


@dataclass(frozen=True)
class Source:
    """Where a window kept in full is read from at the end: its ``windows.jsonl`` line, or its
    packet when it has no record."""

    position: int
    label: str
    line: bytes | None = None
    packet: Path | None = None


@dataclass(frozen=True)
class Bucket:
    """Consecutive windows summarized: the facts of the first and last (``WindowRow.facts``),
    how many, the exposed ms/step's min, median and max, each broad stage's mean share (over
    the windows with shares), the most common top stage, per leading rank the stage it led
    most and in how many of the windows it led one, and in a run of ranks in different roles
    each role's own mean broad-stage shares (over its windows with shares)."""

    first: dict[str, Any]
    last: dict[str, Any]
    count: int
    ms: tuple[float, float, float]
    shares: dict[str, float]
    top: str | None
    leaders: dict[int, tuple[str, int]]
    roles: dict[str, dict[str, float]] = field(default_factory=dict)


class _BucketSums:
    def __init__(self, row: WindowRow) -> None:
        self.first = self.last = row.facts()
        self.ms = array("d")
        self.shares: Counter[str] = Counter()
        self.defined = 0
        self.tops: Counter[str] = Counter()
        self.leads: dict[int, Counter[str]] = {}
        self.roles: dict[str, Counter[str]] = {}
        self.role_windows: Counter[str] = Counter()

    def add(self, row: WindowRow) -> None:
        self.last = row.facts()
        self.ms.append(row.mean_step_s * 1e3)
        if row.shares_defined:
            self.defined += 1
            self.shares.update(row.semantic_shares)
        if row.top1:
            self.tops[row.top1] += 1
        for rank, (stage, _) in window_leaders(row).items():
            self.leads.setdefault(rank, Counter())[stage] += 1
        for role, own in (row.role_reports or {}).items():
            if own.shares_defined:
                self.roles.setdefault(role, Counter()).update(own.semantic_shares)
                self.role_windows[role] += 1

    def bucket(self) -> Bucket:
        ms = (min(self.ms), statistics.median(self.ms), max(self.ms))
        shares = {s: v / self.defined for s, v in self.shares.items()} if self.defined else {}
        leaders = {
            rank: (stages.most_common(1)[0][0], sum(stages.values()))
            for rank, stages in self.leads.items()
        }
        top = self.tops.most_common(1)[0][0] if self.tops else None
        roles = {
            role: {s: v / self.role_windows[role] for s, v in sums.items()}
            for role, sums in self.roles.items()
        }
        return Bucket(self.first, self.last, len(self.ms), ms, shares, top, leaders, roles)


@dataclass
class Tallies:
    """Run-wide counts over every window: the routing sets, co-critical stage sets and labels
    (each with the windows that had it), the most ranks, the restart attempts (each with its
    first and last step), the ranks missing from some window, the windows whose records the
    disk budget cut down to their summary (``cut``: how many, ``cut_windows``: the first ten)."""

    windows: int = 0
    routes: Counter[str] = field(default_factory=Counter)
    co_critical: Counter[str] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    ranks: int = 0
    attempts: set[int] = field(default_factory=set)
    missing: set[int] = field(default_factory=set)
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    cut: int = 0
    cut_windows: list[tuple[int, int]] = field(default_factory=list)

    def add(self, row: WindowRow) -> None:
        self.windows += 1
        if row.compacted:
            self.cut += 1
            if len(self.cut_windows) < 10:
                self.cut_windows.append(row.key)
        self.routes[" + ".join(row.routing_set)] += 1
        if row.co_critical_stages:
            self.co_critical[" + ".join(row.co_critical_stages)] += 1
        self.labels.update(row.labels)
        self.ranks = max(self.ranks, row.n_ranks)
        self.attempts.add(row.attempt)
        first, last = self.steps.get(row.attempt, (row.first_step, row.last_step))
        self.steps[row.attempt] = (min(first, row.first_step), max(last, row.last_step))
        self.missing.update(row.missing_ranks)


@dataclass
class MethodShares:
    """Each stage's share under StageFrontier and every rank-local baseline, summed over the
    packets compared (``compared`` of ``packets``), and per method how often each broad stage
    came out on top."""

    stages: list[str]
    sums: dict[str, FloatArray] = field(default_factory=dict)
    tops: dict[str, Counter[str]] = field(default_factory=dict)
    compared: int = 0
    packets: int = 0

    def add(self, d: FloatArray, shares: dict[str, float]) -> None:
        broad = [semantic_stage(s) for s in self.stages]
        for method, values in method_shares(d, self.stages, shares).items():
            self.sums[method] = self.sums.get(method, 0.0) + values
            self.tops.setdefault(method, Counter())[broad_top(broad, values)] += 1
        self.compared += 1

    def mean(self, method: str) -> FloatArray:
        mean: FloatArray = self.sums[method] / self.compared
        return mean


def method_shares(d: FloatArray, stages: list[str], shares: dict[str, float]) -> dict[str, Any]:
    """Stage shares of one window under StageFrontier (its report's ``shares``) and every
    baseline (from its matrix ``d``)."""
    out: dict[str, Any] = {"stagefrontier": np.array([shares[s] for s in stages])}
    for name, rule in baselines.BASELINES.items():
        out[name] = rule(d)
    return out


def broad_top(broad: list[str], shares: FloatArray) -> str:
    """The broad stage with the largest share once each microstep's substage is summed into its
    stage: a data wait split over four microsteps is one stage, as the window line reads it."""
    total: dict[str, float] = {}
    for name, share in zip(broad, shares.tolist(), strict=True):
        total[name] = total.get(name, 0.0) + share
    return max(total, key=total.__getitem__)


@dataclass
class Worst:
    """The packet holding the largest exposed step time so far (its path and that time)."""

    exposed_s: float = -1.0
    path: Path | None = None

    def offer(self, exposed_s: float, path: Path) -> None:
        if exposed_s > self.exposed_s:
            self.exposed_s, self.path = exposed_s, path


class SchemaDigest:
    """The summary of one stage list's windows, fed one window at a time (``add``).

    ``total``: how many windows the folder holds in all (bucket positions are out of it);
    ``captured``: the step spans the profiler router captured (its incidents); ``cut``: whether
    the disk budget cut some records down to their summary (the run is then summarized
    however short: such a window cannot be shown in full, and is never kept to be, even when
    ``compacted.jsonl`` does not list it: only counted)."""

    def __init__(
        self, stages: list[str], total: int, captured: list[tuple[int, int]], cut: bool = False
    ) -> None:
        self.stages = stages
        self.total = max(total, 1)
        self.show_all = total <= SHOWN_ALL and not cut
        self.captured = captured
        self.tallies = Tallies()
        self.shown: list[Source] = []
        self.first: Source | None = None
        self.last: Source | None = None
        self.longest: tuple[int, Source | None] = (0, None)
        self.costliest: tuple[float, Source | None] = (-1.0, None)
        self.flagged: list[Source] = []
        self.flagged_over = 0
        self.buckets: dict[int, _BucketSums] = {}
        self.methods = MethodShares(stages)
        self.others_ms = array("d")
        self.slowed: list[tuple[dict[str, Any], float]] = []
        self.worst, self.worst_slowed = Worst(), Worst()
        self.captured_packets: list[Path] = []

    def add(self, row: WindowRow, source: Source) -> bool:
        """Count ``row``; whether the window is one the profiler router slowed."""
        self.tallies.add(row)
        slowed = self.router_slowed(row)
        flagged = slowed or row.regression is not None
        if self.show_all:
            if not row.compacted:  # its summary alone, whatever compacted.jsonl says: counted
                self.shown.append(source)
        else:
            self._keep(row, source, flagged)
            position = min(source.position * BUCKETS // self.total, BUCKETS - 1)
            if position not in self.buckets:
                self.buckets[position] = _BucketSums(row)
            self.buckets[position].add(row)
        if slowed:
            self.slowed.append((row.facts(), row.mean_step_s * 1e3))
        else:
            self.others_ms.append(row.mean_step_s * 1e3)
        return slowed

    def add_packet(
        self, row: WindowRow, d: FloatArray, path: Path, slowed: bool, compare: bool
    ) -> None:
        """Count a window's matrix: the worst step's search, the packets an incident captured,
        and (when ``compare``) the comparison with the baselines."""
        self.methods.packets += 1
        (self.worst_slowed if slowed else self.worst).offer(
            float(d.sum(axis=2).max(axis=1).max()), path
        )
        if self._overlaps_capture(row):
            self.captured_packets.append(path)
        if compare:
            self.methods.add(d, row.shares)

    def _keep(self, row: WindowRow, source: Source, flagged: bool) -> None:
        if row.compacted:  # its summary alone: counted in its bucket
            self.flagged_over += flagged
            return
        if self.first is None:
            self.first = source
        self.last = source
        if row.n_steps >= self.longest[0]:
            self.longest = (row.n_steps, source)
        cost = _most(row.self_cost, "fraction")
        if cost > self.costliest[0]:
            self.costliest = (cost, source)
        if flagged and len(self.flagged) < MAX_FLAGGED:
            self.flagged.append(source)
        elif flagged:
            self.flagged_over += 1

    def router_slowed(self, row: WindowRow) -> bool:
        """Whether the profiler router slowed this window: it captured its steps, or its
        export and reduction cost a rank more than :data:`ROUTER_SLOWED_FRACTION` of the
        exposed time."""
        return router_worked(row) or self._overlaps_capture(row)

    def _overlaps_capture(self, row: WindowRow) -> bool:
        return any(a <= row.last_step and row.first_step <= b for a, b in self.captured)

    def kept(self) -> list[Source]:
        """The windows to read in full, in run order."""
        if self.show_all:
            return self.shown
        chosen = [self.first, self.last, self.longest[1], self.costliest[1], *self.flagged]
        unique = {source.position: source for source in chosen if source is not None}
        return [unique[position] for position in sorted(unique)]

    def bucket_list(self) -> list[Bucket]:
        return [self.buckets[i].bucket() for i in sorted(self.buckets)]


def router_worked(row: WindowRow) -> bool:
    """Whether the profiler router's export and reduction cost a rank more than
    :data:`ROUTER_SLOWED_FRACTION` of the window's exposed time, or it captured steps of the
    window (``self_cost.capture_s``)."""
    router = _most(row.self_cost, "router_cpu_s")
    slowed = router > ROUTER_SLOWED_FRACTION * max(row.exposed_s, 1e-12)
    return slowed or _most(row.self_cost, "capture_s") > 0


def _most(cost: dict[str, Any] | None, key: str) -> float:
    """``self_cost[key]["max"]`` as a float, 0 when absent or not a number."""
    part = (cost or {}).get(key)
    value = part.get("max", 0.0) if isinstance(part, dict) else 0.0
    return float(value) if isinstance(value, int | float) else 0.0
