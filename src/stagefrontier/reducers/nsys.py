"""Nsight Systems SQLite exports to the ordered stage matrix.

Input: files written by ``nsys export --type sqlite report.nsys-rep`` (one per rank, e.g. from
``nsys profile -o report_rank%q{RANK} ...``), given one by one or as a folder of ``.sqlite``.

Schema used (the published export schema; tables are created lazily, so only these are needed):

* ``NVTX_EVENTS(start, end, eventType, text, textId, globalTid, ...)``: times in integer ns.
  Ranges are ``eventType`` 59 (``NvtxPushPopRange``, e.g. ``torch.cuda.nvtx.range_push``) and 60
  (``NvtxStartEndRange``); when the export has ``ENUM_NSYS_EVENT_TYPE`` the ids are looked up by
  those names there. The range name is ``text``, or ``StringIds.value`` for ``textId`` (a
  registered string). Ranges without an end (still open when capture stopped) are skipped.
* ``globalTid`` packs the process and thread: ``pid = (globalTid >> 24) & 0xFFFFFF``,
  ``tid = globalTid & 0xFFFFFF``.

The rank of a file: an explicit ``ranks`` mapping, else a rank in the file name (``rank3`` or a
trailing ``_3``), else 0 for a single file. A report holding several training processes (nsys
wrapped around the launcher) needs ``process_ranks`` (pid -> rank). Steps and stages are found
as in ``reduce_kineto``: ``ProfilerStep#N`` ranges if any, else the step annotation; without a
stage list, every NVTX range on the step thread is a candidate to infer the stages from.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, TypeGuard

from ..analysis.schema import stage_of_range
from .errors import TraceFormatError
from .files import (
    NSYS_SUFFIXES,
    Paths,
    mapped_rank,
    rank_from_name,
)
from .matrix import build_matrix, reducer_inputs
from .options import TraceOptions
from .ranges import (
    MAX_SPAN_NS,
    MAX_TIME_NS,
    RankRanges,
    Span,
    Thread,
    rank_ranges,
    step_kind_of,
    wanted_name,
)
from .result import ReducedTrace

PUSH_POP_RANGE = 59
START_END_RANGE = 60
RANGE_TYPE_NAMES = {"NvtxPushPopRange": PUSH_POP_RANGE, "NvtxStartEndRange": START_END_RANGE}
SQLITE_MAGIC = b"SQLite format 3\x00"


def reduce_nsys(
    paths: Paths,
    stages: Sequence[str] | None = None,
    options: TraceOptions | None = None,
    **keywords: Any,
) -> ReducedTrace:
    """Reduce Nsight Systems SQLite exports to ``d [N, R, S]`` seconds from NVTX ranges.

    Arguments as for ``reduce_kineto``; ``process_ranks`` (pid -> rank) maps a report that holds
    several training processes. The exports carry no world size: pass ``world_size`` to have
    missing ranks detected.

    Raises:
        TraceFormatError: (or a subclass) a trace that cannot be reduced, naming the file.
    """
    opts, timed, files = reducer_inputs(
        "reduce_nsys", paths, NSYS_SUFFIXES, "Nsight Systems SQLite", stages, options, keywords
    )
    notes: list[str] = []
    parts: list[RankRanges] = []
    for path in files:
        spans, seen, skipped = read_nvtx_ranges(path, timed, opts.step_name)
        notes.extend(f"{path}: {n} NVTX range(s) {why} skipped" for why, n in skipped.items())
        parts.extend(_file_ranks(path, spans, seen, timed, opts, len(files), notes))
    if opts.world_size is None:
        notes.append("Nsight exports carry no world size: missing ranks cannot be detected")
    return build_matrix(parts, timed, opts, source="nsys", world_size=opts.world_size, notes=notes)


def split_global_tid(global_tid: int) -> Thread:
    """(pid, tid) as text from an Nsight serialized ``globalTid``."""
    return str((global_tid >> 24) & 0xFFFFFF), str(global_tid & 0xFFFFFF)


def read_nvtx_ranges(
    path: Path, stages: Sequence[str] | None, step_name: str
) -> tuple[list[Span], set[tuple[str, Thread]], Counter[str]]:
    """The NVTX ranges named like a stage or a step (every range with no stage list), the
    (name, thread) of the other ranges, and how many were skipped, by reason (no end, or a
    start, end or ``globalTid`` that is no integer in range).

    Raises:
        TraceFormatError: not an SQLite file, or no NVTX_EVENTS table.
    """
    with path.open("rb") as handle:
        if handle.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise TraceFormatError(
                f"{path}: not an SQLite database; export the report first with "
                "nsys export --type sqlite"
            )
    try:
        with closing(sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)) as db:
            rows = _query(db, path)
    except sqlite3.Error as exc:
        raise TraceFormatError(f"{path}: unreadable Nsight export: {exc}") from None
    wanted = None if stages is None else frozenset(stages)
    spans: list[Span] = []
    seen: set[tuple[str, Thread]] = set()
    skipped: Counter[str] = Counter()
    for start, end, name, global_tid in rows:
        if not isinstance(name, str):
            continue
        name = stage_of_range(name)
        if not _is_int(global_tid if global_tid is not None else 0):
            skipped["with a globalTid that is not an integer"] += 1
            continue
        thread = split_global_tid(global_tid or 0)
        if not wanted_name(name, wanted, step_name):
            seen.add((name, thread))
            continue
        if end is None or start is None:
            skipped["without an end"] += 1
        elif not (_is_int(start) and _is_int(end)) or not 0 <= end - start <= MAX_SPAN_NS:
            skipped["with a start or end that is not an integer in range"] += 1
        else:
            spans.append(Span(name, start, end - start, thread))
    return spans, seen, skipped


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_TIME_NS


def _query(db: sqlite3.Connection, path: Path) -> list[tuple[int, int | None, str | None, int]]:
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "NVTX_EVENTS" not in tables:
        raise TraceFormatError(
            f"{path}: no NVTX_EVENTS table: the report has no NVTX ranges (profile with -t nvtx "
            "and emit the stage ranges)"
        )
    columns = {row[1] for row in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    missing = {"start", "end", "eventType", "globalTid"} - columns
    if missing or not ({"text", "textId"} & columns):
        raise TraceFormatError(
            f"{path}: NVTX_EVENTS lacks column(s) {', '.join(sorted(missing)) or 'text/textId'}"
        )
    types = _range_types(db, tables)
    if "textId" in columns and "StringIds" in tables:
        text = "n.text" if "text" in columns else "NULL"
        name = f"COALESCE({text}, s.value)"
        join = "LEFT JOIN StringIds AS s ON s.id = n.textId"
    else:
        name, join = "n.text", ""
    marks = ",".join("?" * len(types))
    sql = (
        f'SELECT n.start, n."end", {name}, n.globalTid FROM NVTX_EVENTS AS n {join} '
        f"WHERE n.eventType IN ({marks})"
    )
    return list(db.execute(sql, types))


def _range_types(db: sqlite3.Connection, tables: set[str]) -> list[int]:
    """The eventType ids of push/pop and start/end ranges, from the export's enum if present."""
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        found = dict(db.execute("SELECT name, id FROM ENUM_NSYS_EVENT_TYPE"))
        ids = [found[n] for n in RANGE_TYPE_NAMES if _is_int(found.get(n))]
        if ids:
            return ids
    return list(RANGE_TYPE_NAMES.values())


def _file_ranks(
    path: Path,
    spans: list[Span],
    seen: set[tuple[str, Thread]],
    stages: Sequence[str] | None,
    options: TraceOptions,
    n_files: int,
    notes: list[str],
) -> list[RankRanges]:
    """One ``RankRanges`` per training process in the file (normally exactly one)."""
    step_pids = sorted(
        {int(s.thread[0]) for s in spans if step_kind_of(s.name, options.step_name) is not None}
    )
    process_ranks = options.process_ranks
    if len(step_pids) > 1:
        if not process_ranks:
            raise TraceFormatError(
                f"{path}: step ranges from {len(step_pids)} processes ({step_pids}); capture one "
                "report per rank (-o report_rank%q{RANK}) or pass process_ranks={pid: rank}"
            )
        unknown = [pid for pid in step_pids if pid not in process_ranks]
        if unknown:
            raise TraceFormatError(f"{path}: process_ranks gives no rank for process(es) {unknown}")
        return [
            rank_ranges(
                [s for s in spans if s.thread[0] == str(pid)],
                stages,
                options,
                rank=process_ranks[pid],
                label=f"{path} (process {pid})",
                seen=seen,
            )
            for pid in step_pids
        ]
    rank = mapped_rank(path, options.ranks)
    if rank is None:
        rank = rank_from_name(path)
    if rank is None:
        if n_files > 1:
            raise TraceFormatError(
                f"{path}: cannot tell its rank: name the reports with the rank "
                "(-o report_rank%q{RANK}) or pass an explicit rank mapping"
            )
        rank = 0
        notes.append(f"{path}: no rank in the file name; taken as rank 0 (the only file)")
    return [rank_ranges(spans, stages, options, rank=rank, label=str(path), seen=seen)]
