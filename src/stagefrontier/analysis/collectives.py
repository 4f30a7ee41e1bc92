"""Communication evidence: the clock-free reading of the collectives every rank timed.

Each rank times, per collective, its own wait: from issuing the collective to its completion
(``record.collectives``). Clocks need not agree across ranks, because only durations are
compared: inside one collective every rank waits until the last one arrives, so the rank with
the shortest wait arrived last, the shortest wait is the transfer itself, and each other rank's
wait beyond it is time spent waiting for the late rank. A collective is matched across ranks by
its family (``all_reduce`` or the user's hook), its bucket, the stage it ran in and its call in
the step.

Per window and collective: the transfer (median over steps of the shortest wait), the wait for
the late rank (median over steps of the ranks' mean extra wait), how far apart the ranks
arrived (median of the longest extra wait), and the late rank. The rule judges each rank's
arrival across the window's steps, not step by step: a rank's typical wait is its median over
the steps, and the rank with the shortest is the candidate, late by the median over steps of
how long after the other ranks' median it arrived. It is named when that lateness is material
(``LATE_MIN_MS``, ``LATE_STEP_FRACTION``), stands out of the window's noise as a median over its
steps does (``NOISE_FACTOR`` times the other ranks' spread in a typical step over the root of
the steps), held in most steps (``PERSIST_FRACTION``) and alone (``ALONE_FRACTION``: no other
rank's typical wait is nearly as short). On a loaded host the ranks' order in
one step is the scheduler's, but a rank held back in most steps of a window stands out of that
noise over the window, while one last by chance in a few steps does not.

A rank can also be held back by the machine: its cores busy with other work, it waits for a CPU.
Each arrival carries how long the rank's training thread waited for one since its previous
arrival at that collective (``record.run_queue``). Where every rank read it, the rule runs on the
waits with those waits added back (``StepFacts.of_own_waits``): the scheduler's scatter leaves
each step before the lateness and the noise are read, and what is left of a late rank's lateness
is its own code's, steady from step to step, so it must also stand out of its own wavering (the
median absolute deviation of how far behind it arrived; the raw rule cannot ask that, as the
scatter makes every rank waver). A rank the waits as timed find late, but whose lateness less
its extra wait for a CPU (the median over steps of its run-queue wait beyond the other ranks')
is not material, is not named late but ``starved_rank``: said, never routed. Where the waits were
not read at the arrivals, the window's run-queue wait per step is taken off the candidate's
lateness the same way before it is judged material. A rank late because its code slept or
computed longer keeps that part: sleeping is not waiting for a CPU, and computing is running.
None of it enters the prefix vector: it is side evidence for the labels and the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ReportFormatError
from .collective_checks import checked_key, checked_list, none_or_ms
from .step_facts import StepFacts

LATE_MIN_MS = 20.0
"""The least lateness, in milliseconds per step, that names a late rank."""
LATE_STEP_FRACTION = 0.05
"""...and the least as a fraction of the median step: scheduling noise on a loaded host stays
below both."""
NOISE_FACTOR = 8.0
"""...and at least this many times the window's noise over the square root of its steps: the
noise is how far the other ranks' waits lie from their median in a typical step (the median over
steps of their median absolute deviation), and a median over the window's steps is known to
about a quarter of that over the root of the steps, so this is about four of its standard
errors. On a loaded host the ranks reach a collective in the scheduler's order, tens of
milliseconds apart at 8 ranks on 2 cores, step by step; a rank held back by as much in most
steps of a window still stands out, as one behind by chance in a few does not."""
PERSIST_FRACTION = 0.7
"""...and it arrives at least half its lateness after the other ranks' median in at least this
part of the steps: a rank late in most steps, not one far behind in a few."""
ALONE_FRACTION = 0.5
"""...and its typical wait shorter than every other rank's by at least this part of its lateness:
it is late alone. Where two ranks arrive about as late (a DDP forward's buffer broadcast from rank
0 holds rank 0 in the forward until a rank stalled before it arrives, so both reach backward's
all-reduce late), naming one of them would be a guess."""
FIRST_LATE_FRACTION = 0.5
"""Where a late rank is late into several collectives (each one's lateness carries into the
next), the one named is the first it reaches late by at least this part of its most."""

Key = tuple[str, int, "str | None", int]
"""A collective across ranks: (family, bucket, stage, call in the step)."""


@dataclass(frozen=True)
class CollectiveTimes:
    """The timed collectives of a window's ranks, as side evidence: ``keys`` and ``nbytes``
    per collective, ``wait_ms`` and ``reached_ms`` ``[steps, ranks, collectives]`` (NaN where a
    rank did not time that collective in that step; step ``i`` is the window's first step plus
    ``i``), the ranks' reasons for what they could not time, and per rank how long its training
    thread waited for a CPU per step over the window (``record.run_queue``; None where unknown,
    empty when no rank said); ``queued_ms`` ``[steps, ranks, collectives]``, how long the rank's
    training thread had waited for a CPU since its previous arrival at the collective, as it
    reached it (NaN where unread; None when no rank read it)."""

    keys: tuple[Key, ...]
    nbytes: tuple[int, ...]
    wait_ms: npt.NDArray[np.float64]
    reached_ms: npt.NDArray[np.float64]
    untimed: tuple[str, ...] = ()
    run_queue_ms: tuple[float | None, ...] = ()
    queued_ms: npt.NDArray[np.float64] | None = None
    _facts: dict[tuple[int, ...], list[tuple[int, StepFacts, StepFacts | None]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def facts(self, rank_ids: Sequence[int]) -> list[tuple[int, StepFacts, StepFacts | None]]:
        """The late rule's facts of each collective every rank timed in some step (by its
        column): of the waits as timed and with the run-queue waits added back (None where not
        read). Read once for the ranks and kept: rank 0's labels and its window's reading
        both judge them, each against its own threshold."""
        key = tuple(rank_ids)
        if key not in self._facts:
            ranks = np.asarray(rank_ids)
            out = []
            for c in range(len(self.keys)):
                wait = self.wait_ms[:, :, c]
                if not (np.isfinite(wait).all(axis=1).any() and wait.shape[1] >= 2):
                    continue
                reached = self.reached_ms[:, :, c]
                queued = None if self.queued_ms is None else self.queued_ms[:, :, c]
                steps = StepFacts.of_waits(wait, ranks, reached, self.run_queue_ms, queued)
                own = (
                    None if queued is None else StepFacts.of_own_waits(wait, queued, ranks, reached)
                )
                out.append((c, steps, own))
            self._facts[key] = out
        return self._facts[key]

    @classmethod
    def of_ranks(
        cls, first_step: int, n_steps: int, ranks: Sequence[dict[str, Any]]
    ) -> CollectiveTimes | None:
        """From each rank's window field (``record.collectives``); None when no rank watched."""
        if not any(ranks):
            return None
        keys: dict[Key, int] = {}
        nbytes: dict[Key, int] = {}
        for part in ranks:
            for family, bucket, stage, call, size in part.get("keys", []):
                key = (family, bucket, stage, call)
                keys.setdefault(key, len(keys))
                nbytes[key] = max(nbytes.get(key, 0), size)
        shape = (n_steps, len(ranks), len(keys))
        wait, reached = np.full(shape, np.nan), np.full(shape, np.nan)
        queued = np.full(shape, np.nan)
        untimed: list[str] = []
        for r, part in enumerate(ranks):
            own = [keys[(f, b, s, c)] for f, b, s, c, _ in part.get("keys", [])]
            for step, k, arrived_us, _, wait_us, *queued_us in part.get("calls", []):
                row = step - first_step
                if 0 <= row < n_steps:
                    wait[row, r, own[k]] = wait_us / 1e3
                    reached[row, r, own[k]] = arrived_us / 1e3
                    queued[row, r, own[k]] = queued_us[0] / 1e3 if queued_us else np.nan
            untimed.extend(u for u in part.get("untimed", []) if u not in untimed)
        said = [part.get("run_queue_us") for part in ranks]
        run_queue = tuple(None if q is None else q / 1e3 / max(n_steps, 1) for q in said)
        return cls(
            tuple(keys),
            tuple(nbytes[k] for k in keys),
            wait,
            reached,
            tuple(untimed),
            run_queue if any(q is not None for q in run_queue) else (),
            queued if np.isfinite(queued).any() else None,
        )

    def to_dict(self) -> dict[str, Any]:
        def boxed(values: npt.NDArray[np.float64]) -> Any:
            out = np.round(values, 3).astype(object)
            out[np.isnan(values)] = None
            return out.tolist()

        out = {
            "keys": [[*key, size] for key, size in zip(self.keys, self.nbytes, strict=True)],
            "wait_ms": boxed(self.wait_ms),
            "reached_ms": boxed(self.reached_ms),
            "untimed": list(self.untimed),
            "run_queue_ms": [None if q is None else round(q, 3) for q in self.run_queue_ms],
        }
        if self.queued_ms is not None:
            out["queued_ms"] = boxed(self.queued_ms)
        return out

    @classmethod
    def from_dict(cls, data: Any) -> CollectiveTimes:
        """From ``to_dict()``'s form (a record written before ``run_queue_ms`` or
        ``queued_ms`` was carried reads as one without it); raises ReportFormatError naming
        what is wrong."""
        fields = {"keys", "wait_ms", "reached_ms", "untimed"}
        if not isinstance(data, dict) or set(data) - {"run_queue_ms", "queued_ms"} != fields:
            raise ReportFormatError("collectives must hold keys, wait_ms, reached_ms and untimed")
        keys = [
            checked_key(k, "collectives") for k in checked_list(data["keys"], "collectives keys")
        ]
        arrays = {"wait_ms": data["wait_ms"], "reached_ms": data["reached_ms"]}
        if data.get("queued_ms") is not None:
            arrays["queued_ms"] = data["queued_ms"]
        try:
            read = {name: np.array(value, dtype=np.float64) for name, value in arrays.items()}
        except (TypeError, ValueError) as exc:
            raise ReportFormatError(f"malformed collectives: {exc}") from None
        for name, arr in read.items():
            if arr.ndim != 3 or arr.shape[2] != len(keys) or np.isinf(arr).any() or (arr < 0).any():
                raise ReportFormatError(f"collectives {name} must be [steps, ranks, keys] >= 0")
        wait, reached = read["wait_ms"], read["reached_ms"]
        if any(arr.shape != wait.shape for arr in read.values()):
            raise ReportFormatError("collectives wait_ms, reached_ms and queued_ms differ in shape")
        untimed = checked_list(data["untimed"], "collectives untimed")
        if not all(isinstance(u, str) for u in untimed):
            raise ReportFormatError("collectives untimed must be a list of strings")
        run_queue = checked_list(data.get("run_queue_ms", []), "collectives run_queue_ms")
        if (run_queue and len(run_queue) != wait.shape[1]) or not all(map(none_or_ms, run_queue)):
            raise ReportFormatError("collectives run_queue_ms must hold one value >= 0 a rank")
        return cls(
            tuple(k[:4] for k in keys),
            tuple(k[4] for k in keys),
            wait,
            reached,
            tuple(untimed),
            tuple(None if q is None else float(q) for q in run_queue),
            read.get("queued_ms"),
        )


@dataclass(frozen=True)
class CollectiveReading:
    """One collective over a window (see the module doc); milliseconds per step."""

    family: str
    bucket: int
    stage: str | None
    call: int
    nbytes: int
    reached_ms: float
    """The median over steps of when the ranks reached it on average, from their step's
    start."""
    last_bucket: bool
    """The highest bucket of its family and stage: in DDP, the last one backward reaches."""
    steps: int
    """Steps in which every rank timed it."""
    transfer_ms: float
    wait_ms: float
    spread_ms: float
    late_rank: int | None
    lateness_ms: float
    late_steps: int
    bound_ms: float = 0.0
    """Under hierarchical collection, how far ``lateness_ms`` (and the noise it is judged
    against) may lie from the reading of every rank's waits; 0 where it is exact."""
    starved_rank: int | None = None
    """The rank that arrives late by the rule's measure, but whose longer wait for a CPU
    explains enough of it that what is left is not material: the machine held it back, not its
    code. Never the ``late_rank`` too."""
    starved_lateness_ms: float = 0.0
    """How late ``starved_rank`` arrives, per step (0 when there is none)."""
    cpu_wait_ms: float | None = None
    """How much longer per step the rank with the shortest typical wait waited for a CPU than
    the other ranks' median; None where a rank did not say."""


@dataclass(frozen=True)
class CommunicationReading:
    """A window's collectives read together: per step, the transfer and the wait for late
    ranks summed over collectives, the late rank (from the collective where it is latest) and
    the slowest collective."""

    collectives: list[CollectiveReading]
    transfer_ms: float
    wait_ms: float
    late: CollectiveReading | None
    slowest: CollectiveReading | None
    untimed: list[str]
    bound_ms: float = 0.0
    """The largest of the collectives' ``bound_ms``."""
    starved: CollectiveReading | None = None
    """Where no rank is late: the first collective a rank reaches late for want of a CPU
    (``CollectiveReading.starved_rank``), said and never routed."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "transfer_ms_per_step": round(self.transfer_ms, 3),
            "wait_ms_per_step": round(self.wait_ms, 3),
            "late_rank": None if self.late is None else self.late.late_rank,
            "lateness_ms": 0.0 if self.late is None else round(self.late.lateness_ms, 3),
            "late": None if self.late is None else rounded_reading(self.late),
            "slowest": None if self.slowest is None else rounded_reading(self.slowest),
            "starved": None if self.starved is None else rounded_reading(self.starved),
            "collectives": [rounded_reading(c) for c in self.collectives],
            "untimed": self.untimed,
            "bound_ms": round(self.bound_ms, 3),
        }


def read_collectives(
    times: CollectiveTimes, rank_ids: Sequence[int], step_ms: float
) -> CommunicationReading:
    """The window's reading (``step_ms``: the median step, for the lateness threshold)."""
    threshold = late_threshold(step_ms)
    readings = [
        judged(times.keys[c], times.nbytes[c], steps, threshold, own)
        for c, steps, own in times.facts(rank_ids)
    ]
    return reading_of(readings, times.untimed)


def late_threshold(step_ms: float) -> float:
    """The least lateness that names a late rank, for a window of ``step_ms`` steps."""
    return max(LATE_MIN_MS, LATE_STEP_FRACTION * step_ms)


def reading_of(
    readings: Sequence[CollectiveReading], untimed: Sequence[str]
) -> CommunicationReading:
    """The window's collectives read together (``last_bucket`` set per family and stage)."""
    top: dict[tuple[str, str | None], int] = {}
    for r in readings:
        top[(r.family, r.stage)] = max(top.get((r.family, r.stage), r.bucket), r.bucket)
    marked = [_with(r, last_bucket=r.bucket == top[(r.family, r.stage)]) for r in readings]
    late = _first_late(marked)
    starved = [r for r in marked if r.starved_rank is not None]
    return CommunicationReading(
        collectives=marked,
        transfer_ms=sum(r.transfer_ms for r in marked),
        wait_ms=sum(r.wait_ms for r in marked),
        late=late,
        starved=min(starved, key=lambda r: r.reached_ms) if starved and late is None else None,
        slowest=max(marked, key=lambda r: r.transfer_ms) if marked else None,
        untimed=list(untimed),
        bound_ms=max((r.bound_ms for r in marked), default=0.0),
    )


def stands_out(steps: StepFacts, threshold: float, steady: bool = False) -> bool:
    """Whether the candidate is late by the rule's bars (module doc): alone, in most steps,
    out of the window's noise (with ``steady``, out of its own lateness's wavering too), and
    material (``threshold``)."""
    lateness = float(np.median(steps.behind))
    noise = steps.noise
    if steady:
        noise = max(noise, float(np.median(np.abs(steps.behind - lateness))))
    return (
        steps.gap >= ALONE_FRACTION * lateness
        and float(np.mean(steps.behind >= lateness / 2)) >= PERSIST_FRACTION
        and lateness >= max(threshold, NOISE_FACTOR * noise / np.sqrt(len(steps.behind)))
    )


def judged(
    key: Key, nbytes: int, steps: StepFacts, threshold: float, own: StepFacts | None = None
) -> CollectiveReading:
    """One collective's reading from its steps' facts, and from ``own`` (the facts of the waits
    with each rank's run-queue wait before the collective added back, where every rank read
    it): the late rule (module doc)."""
    lateness = float(np.median(steps.behind))
    behind = stands_out(steps, threshold)
    cpu_wait = steps.cpu_wait_ms
    if cpu_wait is None and own is not None:  # node summaries: what adding the waits back took
        # off (where the own reading's candidate is another rank, the candidate's own lateness
        # is at most that rank's: the part its CPU waits explain is at least this)
        cpu_wait = lateness - max(float(np.median(own.behind)), 0.0)
    discounted = lateness - min(max(cpu_wait or 0.0, 0.0), lateness)  # not a CPU wait
    # step by step, the scheduler's part taken off every rank's arrival (``own``: what is left
    # of a late rank's lateness is steady from step to step); else, over the window, the
    # candidate's extra wait for a CPU taken off its lateness
    named = (
        stands_out(own, threshold, steady=True)
        if own is not None
        else behind and discounted >= threshold
    )
    held = behind and not named and discounted < threshold
    by = own if named and own is not None else steps
    family, bucket, stage, call = key
    return CollectiveReading(
        family=family,
        bucket=bucket,
        stage=stage,
        call=call,
        nbytes=nbytes,
        reached_ms=float(np.median(steps.reached)),
        last_bucket=False,
        steps=len(steps.shortest),
        transfer_ms=float(np.median(steps.shortest)),
        wait_ms=float(np.median(steps.mean - steps.shortest)),
        spread_ms=float(np.median(steps.longest - steps.shortest)),
        late_rank=by.late if named else None,
        lateness_ms=float(np.median(by.behind)) if named else 0.0,
        late_steps=int((steps.last == by.late).sum()) if named else 0,
        bound_ms=max(steps.bound_ms, 0.0 if own is None else own.bound_ms),
        starved_rank=steps.late if held else None,
        starved_lateness_ms=lateness if held else 0.0,
        cpu_wait_ms=cpu_wait,
    )


def _first_late(readings: Sequence[CollectiveReading]) -> CollectiveReading | None:
    """The collective the late rank is named in (``FIRST_LATE_FRACTION``)."""
    late = [r for r in readings if r.late_rank is not None]
    if not late:
        return None
    most = max(r.lateness_ms for r in late)
    return min(
        (r for r in late if r.lateness_ms >= FIRST_LATE_FRACTION * most),
        key=lambda r: r.reached_ms,
    )


def _with(reading: CollectiveReading, last_bucket: bool) -> CollectiveReading:
    return CollectiveReading(**{**asdict(reading), "last_bucket": last_bucket})


def rounded_reading(reading: CollectiveReading) -> dict[str, Any]:
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(reading).items()}
