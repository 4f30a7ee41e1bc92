"""From per-rank step and stage ranges to ``d [N, R, S]``, with the recorder's residual rule.

For each rank and step (a step range ``[start, end)``):

* a stage range belongs to the step whose range contains its start; several ranges of one stage
  in a step are summed (as the recorder sums a re-entered stage), and a range nested inside an
  earlier range of the same name is skipped (recursion would count its time twice);
* a between-step wait range (``<stage>@step#N``) belongs to step N and moves wall time with it,
  by the recorder's own rule (``analysis.wait_rule.charge_waits``);
* the residual ``step.other_cpu_wall`` is the step wall minus the timed stages, clipped at 0;
  the clipped negative part is the overlap error, reported per step and rank.

Across ranks, steps are matched by id. Ranks whose traces hold different step ids are either
cut down to the ids they share (``align="intersect"``, noted) or refused (``align="strict"``);
these modes and the two below are ``TraceOptions`` fields.
A stage with no range at all on a rank is refused (``missing_stages="error"``) unless zeros are
explicitly allowed (``"zero"``, noted); a rank of the world size without a trace is refused
(``missing_ranks="error"``) or listed as missing (``"allow"``) so the analyzer downgrades.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..analysis.schema import RESIDUAL_STAGE, check_stage_names
from ..analysis.wait_rule import charge_waits
from ..formats.limits import check_limit
from .errors import MisalignedStepsError, MissingRanksError, MissingStagesError, TraceFormatError
from .files import Paths, check_unmapped, trace_files
from .infer import infer_stages
from .options import TraceOptions, trace_options
from .ranges import RankRanges, id_text, outermost
from .result import ReducedTrace

NS = 1e-9

IntArray = npt.NDArray[np.int64]


def timed_stages(stages: Sequence[str]) -> tuple[str, ...]:
    """The stages a trace must time: the ordered list without the computed residual."""
    names = check_stage_names(stages)
    timed = tuple(s for s in names if s != RESIDUAL_STAGE)
    if not timed:
        raise TraceFormatError("at least one timed stage is needed besides the residual")
    return timed


def reducer_inputs(
    reducer: str,
    paths: Paths,
    suffixes: Sequence[str],
    kind: str,
    stages: Sequence[str] | None,
    options: TraceOptions | None,
    keywords: dict[str, Any],
) -> tuple[TraceOptions, tuple[str, ...] | None, list[Path]]:
    """What a reducer starts from: its options (given, or as keywords), the stages its traces
    must time (None: inferred from them) and the trace files, every mapped rank's among them."""
    opts = trace_options(reducer, options, keywords)
    timed = None if stages is None else timed_stages(stages)
    files = trace_files(paths, suffixes, kind)
    check_unmapped(opts.ranks, files)
    return opts, timed, files


def build_matrix(
    parts: Sequence[RankRanges],
    stages: Sequence[str] | None,
    options: TraceOptions,
    *,
    source: str,
    world_size: int | None = None,
    meta: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> ReducedTrace:
    """Reduce every rank's ranges (one ``RankRanges`` per rank) to a ``ReducedTrace``; with
    ``stages`` None, the stages are inferred from the ranges (``infer_stages``).

    Raises:
        MisalignedStepsError, MissingRanksError, MissingStagesError: see the module docstring.
        AmbiguousStageOrderError: inferring, the ranges run in different orders.
    """
    if not parts:
        raise TraceFormatError("no trace files to reduce")
    timed = timed_stages(infer_stages(parts) if stages is None else stages)
    by_rank = sorted(parts, key=lambda p: p.rank)
    ranks = [p.rank for p in by_rank]
    if len(set(ranks)) != len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceFormatError(f"rank(s) given twice: {twice}")
    all_notes = list(notes)
    for part in by_rank:
        all_notes.extend(part.notes)
        elsewhere = sum(part.off_thread.get(name, 0) for name in timed)
        if elsewhere:
            all_notes.append(
                f"{_files(part)}: {elsewhere} stage range(s) on threads other than the training "
                "thread ignored"
            )
    missing = _missing_ranks(ranks, world_size, options.missing_ranks, by_rank)
    if missing:
        all_notes.append(
            f"rank(s) {id_text(missing)} of world size {world_size} have no trace; the frontier "
            "covers only the ranks present"
        )
    common = _common_steps(by_rank, options.align, all_notes)
    per_rank = [
        _rank_matrix(part, timed, common, options.missing_stages, all_notes) for part in by_rank
    ]
    d = np.stack([m[0] for m in per_rank], axis=1).astype(np.float64) * NS
    overlap = np.stack([m[1] for m in per_rank], axis=1).astype(np.float64) * NS
    info: dict[str, Any] = {
        "step_kind": by_rank[0].step_kind,
        "ordinal_step_ids": any(p.ordinal_ids for p in by_rank),
    }
    info.update(meta or {})
    return ReducedTrace(
        d=d,
        stages=(*timed, RESIDUAL_STAGE),
        ranks=tuple(ranks),
        step_ids=tuple(common),
        overlap_s=overlap,
        source=source,
        files=tuple(p.files for p in by_rank),
        world_size=world_size,
        missing_ranks=tuple(missing),
        notes=tuple(all_notes),
        meta=info,
        stages_inferred=stages is None,
    )


def _files(part: RankRanges) -> str:
    return ", ".join(part.files)


def _missing_ranks(
    ranks: list[int], world_size: int | None, mode: str, parts: Sequence[RankRanges]
) -> list[int]:
    if world_size is None:
        return []
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise TraceFormatError(f"world size {world_size!r} is not a positive integer")
    check_limit("world_size", world_size, "the world size", TraceFormatError)
    beyond = [p for p in parts if not 0 <= p.rank < world_size]
    if beyond:
        raise TraceFormatError(
            f"{_files(beyond[0])}: rank {beyond[0].rank} is outside world size {world_size}"
        )
    missing = sorted(set(range(world_size)) - set(ranks))
    if missing and mode == "error":
        raise MissingRanksError(
            f"rank(s) {id_text(missing)} of world size {world_size} have no trace among "
            f"{', '.join(f for p in parts for f in p.files)}; pass every rank's file, or "
            "allow missing ranks (missing_ranks='allow'; --allow-missing-ranks on the command "
            "line) to analyze the ranks present (labels are then downgraded)"
        )
    return missing


def _common_steps(parts: Sequence[RankRanges], align: str, notes: list[str]) -> list[int]:
    """The step ids every rank holds, in order; notes (or refuses) the ones some rank lacks."""
    sets = [set(p.step_ids) for p in parts]
    common = set.intersection(*sets)
    if not common:
        detail = "; ".join(f"rank {p.rank}: {id_text(p.step_ids)}" for p in parts)
        raise MisalignedStepsError(f"no step id is common to every rank ({detail})")
    if all(s == common for s in sets):
        return sorted(common)
    if align == "strict":
        detail = "; ".join(f"rank {p.rank} ({_files(p)}): {id_text(p.step_ids)}" for p in parts)
        raise MisalignedStepsError(f"the ranks hold different step ids ({detail})")
    for part, ids in zip(parts, sets, strict=True):
        dropped = sorted(ids - common)
        if dropped:
            notes.append(
                f"rank {part.rank}: step(s) {id_text(dropped)} dropped: not traced on every rank"
            )
    return sorted(common)


def _rank_matrix(
    part: RankRanges,
    timed: Sequence[str],
    step_ids: Sequence[int],
    missing_stages: str,
    notes: list[str],
) -> tuple[IntArray, IntArray]:
    """``[N, S]`` integer nanoseconds (residual last) and ``[N]`` overlap for one rank."""
    order = np.argsort(np.array([s.start_ns for s in part.steps], dtype=np.int64), kind="stable")
    starts = np.array([part.steps[i].start_ns for i in order], dtype=np.int64)
    ends = np.array([part.steps[i].end_ns for i in order], dtype=np.int64)
    ids = [part.step_ids[i] for i in order]
    if len(starts) > 1 and (starts[1:] < ends[:-1]).any():
        notes.append(f"rank {part.rank}: step ranges overlap; a stage goes to the latest step")
    n_all = len(starts)
    durations = np.zeros((n_all, len(timed)), dtype=np.int64)
    counts = np.zeros((n_all, len(timed)), dtype=np.int64)
    outside = nested = crossing = 0
    wall_shift = np.zeros(n_all, dtype=np.int64)
    for k, name in enumerate(timed):
        waits = part.waits.get(name, ())
        if waits:
            items = [(step, span.start_ns, span.dur_ns) for span, step in waits]
            charged, shift, _ = charge_waits(ids, starts, ends, items)
            durations[:, k] += charged
            counts[:, k] += charged > 0
            wall_shift += shift
        kept = outermost(part.stages.get(name, ()))
        nested += len(part.stages.get(name, ())) - len(kept)
        if not kept:
            continue
        s_start = np.array([s.start_ns for s in kept], dtype=np.int64)
        s_dur = np.array([s.dur_ns for s in kept], dtype=np.int64)
        row = np.searchsorted(starts, s_start, side="right") - 1
        inside = (row >= 0) & (s_start < ends[np.maximum(row, 0)])
        outside += int((~inside).sum())
        crossing += int((s_start + s_dur > ends[np.maximum(row, 0)])[inside].sum())
        np.add.at(durations[:, k], row[inside], s_dur[inside])
        np.add.at(counts[:, k], row[inside], 1)
    if nested:
        notes.append(
            f"rank {part.rank}: {nested} stage range(s) nested in a same-name range skipped"
        )
    if outside:
        notes.append(f"rank {part.rank}: {outside} stage range(s) outside every step range ignored")
    if crossing:
        notes.append(f"rank {part.rank}: {crossing} stage range(s) run past their step's end")
    repeats = int((counts > 1).sum())
    if repeats:
        notes.append(
            f"rank {part.rank}: a stage has several ranges within one step in {repeats} "
            "(step, stage) cell(s); their durations are summed"
        )
    position = {step_id: i for i, step_id in enumerate(ids)}
    rows = np.array([position[s] for s in step_ids], dtype=np.int64)
    timed_ns = durations[rows]
    _check_stages(part, timed, counts[rows], missing_stages, notes)
    wall = (ends - starts + wall_shift)[rows]
    closure = wall - timed_ns.sum(axis=1)
    out = np.empty((len(rows), len(timed) + 1), dtype=np.int64)
    out[:, :-1] = timed_ns
    out[:, -1] = np.maximum(closure, 0)
    return out, np.maximum(-closure, 0)


def _check_stages(
    part: RankRanges, timed: Sequence[str], counts: IntArray, mode: str, notes: list[str]
) -> None:
    absent = [name for k, name in enumerate(timed) if not counts[:, k].any()]
    if absent and mode == "error":
        seen = ", ".join(part.seen_names) or "none"
        raise MissingStagesError(
            f"{_files(part)}: rank {part.rank} has no range for stage(s) {', '.join(absent)} in "
            f"the reduced steps; other range names on its training thread: {seen}. Name the "
            "stages as the trace does, or allow zero stages explicitly"
        )
    if absent:
        notes.append(f"rank {part.rank}: no range for stage(s) {', '.join(absent)}: zeros")
    empty = int((counts == 0).sum()) - len(absent) * counts.shape[0]
    if empty:
        notes.append(
            f"rank {part.rank}: {empty} (step, stage) cell(s) have no range and count as 0 s "
            "(the stage did not run in that step)"
        )
