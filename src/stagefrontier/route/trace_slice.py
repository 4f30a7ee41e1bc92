"""The part of a captured trace an incident's reduction reads.

The confirmation reads the trace's annotation ranges (steps, stages, between-step waits); the op
diff reads, on the training thread, the operators and Python functions that overlap the routed
stage's ranges in the captured steps. A 5-step capture holds some 30,000 events, most of them
the forward's and backward's operators, which neither reads when the routed stage is another.
``load_for_reduction`` parses the trace once, each event cut to the fields they read
(``reducers.kineto.load_trace_ranges``: fast with msgspec installed), and keeps only the events
they read, so that both iterate a few hundred events instead of every one, with the same results
as from the whole trace.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..analysis.schema import stage_of_range
from ..reducers.kineto import load_trace_ranges
from .opdiff import OP_CATEGORIES, select_ranges


def load_for_reduction(
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
