"""PyTorch Profiler traces to the ordered stage matrix through Holistic Trace Analysis.

The same reduction as ``reduce_kineto``, but the events come from HTA's per-rank dataframes
(``hta.common.trace.Trace``): a site that already loads its traces with HTA gets the matrix from
the frames it has, and the two readers check each other (tests assert equal matrices).

HTA is optional (``pip install 'stagefrontier[hta]'``) and imported only when this runs. HTA
keeps one trace file per rank (give one profiler cycle per rank) and by default rounds event
times to whole microseconds (start up, end down); the reducer turns that rounding off for the
load, so durations keep the trace's nanosecond resolution, unless ``ns_rounding=True``.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..analysis.schema import stage_of_range
from .errors import MissingDependencyError, TraceFormatError
from .files import KINETO_SUFFIXES, Paths, check_unmapped, read_trace_bytes, trace_files
from .kineto import RANGE_CATEGORIES, header_world_size, read_header, resolve_rank
from .matrix import build_matrix, timed_stages
from .options import TraceOptions, trace_options
from .ranges import (
    RankRanges,
    Span,
    Thread,
    rank_ranges,
    skipped_text,
    span_times,
    step_kind_of,
    wanted_name,
)
from .result import ReducedTrace

NS_ROUNDING_ENV = "HTA_DISABLE_NS_ROUNDING"
"""HTA's switch for its microsecond rounding of nanosecond traces (``"1"`` turns it off)."""


def reduce_hta(
    paths: Paths,
    stages: Sequence[str] | None = None,
    options: TraceOptions | None = None,
    **keywords: Any,
) -> ReducedTrace:
    """Reduce PyTorch Profiler traces to ``d [N, R, S]`` seconds via HTA's dataframes.

    Arguments as for ``reduce_kineto``; ``ns_rounding=True`` keeps HTA's default rounding of
    event times to whole microseconds.

    Raises:
        MissingDependencyError: HolisticTraceAnalysis is not installed.
        TraceFormatError: (or a subclass) a trace that cannot be reduced, naming the file.
    """
    opts = trace_options("reduce_hta", options, keywords)
    trace_cls, parser_config = _import_hta()
    timed = None if stages is None else timed_stages(stages)
    files = trace_files(paths, KINETO_SUFFIXES, "PyTorch Profiler")
    check_unmapped(opts.ranks, files)
    for path in files:  # HTA parses the files itself: hold them to the trace limits first
        read_trace_bytes(path, keep=False)
    headers = [(path, read_header(path)) for path in files]
    notes: list[str] = []
    facts: dict[str, Any] = {}
    by_rank: dict[int, Path] = {}
    for path, header in headers:
        rank = resolve_rank(
            path, header, opts.ranks, single=len(files) == 1, notes=notes, facts=facts
        )
        if rank in by_rank:
            raise TraceFormatError(
                f"{by_rank[rank]} and {path} are both rank {rank}; HTA holds one trace per rank "
                "(reduce one profiler cycle at a time, or use reduce_kineto)"
            )
        by_rank[rank] = path
    frames, symbols = _load(trace_cls, parser_config, by_rank, opts.ns_rounding)
    symbols = [stage_of_range(s) for s in symbols]  # stage ranges' names as the stages'
    parts = [
        _rank_ranges(frames[rank], symbols, rank, by_rank[rank], timed, opts)
        for rank in sorted(by_rank)
    ]
    world_size = opts.world_size
    if world_size is None:
        world_size = header_world_size(headers)
    return build_matrix(
        parts,
        timed,
        opts,
        source="hta",
        world_size=world_size,
        meta={"hta_ns_rounding": opts.ns_rounding, **facts},
        notes=notes,
    )


def _import_hta() -> tuple[Any, Any]:
    """HTA's ``Trace`` class and a parser configuration that keeps only the minimum event args
    (the reduction needs names, categories, times and threads; parsing every arg of every event
    roughly doubles HTA's load time)."""
    try:
        trace_module = importlib.import_module("hta.common.trace")
        config_module = importlib.import_module("hta.configs.parser_config")
    except ImportError as exc:
        raise MissingDependencyError(
            f"reduce_hta needs HolisticTraceAnalysis ({exc}); install it with "
            "pip install 'stagefrontier[hta]'"
        ) from None
    config_cls = config_module.ParserConfig
    return trace_module.Trace, config_cls(config_cls.get_minimum_args())


@contextmanager
def _hta_settings(ns_rounding: bool) -> Iterator[None]:
    """HTA's rounding switch and a quiet ``hta`` logger for the duration of one load."""
    saved = os.environ.get(NS_ROUNDING_ENV)
    logger = logging.getLogger("hta")
    level = logger.level
    if not ns_rounding:
        os.environ[NS_ROUNDING_ENV] = "1"
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
        if saved is None:
            os.environ.pop(NS_ROUNDING_ENV, None)
        else:
            os.environ[NS_ROUNDING_ENV] = saved


def _load(
    trace_cls: Any, parser_config: Any, by_rank: dict[int, Path], ns_rounding: bool
) -> tuple[Any, list[str]]:
    """HTA's per-rank dataframes and its symbol table (id -> name)."""
    resolved = {rank: str(path.resolve()) for rank, path in by_rank.items()}
    folder = os.path.commonpath([os.path.dirname(p) for p in resolved.values()])
    with _hta_settings(ns_rounding):
        try:
            trace = trace_cls(trace_files=resolved, trace_dir=folder, parser_config=parser_config)
            trace.load_traces(
                include_last_profiler_step=True,
                use_multiprocessing=False,
                use_memory_profiling=False,
            )
        except Exception as exc:  # HTA raises assorted errors on bad input; name the files
            files = ", ".join(str(p) for p in by_rank.values())
            raise TraceFormatError(f"HTA could not load {files}: {exc!r}") from exc
    frames = {rank: trace.get_trace(rank) for rank in by_rank}
    return frames, list(trace.symbol_table.sym_table)


def _rank_ranges(
    frame: Any,
    symbols: list[str],
    rank: int,
    path: Path,
    timed: Sequence[str] | None,
    options: TraceOptions,
) -> RankRanges:
    """One rank's ranges from its HTA dataframe (``name``/``cat`` are symbol ids, ``ts``/``dur``
    float microseconds, shifted so the earliest event of the job starts at 0)."""
    wanted = None if timed is None else frozenset(timed)
    index = {name: i for i, name in enumerate(symbols)}
    categories = [index[c] for c in RANGE_CATEGORIES if c in index]
    annotation = index.get("user_annotation", -1)
    name_ids = [i for i, name in enumerate(symbols) if wanted_name(name, wanted, options.step_name)]
    host = frame[frame["cat"].isin(categories)]
    if wanted is None:  # inferring the stages: record_function ranges only, not operators
        steps = [i for i, name in enumerate(symbols) if step_kind_of(name, options.step_name)]
        host = host[(host["cat"] == annotation) | host["name"].isin(steps)]
    rows = host[host["name"].isin(name_ids)]
    rows = rows[rows["dur"] >= 0]  # HTA's microsecond rounding can turn a tiny range negative
    spans: list[Span] = []
    skipped: Counter[str] = Counter()
    for n, ts, dur, p, t in zip(
        rows["name"], rows["ts"], rows["dur"], rows["pid"], rows["tid"], strict=True
    ):
        times = span_times(float(ts), float(dur))
        if isinstance(times, str):
            skipped[times] += 1
        else:
            spans.append(Span(symbols[int(n)], times[0], times[1], (str(p), str(t))))
    others = host[(host["cat"] == annotation) & ~host["name"].isin(name_ids)]
    seen: set[tuple[str, Thread]] = {
        (symbols[int(name)], (str(p), str(t)))
        for name, p, t in others[["name", "pid", "tid"]].drop_duplicates().itertuples(index=False)
    }
    ranges = rank_ranges(spans, timed, options, rank=rank, label=str(path), seen=seen)
    if skipped:
        note = f"{path}: {skipped_text(skipped)} skipped: malformed ts/dur"
        ranges = replace(ranges, notes=(*ranges.notes, note))
    return ranges
