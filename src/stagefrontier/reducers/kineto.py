"""PyTorch Profiler (Kineto) Chrome traces to the ordered stage matrix.

Input: ``.json`` or ``.json.gz`` files as written by ``prof.export_chrome_trace(path)`` or by
``torch.profiler.tensorboard_trace_handler(dir)`` (one file per rank and profiler cycle), given
one by one or as a folder. What is read:

* the rank: an explicit ``ranks`` mapping, else the trace's ``distributedInfo.rank`` (written
  when torch.distributed is initialized), else rank 0 for a single file;
* the steps: complete (``"ph": "X"``) ``ProfilerStep#N`` ranges, else ranges named like the step
  annotation (``stagefrontier.step`` or ``stagefrontier.step#N``);
* the stages: complete ranges of category ``user_annotation`` (what ``record_function`` writes
  in the torch 2.x traces checked here; ``cpu_op`` is accepted too) named exactly like the
  ordered stages, on the training thread (the thread that holds the step ranges). Without a
  stage list, the ``user_annotation`` ranges there are the candidates the stages are inferred
  from (``infer.py``). The ``gpu_user_annotation`` mirrors on GPU streams are never used.

Times: ``ts`` and ``dur`` are microseconds with nanosecond decimals. Recent traces give ``ts``
relative to ``baseTimeNanoseconds`` (an absolute ns base in the header), older ones absolute. The
reduction only subtracts times within one trace, so both work; the absolute start of a trace is
used to order several files of one rank.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..analysis.schema import stage_of_range
from .errors import TraceFormatError
from .files import (
    KINETO_SUFFIXES,
    Paths,
    RankMap,
    mapped_rank,
    open_maybe_gzip,
    read_trace_bytes,
)
from .matrix import build_matrix, reducer_inputs
from .options import TraceOptions
from .ranges import (
    MAX_TIME_NS,
    RankRanges,
    Span,
    Thread,
    merge_rank_ranges,
    rank_ranges,
    skipped_text,
    span_times,
    step_kind_of,
    wanted_name,
)
from .result import ReducedTrace

RANGE_CATEGORIES = frozenset({"user_annotation", "cpu_op"})
"""Categories of host ranges that may be steps or stages (``record_function`` ranges)."""

HEADER_PEEK_BYTES = 1 << 20
_READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, RecursionError)


@dataclass(frozen=True)
class KinetoFile:
    """The parts of one trace file the reduction needs."""

    path: Path
    header: dict[str, Any]
    spans: tuple[Span, ...]
    seen: frozenset[tuple[str, Thread]]
    """(name, thread) of the other ``user_annotation`` ranges."""
    skipped: Counter[str]
    """Ranges with a wanted name but a malformed ``ts`` or ``dur``, by reason."""

    @property
    def time_base(self) -> str:
        return "baseTimeNanoseconds" if _base_ns(self.header) is not None else "absolute"


def reduce_kineto(
    paths: Paths,
    stages: Sequence[str] | None = None,
    options: TraceOptions | None = None,
    *,
    loaded: Mapping[Path, tuple[dict[str, Any], list[Any]]] | None = None,
    **keywords: Any,
) -> ReducedTrace:
    """Reduce PyTorch Profiler traces to ``d [N, R, S]`` seconds.

    Args:
        paths: a trace file, a folder of traces, or a list of either.
        stages: the ordered stage names. None infers them from the ranges on the step thread
            (see ``stagefrontier.reducers.infer``). The residual ``step.other_cpu_wall`` is
            computed, never read from the trace.
        options: a ``TraceOptions``; or give its fields as keywords (``ranks={...}``,
            ``missing_ranks="allow"``, ...). ``world_size`` defaults to the traces'
            ``distributedInfo.world_size``; an explicit rank mapping wins over
            ``distributedInfo.rank``.
        loaded: ``load_trace``'s header and events of some files, already read (the router
            reduces and op-diffs the same traces: each is parsed once).

    Raises:
        TraceFormatError: (or a subclass) a trace that cannot be reduced, naming the file.
    """
    opts, timed, files = reducer_inputs(
        "reduce_kineto", paths, KINETO_SUFFIXES, "PyTorch Profiler", stages, options, keywords
    )
    read = [
        read_kineto_file(path, timed, opts.step_name, (loaded or {}).get(path)) for path in files
    ]
    notes: list[str] = []
    facts: dict[str, Any] = {}
    parts: dict[int, list[RankRanges]] = {}
    for item in read:
        rank = resolve_rank(
            item.path, item.header, opts.ranks, single=len(read) == 1, notes=notes, facts=facts
        )
        if item.skipped:
            notes.append(f"{item.path}: {skipped_text(item.skipped)} skipped: malformed ts/dur")
        ranges = rank_ranges(
            item.spans, timed, opts, rank=rank, label=str(item.path), seen=item.seen
        )
        parts.setdefault(rank, []).append(ranges)
    bases = sorted({item.time_base for item in read})
    world_size = opts.world_size
    if world_size is None:
        world_size = header_world_size([(item.path, item.header) for item in read])
    return build_matrix(
        [merge_rank_ranges(group) for group in parts.values()],
        timed,
        opts,
        source="kineto",
        world_size=world_size,
        meta={"time_base": bases[0] if len(bases) == 1 else "mixed", **facts},
        notes=notes,
    )


def read_kineto_file(
    path: Path,
    stages: Sequence[str] | None,
    step_name: str,
    loaded: tuple[dict[str, Any], list[Any]] | None = None,
) -> KinetoFile:
    """Parse one trace file and keep its step and stage ranges (absolute integer ns); with no
    stage list, every ``user_annotation`` range (the candidates to infer the stages from).

    Raises:
        TraceFormatError: unreadable, or every step range it holds has a malformed ts/dur.
    """
    header, events = load_trace(path) if loaded is None else loaded
    base = _base_ns(header) or 0
    wanted = None if stages is None else frozenset(stages)
    spans: list[Span] = []
    seen: set[tuple[str, Thread]] = set()
    skipped: Counter[str] = Counter()
    bad_steps: Counter[str] = Counter()
    for event in events:
        if event.get("ph") != "X":
            continue
        category, name = event.get("cat"), event.get("name")
        if not isinstance(category, str) or category not in RANGE_CATEGORIES:
            continue
        if not isinstance(name, str):
            continue
        name = stage_of_range(name)
        thread = (str(event.get("pid")), str(event.get("tid")))
        annotation = category == "user_annotation"
        # Inferring the stages, only record_function ranges are candidates, not operators.
        candidates = wanted if annotation or wanted is not None else frozenset()
        if not wanted_name(name, candidates, step_name):
            if annotation:
                seen.add((name, thread))
            continue
        times = span_times(event.get("ts"), event.get("dur"))
        if isinstance(times, str):
            skipped[times] += 1
            if step_kind_of(name, step_name) is not None:
                bad_steps[times] += 1
            continue
        spans.append(Span(name, base + times[0], times[1], thread))
    if bad_steps and not any(step_kind_of(s.name, step_name) for s in spans):
        raise TraceFormatError(
            f"{path}: no usable step range: every one is malformed, {skipped_text(bad_steps)}"
        )
    return KinetoFile(path, header, tuple(spans), frozenset(seen), skipped)


def _base_ns(header: dict[str, Any]) -> int | None:
    base = header.get("baseTimeNanoseconds")
    if isinstance(base, bool) or not isinstance(base, int) or abs(base) > MAX_TIME_NS:
        return None
    return base


def load_trace(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """The header (every top-level key but ``traceEvents``) and the event list of a trace.

    A bare JSON array of events (the Chrome trace array format) has an empty header.

    Raises:
        TraceFormatError: unreadable, over the trace size limit, not JSON, nested too deeply,
            not a Chrome trace, or an event that is not a JSON object.
    """
    text = read_trace_bytes(path)
    try:
        data = json.loads(text)
    except _READ_ERRORS as exc:
        raise TraceFormatError(f"{path}: not a readable JSON trace: {exc}") from None
    if isinstance(data, list):
        header, events = {}, data
    elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        events = data.pop("traceEvents")
        header = data
    else:
        raise TraceFormatError(f"{path}: not a Chrome trace (no traceEvents list)")
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise TraceFormatError(
                f"{path}: not a Chrome trace: event {i} is a JSON {_json_kind(event)}, not an "
                "event object"
            )
    return header, events


RANGE_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur")
"""The fields of an event that the range readers read (``read_kineto_file``, the router's trace
slice and op diff): never its ``args``."""


def load_trace_ranges(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """``load_trace`` with each event cut to ``RANGE_FIELDS`` (a field the event lacks, or holds
    null, is left out), for readers that read no other field.

    msgspec decodes the events without building their other fields (the ``args`` of every
    operator): about a third of the standard library's CPU on a profiler's trace. For a file
    msgspec does not read as a Chrome trace object (a bare event array, an event that is not an
    object, a number out of range), this is ``load_trace``, whose full events hold the same
    values in those fields.

    Raises what ``load_trace`` raises."""
    decoders = _range_decoders()
    text = read_trace_bytes(path)
    try:
        parts = decoders.top.decode(text)
        events = decoders.events.decode(parts.pop("traceEvents"))
        header = {key: decoders.value.decode(raw) for key, raw in parts.items()}
    except (ValueError, KeyError, RecursionError):  # load_trace says why, in its words
        return load_trace(path)
    return header, msgspec.to_builtins(events)


class _RangeEvent(msgspec.Struct, gc=False, omit_defaults=True):
    """An event cut to ``RANGE_FIELDS``. Only scalars or decoded JSON in the fields, never a
    cycle: untracked by the garbage collector."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None


@dataclass(frozen=True)
class _RangeDecoders:
    top: msgspec.json.Decoder[dict[str, msgspec.Raw]]  # an object's members, left undecoded
    events: msgspec.json.Decoder[list[_RangeEvent]]  # a list of events cut to RANGE_FIELDS
    value: msgspec.json.Decoder[Any]


@functools.cache
def _range_decoders() -> _RangeDecoders:
    """msgspec's decoders for ``load_trace_ranges``, built once."""
    return _RangeDecoders(
        top=msgspec.json.Decoder(dict[str, msgspec.Raw]),
        events=msgspec.json.Decoder(list[_RangeEvent]),
        value=msgspec.json.Decoder(),
    )


def _json_kind(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def read_header(path: Path) -> dict[str, Any]:
    """The top-level keys before ``traceEvents``, read from the start of the file only.

    Kineto writes the header (distributedInfo, baseTimeNanoseconds, ...) before the events; a
    file laid out otherwise is parsed whole.
    """
    try:
        with open_maybe_gzip(path) as handle:
            head = handle.read(HEADER_PEEK_BYTES)
    except _READ_ERRORS as exc:
        raise TraceFormatError(f"{path}: not a readable JSON trace: {exc}") from None
    key = head.find(b'"traceEvents"')
    if key > 0:
        text = head[:key].rstrip().rstrip(b",") + b"}"
        try:
            header = json.loads(text)
        except ValueError:
            header = None
        if isinstance(header, dict):
            return header
    return load_trace(path)[0]


def resolve_rank(
    path: Path,
    header: dict[str, Any],
    ranks: RankMap | None,
    *,
    single: bool,
    notes: list[str],
    facts: dict[str, Any],
) -> int:
    """A file's rank: the explicit mapping, else ``distributedInfo.rank``, else 0 when it is the
    only file (said in ``facts["rank"]``: a fact about the input, not a telemetry problem, so it
    does not make the window ``telemetry_limited`` the way ``notes`` do).

    Raises:
        TraceFormatError: several files and no way to tell this one's rank.
    """
    embedded = _distributed(header).get("rank")
    if isinstance(embedded, bool) or not isinstance(embedded, int):
        embedded = None
    explicit = mapped_rank(path, ranks)
    if explicit is not None:
        if embedded is not None and embedded != explicit:
            notes.append(
                f"{path}: the rank mapping says {explicit}, distributedInfo says {embedded}; "
                "using the mapping"
            )
        return explicit
    if embedded is not None:
        return embedded
    if single:
        facts["rank"] = "0 (the only file, without distributedInfo.rank)"
        return 0
    raise TraceFormatError(
        f"{path}: cannot tell its rank: the trace has no distributedInfo.rank (torch.distributed "
        "was not initialized when it was captured); pass an explicit rank mapping"
    )


def header_world_size(headers: Sequence[tuple[Path, dict[str, Any]]]) -> int | None:
    """The world size the traces' headers (``(path, header)`` pairs) agree on, None when none
    states it.

    Raises:
        TraceFormatError: two files state different world sizes (traces of different jobs).
    """
    sizes = {}
    for path, header in headers:
        size = _distributed(header).get("world_size")
        if isinstance(size, int) and not isinstance(size, bool):
            sizes[path] = size
    if len(set(sizes.values())) > 1:
        detail = ", ".join(f"{p.name}: {s}" for p, s in sizes.items())
        raise TraceFormatError(f"the traces state different world sizes ({detail})")
    return next(iter(sizes.values()), None)


def _distributed(header: dict[str, Any]) -> dict[str, Any]:
    info = header.get("distributedInfo")
    return info if isinstance(info, dict) else {}
