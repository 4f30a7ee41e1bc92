"""The timed collectives of a group of ranks, summarized so that groups combine: what a node
leader sends up under hierarchical collection instead of its ranks' waits.

Per step and collective (a lane), and in a last row per collective for each rank's typical wait
(its median over the steps), a group keeps what the late-rank rule (``analysis.collectives``)
reads, whatever the number of ranks:

* exact by sum: how many ranks timed it, the sum of their waits and of their arrival offsets
  (so the ranks' mean wait, the wait for the late rank, and their mean arrival);
* exact by max and min: the longest wait and the ``TOP_K`` shortest with their ranks (the
  transfer; the rank that arrived last, and the candidates for the late rank, which has the
  shortest wait in the steps it is late);
* bounded: the waits on log-spaced buckets 2% apart (``prefix_sketch``), for the median and the
  median absolute deviation of the other ranks' waits, each known to within an interval (about
  1% of the median wait) that the reading states as ``bound_ms``.

Where every rank read its run-queue wait before each collective, a group keeps a second summary
of the same kind, of the waits with those run-queue waits added back (``own``): the rule reads
the ranks' own lateness from it as it does from every rank's (``StepFacts.of_own_waits``), with
the same exact and bounded parts, so a rank starved of CPU is told from a late one under
hierarchical collection too.

A summary holds ``O(steps * collectives * (TOP_K + max_buckets))`` numbers. The reading of a
combined summary equals the reading of every rank's waits but for the median and the spread of
the other ranks, which lie inside their bounds; a candidate's lateness in a step where it is not
among the ``TOP_K`` shortest waits counts as its least possible value there (the wait of the
longest), so a rank named late from the summary is one the full reading names too, up to
``bound_ms`` at the rule's bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ReportFormatError
from .accounting import FloatArray
from .collective_checks import checked_key, checked_list
from .collectives import (
    CollectiveTimes,
    CommunicationReading,
    Key,
    judged,
    late_threshold,
    reading_of,
)
from .prefix_sketch import (
    DEFAULT_GROWTH,
    DEFAULT_MAX_BUCKETS,
    IntArray,
    PrefixSketch,
    entry_bounds,
    merge_sketches,
    sketch_prefixes,
    widen_lanes,
)
from .step_facts import StepFacts, typical_waits
from .values import is_int

TOP_K = 3
"""Shortest waits kept per step and collective, with their ranks."""
DECIMALS = 4
"""Decimal places of the milliseconds a summary is written with (a tenth of a microsecond)."""


@dataclass(frozen=True, eq=False)
class CollectiveSummary:
    """A group's timed collectives over a window (module doc); arrays ``[T, C]`` (``low_*``
    ``[T, C, TOP_K]``, ascending, padded with NaN and rank -1), milliseconds."""

    keys: tuple[Key, ...]
    nbytes: tuple[int, ...]
    n_ranks: int
    count: IntArray
    wait_sum: FloatArray
    wait_max: FloatArray
    reached_sum: FloatArray
    low_wait: FloatArray
    low_rank: IntArray
    sketch: PrefixSketch
    untimed: tuple[str, ...] = ()
    own: CollectiveSummary | None = None
    """The same summary of the waits with each rank's run-queue wait before the collective
    added back (module doc); None where some rank did not read it."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (NaN as null), read back by ``from_dict``. Milliseconds are written
        to ``DECIMALS`` places: the ranks time in whole microseconds, so sums and their medians
        (half microseconds) keep their values."""
        sk = self.sketch
        return {
            "keys": [[*k, n] for k, n in zip(self.keys, self.nbytes, strict=True)],
            "n_ranks": self.n_ranks,
            "count": self.count.tolist(),
            "wait_sum": _nulled(self.wait_sum),
            "wait_max": _nulled(self.wait_max),
            "reached_sum": _nulled(self.reached_sum),
            "low_wait": _nulled(self.low_wait),
            "low_rank": self.low_rank.tolist(),
            "sketch": {
                "growth": sk.growth,
                "max_buckets": sk.max_buckets,
                "lane_min": _nulled(sk.lane_min),
                **{name: getattr(sk, name).tolist() for name in _SKETCH_INTS},
            },
            "untimed": list(self.untimed),
            "own": None if self.own is None else self.own.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> CollectiveSummary:
        """From ``to_dict()``'s form (one written before ``own`` was carried reads as one
        without it); raises ReportFormatError naming what is wrong."""
        where = "collectives summary"
        if not isinstance(data, dict) or set(data) - {"own"} != _FIELDS:
            raise ReportFormatError(f"{where} must hold exactly {sorted(_FIELDS)}")
        keys = [checked_key(k, where) for k in checked_list(data["keys"], where)]
        n_ranks = data["n_ranks"]
        sk = data["sketch"]
        if not is_int(n_ranks) or n_ranks < 1 or not isinstance(sk, dict):
            raise ReportFormatError(f"{where}: n_ranks must be an integer >= 1, sketch an object")
        try:
            lanes = {
                name: np.asarray(data[name], np.float64)
                for name in ("wait_sum", "wait_max", "reached_sum", "low_wait")
            }
            count = np.asarray(data["count"], np.int64)
            low_rank = np.asarray(data["low_rank"], np.int64)
            ints = {name: np.asarray(sk[name], np.int64) for name in _SKETCH_INTS}
            sketch = PrefixSketch(
                growth=float(sk["growth"]),
                max_buckets=int(sk["max_buckets"]),
                lane_min=np.asarray(sk["lane_min"], np.float64),
                **ints,
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise ReportFormatError(f"malformed {where}: {exc}") from None
        steps = count.shape[0] if count.ndim == 2 else -1
        lane_shape = (steps, len(keys))
        if (
            count.shape != lane_shape
            or any(lanes[n].shape != lane_shape for n in ("wait_sum", "wait_max", "reached_sum"))
            or lanes["low_wait"].shape != (*lane_shape, TOP_K)
            or low_rank.shape != (*lane_shape, TOP_K)
            or sketch.lane_min.shape != lane_shape
            or sketch.sizes.shape != (steps * len(keys),)
            or sketch.index.shape != sketch.count.shape
            or int(sketch.sizes.sum()) != sketch.index.size
            or (sketch.sizes < 1).any()
            or not (count >= 0).all()
            or not (count <= n_ranks).all()
            or not (sketch.count >= 0).all()
            or not _every_lane_holds(sketch, n_ranks)
        ):
            raise ReportFormatError(f"{where}: its arrays do not fit its steps, keys and ranks")
        untimed = checked_list(data["untimed"], where)
        if not all(isinstance(u, str) for u in untimed):
            raise ReportFormatError(f"{where}: untimed must be a list of strings")
        own = None if data.get("own") is None else cls.from_dict(data["own"])
        if own is not None and (own.n_ranks != n_ranks or own.count.shape[0] != steps):
            raise ReportFormatError(f"{where}: its own waits' summary covers other ranks or steps")
        return cls(
            keys=tuple(k[:4] for k in keys),
            nbytes=tuple(k[4] for k in keys),
            n_ranks=n_ranks,
            count=count,
            low_rank=low_rank,
            sketch=sketch,
            untimed=tuple(untimed),
            own=own,
            **lanes,
        )


_SKETCH_INTS = ("sizes", "index", "count", "fold_low", "fold_high")
_FIELDS = {
    "keys",
    "n_ranks",
    "count",
    "wait_sum",
    "wait_max",
    "reached_sum",
    "low_wait",
    "low_rank",
    "sketch",
    "untimed",
}


def _every_lane_holds(sketch: PrefixSketch, n_ranks: int) -> bool:
    """Whether every lane's bucket counts add up to ``n_ranks``."""
    lane = np.repeat(np.arange(sketch.sizes.size), sketch.sizes)
    return bool((np.bincount(lane, sketch.count, sketch.sizes.size) == n_ranks).all())


def summarize_collectives(times: CollectiveTimes, rank_ids: Sequence[int]) -> CollectiveSummary:
    """A group's summary from its ranks' timed collectives (``rank_ids``: their global ranks)."""
    typical = typical_waits(times.wait_ms)[None]
    wait = np.concatenate([times.wait_ms, typical]).transpose(0, 2, 1)  # [T + 1, C, R]
    timed = np.isfinite(wait)
    order = np.argsort(np.where(timed, wait, np.inf), axis=2, kind="stable")[:, :, :TOP_K]
    low_wait = np.take_along_axis(wait, order, axis=2)
    low_rank = np.where(np.isfinite(low_wait), np.asarray(rank_ids, np.int64)[order], -1)
    reached = np.concatenate([times.reached_ms, 0 * typical]).transpose(0, 2, 1)
    own = None
    if times.queued_ms is not None:  # NaN where a rank did not read it: not a full step there
        own_times = CollectiveTimes(
            times.keys, times.nbytes, times.wait_ms + times.queued_ms, times.reached_ms
        )
        own = summarize_collectives(own_times, rank_ids)
    return CollectiveSummary(
        keys=times.keys,
        nbytes=times.nbytes,
        n_ranks=len(rank_ids),
        count=timed.sum(axis=2).astype(np.int64),
        wait_sum=np.where(timed, wait, 0.0).sum(axis=2),
        wait_max=np.where(timed, wait, 0.0).max(axis=2),
        reached_sum=np.where(timed, reached, 0.0).sum(axis=2),
        low_wait=_padded(low_wait),
        low_rank=_padded_ranks(low_rank),
        sketch=sketch_prefixes(np.where(timed, wait, 0.0), DEFAULT_GROWTH, DEFAULT_MAX_BUCKETS),
        untimed=times.untimed,
        own=own,
    )


def combine_collectives(parts: Sequence[CollectiveSummary]) -> CollectiveSummary:
    """One summary of disjoint groups' summaries (their keys joined; a group that did not time
    a collective counts as not timing it in any step). Raises ValueError when their steps
    differ."""
    if len({p.count.shape[0] for p in parts}) != 1:
        raise ValueError("the groups' collectives cover different steps")
    keys: dict[Key, int] = {}
    nbytes: dict[Key, int] = {}
    for part in parts:
        for key, size in zip(part.keys, part.nbytes, strict=True):
            keys.setdefault(key, len(keys))
            nbytes[key] = max(nbytes.get(key, 0), size)
    wide = [_widened(p, keys) for p in parts]
    n_ranks = sum(p.n_ranks for p in parts)
    low_wait = np.concatenate([w.low_wait for w in wide], axis=2)
    low_rank = np.concatenate([w.low_rank for w in wide], axis=2)
    order = np.argsort(np.where(low_rank >= 0, low_wait, np.inf), axis=2, kind="stable")
    order = order[:, :, :TOP_K]
    untimed: list[str] = []
    for part in parts:
        untimed.extend(u for u in part.untimed if u not in untimed)
    owns = [p.own for p in parts if p.own is not None]
    return CollectiveSummary(
        keys=tuple(keys),
        nbytes=tuple(nbytes[k] for k in keys),
        n_ranks=n_ranks,
        count=np.sum([w.count for w in wide], axis=0),
        wait_sum=np.sum([w.wait_sum for w in wide], axis=0),
        wait_max=np.max([w.wait_max for w in wide], axis=0),
        reached_sum=np.sum([w.reached_sum for w in wide], axis=0),
        low_wait=_padded(np.take_along_axis(low_wait, order, axis=2)),
        low_rank=_padded_ranks(np.take_along_axis(low_rank, order, axis=2)),
        sketch=merge_sketches([w.sketch for w in wide], n_ranks),
        untimed=tuple(untimed),
        own=combine_collectives(owns) if len(owns) == len(parts) else None,
    )


def read_collective_summary(
    summary: CollectiveSummary, n_ranks: int, step_ms: float
) -> CommunicationReading:
    """The window's reading from a combined summary of its ``n_ranks`` ranks (a step counts
    where all of them timed the collective)."""
    threshold = late_threshold(step_ms)
    own: dict[Key, StepFacts] = {}
    if summary.own is not None:
        own = {summary.own.keys[c]: f for c, f in summary_facts(summary.own, n_ranks)}
    readings = [
        judged(summary.keys[c], summary.nbytes[c], facts, threshold, own.get(summary.keys[c]))
        for c, facts in summary_facts(summary, n_ranks)
    ]
    return reading_of(readings, summary.untimed)


def summary_facts(summary: CollectiveSummary, n_ranks: int) -> list[tuple[int, StepFacts]]:
    """The late-rank rule's facts of each collective (by its column) that all ``n_ranks``
    ranks timed in some step, read from the summary: ``behind`` and ``noise`` within
    ``bound_ms`` of ``StepFacts.of_waits`` on every rank's waits, the rest exact."""
    low, high = entry_bounds(summary.sketch, summary.wait_max)
    ends = np.cumsum(summary.sketch.sizes)
    width = len(summary.keys)
    typical = summary.count.shape[0] - 1
    out = []
    for c in range(width):
        full = np.flatnonzero(summary.count[:typical, c] == n_ranks)
        if not full.size or n_ranks < 2:
            continue
        lanes = [
            _Lane(low, high, summary.sketch.count, ends[t * width + c], summary, t, c)
            for t in full.tolist()
        ]
        out.append((c, _facts(summary, c, full, lanes)))
    return out


class _Lane:
    """One step's waits of one collective: the sketch's buckets as value intervals."""

    def __init__(
        self,
        low: FloatArray,
        high: FloatArray,
        count: IntArray,
        end: int,
        summary: CollectiveSummary,
        t: int,
        c: int,
    ) -> None:
        start = end - int(summary.sketch.sizes[t * len(summary.keys) + c])
        self.low, self.high = low[start:end], high[start:end]
        self.count = count[start:end]
        self.longest = float(summary.wait_max[t, c])
        self.kth = float(np.nanmax(summary.low_wait[t, c]))

    def without(self, wait: float | None) -> IntArray:
        """The bucket counts of the other ranks ``[P, buckets]``: less the bucket holding
        ``wait``, or, for a rank not among the shortest (its wait unknown, at least the
        ``TOP_K``-th), one row per bucket it may be in, from the ``TOP_K``-th's to the last.
        Every one is tried: the others' median moves one way as the removed wait grows, but
        their spread need not."""
        if wait is not None:
            places = np.array([self._bucket(wait)])
        else:
            places = np.flatnonzero(self.count > 0)  # the last non-empty one at least
            places = places[places >= min(self._bucket(self.kth), places[-1])]
        out = np.repeat(self.count[None, :], len(places), axis=0)
        out[np.arange(len(places)), places] -= 1
        return out

    def _bucket(self, wait: float) -> int:
        inside = np.flatnonzero((self.low <= wait) & (wait <= self.high) & (self.count > 0))
        return int(inside[0]) if inside.size else int(np.argmin(np.abs(self.low - wait)))

    def median(self, count: IntArray) -> tuple[FloatArray, FloatArray]:
        """Per row of ``count``, the least and the most the median of its values can be."""
        return _order_medians(self.low, count), _order_medians(self.high, count)

    def spread(
        self, count: IntArray, median: tuple[FloatArray, FloatArray]
    ) -> tuple[FloatArray, FloatArray]:
        """Per row, the least and the most their median absolute deviation can be."""
        lo, hi = median[0][:, None], median[1][:, None]
        near = np.maximum(0.0, np.maximum(self.low - hi, lo - self.high))
        far = np.maximum(self.high - lo, hi - self.low)
        return _weighted_medians(near, count), _weighted_medians(far, count)


def _facts(summary: CollectiveSummary, c: int, full: IntArray, steps: list[_Lane]) -> StepFacts:
    """The rule's facts from the summary: the late rank from the typical waits' shortest
    (exact); in each step how far behind the others' median it arrived and how far apart the
    others arrived, within their buckets where it is among the step's shortest waits, else the
    least lateness it can have (its wait the step's longest) and the others' spread either way.
    ``bound_ms``: how far the lateness and the noise may lie from the exact values."""
    late = int(summary.low_rank[-1, c, 0])
    ranks, waits = summary.low_rank[full, c], summary.low_wait[full, c]
    behind, noise = np.empty((3, len(full))), np.empty((3, len(full)))  # estimate, least, most
    for t, lane in enumerate(steps):
        where = np.flatnonzero(ranks[t] == late)
        wait = float(waits[t, where[0]]) if where.size else None
        counts = lane.without(wait)
        middle = lane.median(counts)
        lo, hi = float(middle[0].min()), float(middle[1].max())
        least, most = lane.spread(counts, middle)
        noise[1, t], noise[2, t] = least.min(), most.max()
        if wait is None:
            behind[:, t] = lo - lane.longest, lo - lane.longest, hi - lane.kth
        else:
            behind[:, t] = (lo + hi) / 2 - wait, lo - wait, hi - wait
    noise[0] = (noise[1] + noise[2]) / 2
    medians = np.median(behind, axis=1), np.median(noise, axis=1)
    bound = max(float(np.max(np.abs(m[1:] - m[0]))) for m in medians)
    return StepFacts(
        shortest=waits[:, 0],
        mean=summary.wait_sum[full, c] / summary.count[full, c],
        longest=summary.wait_max[full, c],
        last=ranks[:, 0],
        reached=summary.reached_sum[full, c] / summary.count[full, c],
        late=late,
        gap=float(summary.low_wait[-1, c, 1] - summary.low_wait[-1, c, 0]),
        noise=float(medians[1][0]),
        behind=behind[0],
        bound_ms=bound,
    )


def _order_medians(values: FloatArray, count: IntArray) -> FloatArray:
    """Per row of ``count`` ``[P, n]``, the median of ``values`` (``[n]`` or ``[P, n]``,
    ascending along each row) each taken ``count`` times."""
    cumulative = np.cumsum(count, axis=1)
    total = cumulative[:, -1:]
    rows = np.broadcast_to(values, count.shape)
    picks = [(cumulative <= k).sum(axis=1, keepdims=True) for k in ((total - 1) // 2, total // 2)]
    low, high = (np.take_along_axis(rows, p, axis=1)[:, 0] for p in picks)
    return (low + high) / 2


def _weighted_medians(values: FloatArray, count: IntArray) -> FloatArray:
    """``_order_medians`` of each row of ``values`` ``[P, n]`` in any order."""
    order = np.argsort(values, axis=1, kind="stable")
    return _order_medians(
        np.take_along_axis(values, order, axis=1), np.take_along_axis(count, order, axis=1)
    )


def _nulled(values: FloatArray) -> Any:
    out = np.round(values, DECIMALS).astype(object)
    out[np.isnan(values)] = None
    return out.tolist()


def _padded(values: FloatArray) -> FloatArray:
    out = np.full((*values.shape[:2], TOP_K), np.nan)
    out[:, :, : values.shape[2]] = values
    return out


def _padded_ranks(ranks: IntArray) -> IntArray:
    out = np.full((*ranks.shape[:2], TOP_K), -1, np.int64)
    out[:, :, : ranks.shape[2]] = ranks
    return out


def _widened(part: CollectiveSummary, keys: dict[Key, int]) -> CollectiveSummary:
    """``part`` laid out on the joined ``keys`` (columns it lacks: timed by none of its ranks)."""
    if part.keys == tuple(keys):
        return part
    columns = np.array([keys[k] for k in part.keys], np.int64)
    steps, width = part.count.shape[0], len(keys)

    def spread(values: Any, fill: Any) -> Any:
        out = np.full((steps, width, *values.shape[2:]), fill, dtype=values.dtype)
        out[:, columns] = values
        return out

    return CollectiveSummary(
        keys=tuple(keys),
        nbytes=(0,) * width,
        n_ranks=part.n_ranks,
        count=spread(part.count, 0),
        wait_sum=spread(part.wait_sum, 0.0),
        wait_max=spread(part.wait_max, 0.0),
        reached_sum=spread(part.reached_sum, 0.0),
        low_wait=spread(part.low_wait, np.nan),
        low_rank=spread(part.low_rank, -1),
        sketch=widen_lanes(part.sketch, columns, width, part.n_ranks),
        untimed=part.untimed,
    )
