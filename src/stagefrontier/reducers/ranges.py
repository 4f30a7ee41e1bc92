"""Named time ranges, as every trace format yields them, and one rank's step and stage ranges.

A reader turns its file format into ``Span`` records (name, start, duration in integer
nanoseconds, and the thread that emitted it); ``rank_ranges`` then finds the step ranges, picks
the training thread (the one that holds them) and keeps the stage ranges on that thread. What
comes out, ``RankRanges``, is plain data that the matrix builder turns into ``d [N, R, S]``.

Step ranges are recognized by name:

* ``ProfilerStep#N``: written by ``torch.profiler.profile.step()``; N is the step id.
* ``stagefrontier.step`` or ``stagefrontier.step#N`` (the name is a parameter): a range the
  training loop emits around each optimizer step. Without ``#N`` the step ids are ordinals.

A range named ``<stage>@step#N`` is a between-step wait a capturing rank recorded for step N
(``analysis.wait_rule``): kept apart in ``RankRanges.waits`` and charged to step N.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..analysis.wait_rule import parse_wait_range
from .errors import TraceFormatError
from .options import TraceOptions

PROFILER_STEP = "ProfilerStep"

_PROFILER_STEP = re.compile(r"^ProfilerStep\s*#\s*(\d+)$")
MAX_SEEN_NAMES = 20
"""Other range names on the training thread kept to explain a missing stage."""

Thread = tuple[str, str]
"""(process id, thread id) as text: traces spell them as numbers or labels."""

MAX_SPAN_NS = 1 << 50
"""About 13 days: a longer range is corrupt (and sums of such ranges stay exact in int64)."""
MAX_TIME_NS = 1 << 62
"""Start times beyond this (about 146 years from the trace's zero) are corrupt."""


def span_times(ts_us: object, dur_us: object) -> tuple[int, int] | str:
    """A range's start and duration in integer nanoseconds from microsecond ``ts`` and ``dur``
    (as Chrome traces give them), or why they are unusable: not numbers, not finite, a negative
    ``dur``, or out of range."""
    for value in (ts_us, dur_us):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "ts/dur not a number"
        if isinstance(value, float) and not math.isfinite(value):
            return "non-finite ts/dur"
    assert isinstance(ts_us, int | float) and isinstance(dur_us, int | float)
    if dur_us < 0:
        return "negative dur"
    start, length = ts_us * 1000, dur_us * 1000
    if abs(start) > MAX_TIME_NS or length > MAX_SPAN_NS:
        return "ts/dur out of range"
    return round(start), round(length)


def skipped_text(reasons: Counter[str]) -> str:
    """``3 range(s) (negative dur: 2, non-finite ts/dur: 1)``."""
    detail = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items()))
    return f"{sum(reasons.values())} range(s) ({detail})"


@dataclass(frozen=True)
class Span:
    """One named range: start and duration in integer nanoseconds on the trace's clock."""

    name: str
    start_ns: int
    dur_ns: int
    thread: Thread

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@dataclass(frozen=True)
class RankRanges:
    """One rank's step ranges (sorted by start, ids unique) and ordered-stage ranges, all on
    its training thread, with where they came from."""

    rank: int
    files: tuple[str, ...]
    step_ids: tuple[int, ...]
    steps: tuple[Span, ...]
    stages: dict[str, tuple[Span, ...]]
    step_kind: str
    """``"profiler"`` or ``"annotation"``."""
    ordinal_ids: bool
    """True when the step ranges carry no id and were numbered 0, 1, ... in time order."""
    thread: Thread
    seen_names: tuple[str, ...] = ()
    """Some other range names on the training thread (to explain a missing stage)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    off_thread: dict[str, int] = field(default_factory=dict)
    """How many ranges of each stage (or candidate) name lie on other threads (ignored)."""
    waits: dict[str, tuple[tuple[Span, int], ...]] = field(default_factory=dict)
    """Between-step wait ranges per stage on the training thread, with the step each is for."""


def step_kind_of(name: str, step_name: str) -> tuple[str, int | None] | None:
    """``("profiler", N)``, ``("annotation", N or None)``, or None for any other range name."""
    match = _PROFILER_STEP.match(name)
    if match:
        return "profiler", int(match.group(1))
    if name == step_name:
        return "annotation", None
    if name.startswith(step_name + "#"):
        tail = name[len(step_name) + 1 :]
        if tail.isdigit():
            return "annotation", int(tail)
    return None


def wanted_name(name: str, stages: frozenset[str] | None, step_name: str) -> bool:
    """Whether a reader must keep a range of this name: a stage, a step range or a stage's
    between-step wait; with no stage list (``None``: the stages are inferred) every range is a
    candidate."""
    if stages is None or name in stages:
        return True
    if name.startswith(PROFILER_STEP) or name == step_name or name.startswith(step_name + "#"):
        return True
    wait = parse_wait_range(name)
    return wait is not None and wait[0] in stages


def rank_ranges(
    spans: Iterable[Span],
    stages: Sequence[str] | None,
    options: TraceOptions,
    *,
    rank: int,
    label: str,
    seen: Iterable[tuple[str, Thread]] = (),
) -> RankRanges:
    """Select one rank's step ranges and the stage ranges on their thread.

    Args:
        spans: every stage and step range of one process (other names are ignored).
        stages: the timed stage names (without the computed residual); None keeps every range
            on the step thread as a candidate stage (to infer the stages from).
        options: the step annotation's name and where step ranges come from are read here.
        rank: the rank these ranges belong to.
        label: the file (and process) they came from, for messages.
        seen: (name, thread) of other named ranges, to list in a missing-stage message.

    Raises:
        TraceFormatError: no step range of the requested kind, or a step id that repeats.
    """
    step_name = options.step_name
    stage_set = None if stages is None else frozenset(stages)
    by_kind: dict[str, list[tuple[Span, int | None]]] = {"profiler": [], "annotation": []}
    stage_spans: list[Span] = []
    wait_spans: list[tuple[Span, str, int]] = []
    for span in spans:
        kind = step_kind_of(span.name, step_name)
        wait = None if kind is not None else parse_wait_range(span.name)
        if kind is not None:
            by_kind[kind[0]].append((span, kind[1]))
        elif wait is not None:
            if stage_set is None or wait[0] in stage_set:
                wait_spans.append((span, *wait))
        elif stage_set is None or span.name in stage_set:
            stage_spans.append(span)
    kind_name = _choose_kind(by_kind, options.step_source, step_name, label)
    candidates = by_kind[kind_name]
    notes: list[str] = []
    threads = Counter(span.thread for span, _ in candidates)
    thread = threads.most_common(1)[0][0]
    if len(threads) > 1:
        notes.append(
            f"{label}: step ranges on {len(threads)} threads; using thread {thread[1]} "
            f"of process {thread[0]} ({threads[thread]} steps), ignoring the others"
        )
    steps = sorted((c for c in candidates if c[0].thread == thread), key=lambda c: c[0].start_ns)
    ids: list[int]
    ordinal = any(step_id is None for _, step_id in steps)
    if ordinal:
        ids = list(range(len(steps)))
        notes.append(
            f"{label}: step ranges carry no step number; steps are numbered 0, 1, ... in time "
            "order, so ranks align only if their captures start at the same step"
        )
    else:
        ids = [step_id for _, step_id in steps if step_id is not None]
        repeated = sorted(step_id for step_id, n in Counter(ids).items() if n > 1)
        if repeated:
            raise TraceFormatError(
                f"{label}: step id(s) {id_text(repeated)} appear more than once on the "
                "training thread"
            )
    on_thread: dict[str, list[Span]] = {name: [] for name in stages or ()}
    off_thread: Counter[str] = Counter()
    for span in stage_spans:
        if span.thread == thread:
            on_thread.setdefault(span.name, []).append(span)
        else:
            off_thread[span.name] += 1
    waits: dict[str, list[tuple[Span, int]]] = {}
    for span, stage, step in wait_spans:
        if span.thread == thread:
            waits.setdefault(stage, []).append((span, step))
    seen_names = sorted(
        {name for name, t in seen if t == thread and (stage_set is None or name not in stage_set)}
    )
    return RankRanges(
        rank=rank,
        files=(label,),
        step_ids=tuple(ids),
        steps=tuple(span for span, _ in steps),
        stages={name: tuple(sorted(v, key=lambda s: s.start_ns)) for name, v in on_thread.items()},
        step_kind=kind_name,
        ordinal_ids=ordinal,
        thread=thread,
        seen_names=tuple(seen_names[:MAX_SEEN_NAMES]),
        notes=tuple(notes),
        off_thread=dict(off_thread),
        waits={name: tuple(v) for name, v in waits.items()},
    )


def _choose_kind(
    by_kind: dict[str, list[tuple[Span, int | None]]],
    step_source: str,
    step_name: str,
    label: str,
) -> str:
    if step_source == "auto":
        kind = "profiler" if by_kind["profiler"] else "annotation"
    else:
        kind = step_source
    if not by_kind[kind]:
        wanted = {
            "auto": f"ProfilerStep#N or {step_name!r}",
            "profiler": "ProfilerStep#N",
            "annotation": repr(step_name),
        }[step_source]
        raise TraceFormatError(
            f"{label}: no step ranges ({wanted}) found; capture with a torch.profiler schedule "
            "and call prof.step() every step, or emit one range per step"
        )
    return kind


def merge_rank_ranges(parts: Sequence[RankRanges]) -> RankRanges:
    """Join the ranges of one rank found in several files (e.g. one per profiler cycle).

    Parts are taken in time order. Ordinal step numbers continue across parts; real step ids
    must not repeat.
    """
    if len(parts) == 1:
        return parts[0]
    ordered = sorted(parts, key=lambda p: p.steps[0].start_ns)
    rank = ordered[0].rank
    kinds = {p.step_kind for p in ordered}
    files = tuple(f for p in ordered for f in p.files)
    if len(kinds) > 1:
        raise TraceFormatError(
            f"rank {rank}: files {', '.join(files)} mix ProfilerStep and annotation step ranges"
        )
    ordinal = any(p.ordinal_ids for p in ordered)
    ids: list[int] = []
    for part in ordered:
        ids.extend(range(len(ids), len(ids) + len(part.step_ids)) if ordinal else part.step_ids)
    repeated = sorted(step_id for step_id, n in Counter(ids).items() if n > 1)
    if repeated:
        raise TraceFormatError(
            f"rank {rank}: step id(s) {id_text(repeated)} appear in more than one of "
            f"{', '.join(files)}"
        )
    names = dict.fromkeys(name for p in ordered for name in p.stages)
    stages = {name: tuple(s for p in ordered for s in p.stages.get(name, ())) for name in names}
    seen = sorted({n for p in ordered for n in p.seen_names})
    return RankRanges(
        rank=rank,
        files=files,
        step_ids=tuple(ids),
        steps=tuple(s for p in ordered for s in p.steps),
        stages=stages,
        step_kind=ordered[0].step_kind,
        ordinal_ids=ordinal,
        thread=ordered[0].thread,
        seen_names=tuple(seen[:MAX_SEEN_NAMES]),
        notes=tuple(n for p in ordered for n in p.notes),
        off_thread=dict(sum((Counter(p.off_thread) for p in ordered), Counter())),
        waits={
            name: tuple(w for p in ordered for w in p.waits.get(name, ()))
            for name in dict.fromkeys(name for p in ordered for name in p.waits)
        },
    )


def outermost(spans: Sequence[Span]) -> list[Span]:
    """Spans (sorted by start) without those starting inside an earlier kept span."""
    kept: list[Span] = []
    reach = None
    for span in spans:
        if reach is not None and span.start_ns < reach:
            continue
        kept.append(span)
        reach = span.end_ns
    return kept


def id_text(ids: Sequence[int], limit: int = 8) -> str:
    """Step ids as short text: runs collapsed (``3-7, 9``), at most ``limit`` runs."""
    runs: list[str] = []
    values = sorted(ids)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        runs.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    if len(runs) > limit:
        return ", ".join(runs[:limit]) + f", ... ({len(values)} in all)"
    return ", ".join(runs)
