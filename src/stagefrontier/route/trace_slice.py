"""The part of a captured trace an incident's reduction reads.

The confirmation reads the trace's annotation ranges (steps, stages, between-step waits); the op
diff reads, on the training thread, the operators and Python functions that overlap the routed
stage's ranges in the captured steps. A 5-step capture holds some 30,000 events, most of them
the forward's and backward's operators, which neither reads when the routed stage is another.
``load_for_reduction`` parses the trace once, each event cut to the fields they read
(``reducers.kineto.load_trace_ranges``: fast with msgspec installed), and keeps only the events
they read, so that both iterate a few hundred events instead of every one, with the same results
as from the whole trace.

Parsing a trace still takes tens of milliseconds of CPU, and on rank 0's router thread that CPU
holds the GIL its training thread needs. So the forked child that writes a capture's trace (see
``trace_writer``) also writes the trace's slice beside it, once it has said where the trace is
(``write_slice``: the header and the kept events, with the stage, the steps and the trace's size
they were cut for), and ``load_for_reduction`` reads that small file instead of the trace when
it was cut for the same stage and steps from the same trace. A trace written on the router
thread (a process that may not fork) gets no slice: cutting it there would hold the captured
rank's GIL as long as parsing it holds rank 0's. A slice that is missing, unreadable or cut for
anything else is ignored: the trace is parsed, as before.
"""

from __future__ import annotations

import glob
import logging
from bisect import bisect_right
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import msgspec

from ..analysis.schema import stage_of_range
from ..failures import reason
from ..formats.limits import limit
from ..formats.packet import atomic_file
from ..reducers.kineto import load_trace_ranges
from .opdiff import OP_CATEGORIES, select_ranges

logger = logging.getLogger("stagefrontier")

SLICE_SUFFIX = ".slice.json"
"""A trace's slice is named after it: ``rank2.pt.trace.json.gz`` has ``rank2.pt.trace.slice.json``
(a name the traces' ``*.pt.trace.json*`` pattern does not match)."""


class TraceSlice(msgspec.Struct, frozen=True):
    """What ``load_for_reduction`` keeps of a trace, and what it was cut for."""

    stage: str | None
    steps: list[int]
    trace_bytes: int
    header: dict[str, Any]
    events: list[Any]


def slice_path(trace: Path) -> Path:
    """Where the slice of ``trace`` is written."""
    return trace.with_name(trace.name.removesuffix(".json.gz") + SLICE_SUFFIX)


def write_slice(trace: Path, stage: str | None, steps: Sequence[int]) -> str:
    """Cut ``trace`` for the reduction of ``stage`` over ``steps`` and write the slice beside
    it (whole or not at all): why that failed, in one line, or empty when it worked. It logs
    nothing: it runs in the trace's writer, a forked child, whose parent says the failure
    (``drop_slice``)."""
    try:
        header, events = cut_trace(trace, stage, steps)
        record = TraceSlice(stage, list(steps), trace.stat().st_size, header, events)
        with atomic_file(slice_path(trace)) as out:
            out.write(msgspec.json.encode(record))
    except Exception as exc:
        return reason(exc)
    return ""


def drop_slice(trace: Path, why: str) -> None:
    """Say in one line why the slice of ``trace`` was not cut (the reduction then parses the
    trace) and remove whatever of it is left (``remove_slice``)."""
    remove_slice(trace)
    logger.warning(
        "stagefrontier: cutting the trace for the reduction failed (%s); rank 0 parses the trace",
        why,
    )


def remove_slice(trace: Path) -> None:
    """Remove the slice beside ``trace``, if any, and the temporary file of one whose writing
    did not end (a writer killed in the middle of it)."""
    target = slice_path(trace)
    left = glob.glob(glob.escape(str(target.with_name(f".{target.name}."))) + "*.tmp")
    for path in (target, *map(Path, left)):
        with suppress(OSError):
            path.unlink(missing_ok=True)


def read_slice(
    trace: Path, stage: str | None, steps: Sequence[int]
) -> tuple[dict[str, Any], list[Any]] | None:
    """The header and events of the slice beside ``trace``, when it was cut for ``stage`` over
    ``steps`` from this trace (its size unchanged); None otherwise, or when it cannot be read
    (over the trace size limit, not a slice)."""
    path = slice_path(trace)
    try:
        if path.stat().st_size > limit("trace_bytes"):
            return None
        record = msgspec.json.decode(path.read_bytes(), type=TraceSlice)
        size = trace.stat().st_size
    except (OSError, msgspec.DecodeError):
        return None
    if record.stage != stage or record.steps != list(steps) or record.trace_bytes != size:
        return None
    return record.header, record.events


def load_for_reduction(
    path: Path, stage: str | None, steps: Sequence[int]
) -> tuple[dict[str, Any], list[Any]]:
    """The header and the events of ``path`` that the reduction reads (``cut_trace``): from the
    slice beside it when one was cut for the same stage and steps (``read_slice``), else from
    the trace.

    Raises what ``load_trace`` raises."""
    found = read_slice(path, stage, steps)
    return found if found is not None else cut_trace(path, stage, steps)


def cut_trace(
    path: Path, stage: str | None, steps: Sequence[int]
) -> tuple[dict[str, Any], list[Any]]:
    """The header and the events of a captured trace that the confirmation and the op diff of
    ``stage`` over ``steps`` read: every event that is not an operator or a Python function
    (the annotation ranges among them), and the operators and Python functions of the training
    thread that overlap the stage's ranges. Every event when no stage is routed or the
    trace has no step ranges.

    Raises what ``load_trace`` raises."""
    header, events = load_trace_ranges(path)
    if not stage:
        return header, events
    spans = []
    raw: dict[tuple[str, str], tuple[Any, Any]] = {}  # a thread's pid and tid as decoded
    for e in events:
        if e.get("cat") != "user_annotation" or e.get("ph") != "X":
            continue
        name, ts, dur = e.get("name"), e.get("ts"), e.get("dur")
        if isinstance(name, str) and _number(ts) and _number(dur) and dur >= 0:
            thread = (str(e.get("pid")), str(e.get("tid")))
            raw.setdefault(thread, (e.get("pid"), e.get("tid")))
            spans.append((float(ts), float(dur), stage_of_range(name), thread))
    selected = select_ranges(spans, stage, steps)
    if selected is None:
        return header, events
    thread, _, ranges = selected
    pid, tid = raw[thread]
    starts = [r[0] for r in ranges]
    ends = [r[1] for r in ranges]
    last = len(ranges) - 1
    kept = []
    for e in events:  # ~30,000 events: one pass, the overlap test written out
        if e.get("cat") in OP_CATEGORIES:
            if e.get("tid") != tid or e.get("pid") != pid:
                continue  # another thread's
            ts, dur = e.get("ts"), e.get("dur")
            if type(ts) in _NUMBERS and type(dur) in _NUMBERS:  # else kept, for the readers
                i = bisect_right(starts, ts) - 1
                if not ((i >= 0 and ends[i] >= ts) or (i < last and starts[i + 1] <= ts + dur)):
                    continue  # outside the stage's ranges
        kept.append(e)
    return header, kept


_NUMBERS = (int, float)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
