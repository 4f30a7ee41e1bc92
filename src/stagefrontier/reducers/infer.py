"""The ordered stages of a trace reduced without a stage list: the ranges on the step thread.

Which ranges are stages: the ranges named like the default stages when the trace holds any of them
(``data.next_wait``, ``model.fwd_loss_cpu_wall``, ...: what ``StageTimer(annotate=True)`` emits and
what docs/cli.md asks a profiled loop to wrap); otherwise every range that is outermost inside a
step range (not starting inside another range of that step).

Their order: the order in which they first start within each step. It must agree across every
step of every rank: a pair met in both orders is ambiguous and refused, naming where each order
was seen. Two ranges never met in one step are ordered by their mean position within the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import NoReturn

from ..analysis.schema import DEFAULT_STAGES, RESIDUAL_STAGE
from .errors import AmbiguousStageOrderError, TraceFormatError
from .ranges import RankRanges, Span, outermost

DEFAULT_TIMED = tuple(s for s in DEFAULT_STAGES if s != RESIDUAL_STAGE)

Where = tuple[int, int]
"""(rank, step id) where an order was seen."""


def infer_stages(parts: Sequence[RankRanges]) -> tuple[str, ...]:
    """The timed stages of the ranks' ranges, in the order they run.

    Raises:
        TraceFormatError: no range at all inside the step ranges.
        AmbiguousStageOrderError: two stages run in one order in some step and in the other
            order in another.
    """
    steps = [
        (part.rank, step_id, _in_step(part, step))
        for part in parts
        for step_id, step in zip(part.step_ids, part.steps, strict=True)
    ]
    names = {span.name for _, _, spans in steps for span in spans}
    defaults = [s for s in DEFAULT_TIMED if s in names]
    if defaults:
        wanted = set(defaults)
        sequences = [
            (rank, step_id, _first_starts([s for s in spans if s.name in wanted]))
            for rank, step_id, spans in steps
        ]
    else:
        sequences = [
            (rank, step_id, _first_starts(outermost(spans))) for rank, step_id, spans in steps
        ]
    if not any(sequence for _, _, sequence in sequences):
        files = ", ".join(f for part in parts for f in part.files)
        raise TraceFormatError(
            f"{files}: no range inside the step ranges on the training thread, so no stage to "
            "infer; wrap each stage in a named range (record_function or NVTX)"
        )
    return _order(sequences)


def _in_step(part: RankRanges, step: Span) -> list[Span]:
    """The candidate ranges of ``part`` that start inside ``step``, by start."""
    return sorted(
        (
            span
            for spans in part.stages.values()
            for span in spans
            if step.start_ns <= span.start_ns < step.end_ns
        ),
        key=lambda s: s.start_ns,
    )


def _first_starts(spans: Sequence[Span]) -> list[tuple[str, float]]:
    """Each name once, in order of its first start, with that start as a fraction of the step's
    first-to-last range (for ordering names never met together)."""
    first: dict[str, int] = {}
    for span in spans:
        first.setdefault(span.name, span.start_ns)
    if not first:
        return []
    low, high = min(first.values()), max(first.values())
    scale = max(high - low, 1)
    return [(name, (start - low) / scale) for name, start in first.items()]


def _order(sequences: Sequence[tuple[int, int, list[tuple[str, float]]]]) -> tuple[str, ...]:
    """One order agreeing with every step's order (a topological sort of "runs before")."""
    before: dict[tuple[str, str], Where] = {}
    positions: dict[str, list[float]] = {}
    for rank, step_id, sequence in sequences:
        for i, (name, position) in enumerate(sequence):
            positions.setdefault(name, []).append(position)
            for later, _ in sequence[i + 1 :]:
                if (later, name) in before:
                    _ambiguous(name, later, (rank, step_id), before[(later, name)])
                before.setdefault((name, later), (rank, step_id))
    mean = {name: sum(p) / len(p) for name, p in positions.items()}
    remaining = set(mean)
    order: list[str] = []
    while remaining:
        free = [n for n in remaining if not any((m, n) in before for m in remaining if m != n)]
        if not free:
            _cycle(remaining, before)
        chosen = min(free, key=lambda n: (mean[n], n))
        order.append(chosen)
        remaining.remove(chosen)
    return tuple(order)


_GIVE_ORDER = "give the stages in order (--stages A,B,... or stages=[...])"


def _ambiguous(first: str, second: str, seen: Where, other: Where) -> NoReturn:
    raise AmbiguousStageOrderError(
        f"the stage order is ambiguous: {first} runs before {second} in rank {seen[0]} step "
        f"{seen[1]}, after it in rank {other[0]} step {other[1]}; {_GIVE_ORDER}"
    )


def _cycle(remaining: set[str], before: dict[tuple[str, str], Where]) -> NoReturn:
    """Refuse orders that are pairwise consistent but circular (a before b before c before a,
    each pair met in a different step)."""
    path = [min(remaining)]
    while path.count(path[-1]) < 2:
        path.append(min(m for m in remaining if (m, path[-1]) in before))
    loop = path[path.index(path[-1]) :][::-1]
    edges = "; ".join(
        f"{a} before {b} in rank {before[(a, b)][0]} step {before[(a, b)][1]}"
        for a, b in pairwise(loop)
    )
    raise AmbiguousStageOrderError(
        f"the stage order is ambiguous, it runs in a circle: {edges}; {_GIVE_ORDER}"
    )
