"""The op diff: inside the routed stage's ranges, which operators and Python functions take the
time on the suspect rank and not on the reference rank.

Each trace's events on the training thread (the thread holding the ``stagefrontier.step#<n>``
ranges) are nested by time; an event's self time is its duration minus its direct children's.
The stage's ranges are its ranges inside the captured steps and its between-step waits charged
to those steps (``<stage>@step#<n>``, ``analysis.wait_rule``). Events that start inside one of
them are grouped by what a person would look for:
a Python function of the user's code by its name, and a builtin, a library frame or an operator
by the innermost user function that called it (``faults.py(120): delay › <built-in function
sleep>``), so a bare ``sleep`` never stands alone. Times are per captured step.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.schema import STEP_ANNOTATION, stage_of_range
from ..analysis.wait_rule import parse_wait_range
from ..reducers.kineto import load_trace_ranges

OP_CATEGORIES = frozenset({"python_function", "cpu_op"})
LIBRARY_FRAME = re.compile(
    r"^(<built-in|<frozen|<string>|torch/|multiprocessing/|threading\.py|contextlib\.py|"
    r"typing\.py|functools\.py|runpy\.py|stagefrontier/record/|stagefrontier/route/|"
    r".*site-packages/|.*/lib/python3)"
)
"""Python frames that are not the user's code (builtins, torch, the standard library's
wrappers, the timer itself)."""
INSTRUMENTATION = re.compile(
    r"^(stagefrontier/record/|stagefrontier/route/|torch/autograd/profiler\.py|torch/profiler/)"
)
"""Frames of the measurement itself (the timer's contexts, the profiler's ranges): left out."""
ADDRESS = re.compile(r" of [^>]*? at 0x[0-9a-f]+>$|  of [^>]*>$| at 0x[0-9a-f]+>$")
"""``<built-in method randint of type object at 0x7f...>``: the address differs per process."""
MAX_ENTRIES = 20


@dataclass(frozen=True)
class OpTimes:
    """Self time (seconds, summed) per op key inside a stage's ranges, and the steps covered."""

    self_s: dict[str, float]
    steps: int
    call_paths: dict[str, list[str]]
    by_step: dict[str, dict[int, float]] = field(default_factory=dict)
    """Each key's self time per step id (a between-step wait counts in the step it is charged
    to): whether a lead is in every step or in one."""
    step_ids: tuple[int, ...] = ()
    """The steps covered, in order."""


@dataclass
class _Frame:
    """An open event while the thread's events are nested by time."""

    start: float
    end: float
    user_path: list[str]
    """The user's Python frames from the outermost to this event (or its caller)."""
    key: str
    step: int | None
    """The step of the stage's range the event starts inside; None when it starts in none (or
    is instrumentation): its time is not counted."""
    children: float = 0.0


def is_user_frame(name: str) -> bool:
    return "): " in name and not LIBRARY_FRAME.match(name)


def stage_op_times(
    path: str | Path,
    stage: str,
    steps: Sequence[int] | None = None,
    events: list[Any] | None = None,
) -> OpTimes:
    """Self time per op key inside ``stage``'s ranges of one trace (optionally only the ranges
    inside the given step ids). ``events``: the trace's events when already loaded. Only the
    events that overlap one of the ranges (those inside and their callers) are nested."""
    if events is None:
        _, events = load_trace_ranges(Path(path))
    spans: list[tuple[float, float, str, str, tuple[str, str]]] = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name, ts, dur = e.get("name"), e.get("ts"), e.get("dur")
        if not isinstance(name, str) or not isinstance(ts, (int, float)):
            continue
        if not isinstance(dur, (int, float)) or dur < 0:
            continue
        cat = e.get("cat")
        if cat != "user_annotation" and cat not in OP_CATEGORIES:
            continue
        thread = (str(e.get("pid")), str(e.get("tid")))
        if cat == "user_annotation":
            name = stage_of_range(name)  # a stage's range, named as the stage
        spans.append((float(ts), float(dur), name, str(cat), thread))
    selected = select_ranges(
        [(ts, dur, name, th) for ts, dur, name, cat, th in spans if cat == "user_annotation"],
        stage,
        steps,
    )
    if selected is None:
        return OpTimes({}, 0, {})
    thread, kept_steps, stage_ranges = selected
    starts = [r[0] for r in stage_ranges]
    ops = sorted(
        (
            s
            for s in spans
            if s[4] == thread
            and s[3] in OP_CATEGORIES
            and overlaps(s[0], s[0] + s[1], starts, stage_ranges)
        ),
        key=lambda s: (s[0], -s[1]),
    )
    totals: dict[str, float] = {}
    by_step: dict[str, dict[int, float]] = {}
    paths: dict[str, list[str]] = {}
    stack: list[_Frame] = []  # the enclosing events of the current one, outermost first
    eps = 1e-3  # microseconds: rounding slack when children end at their parent's end

    def close(frame: _Frame) -> None:
        if frame.step is not None:  # its own time inside the stage: the rest is not the stage's
            own = within(frame.start, frame.end, starts, stage_ranges) - frame.children
            self_s = max(0.0, own) * 1e-6
            totals[frame.key] = totals.get(frame.key, 0.0) + self_s
            steps = by_step.setdefault(frame.key, {})
            steps[frame.step] = steps.get(frame.step, 0.0) + self_s
            paths.setdefault(frame.key, frame.user_path)

    for ts, dur, raw, _, _ in ops:
        name = ADDRESS.sub(">", raw)
        while stack and stack[-1].end <= ts + eps:
            close(stack.pop())
        parent_path = stack[-1].user_path if stack else []
        if stack:  # a child's time inside the stage (its parent's is counted there alone)
            stack[-1].children += within(ts, ts + dur, starts, stage_ranges)
        user = is_user_frame(name)
        frames = [*parent_path, name] if user else parent_path
        key = name if user or not frames else f"{frames[-1]} › {name}"
        i = bisect.bisect_right(starts, ts) - 1
        inside = i >= 0 and ts < stage_ranges[i][1] and not INSTRUMENTATION.match(name)
        stack.append(_Frame(ts, ts + dur, frames, key, stage_ranges[i][2] if inside else None))
    while stack:
        close(stack.pop())
    step_ids = tuple(r[2] for r in kept_steps)
    return OpTimes(totals, len(kept_steps), paths, by_step, step_ids)


Thread = tuple[str, str]


def select_ranges(
    annotations: Sequence[tuple[float, float, str, Thread]],
    stage: str,
    steps: Sequence[int] | None,
) -> tuple[Thread, list[tuple[float, float, int]], list[tuple[float, float, int]]] | None:
    """From a trace's annotation ranges (start, duration, name as a stage, thread): the
    training thread (the one with the most ``stagefrontier.step#<n>`` ranges), its step ranges
    among ``steps`` (all when None), and the stage's ranges on it with the step each counts in,
    sorted: those inside the kept steps and the between-step waits charged to them. None
    without step ranges."""
    step_ranges: dict[Thread, list[tuple[float, float, int]]] = {}
    for ts, dur, name, thread in annotations:
        if name.startswith(STEP_ANNOTATION + "#"):
            tail = name[len(STEP_ANNOTATION) + 1 :]
            if tail.isdigit():
                step_ranges.setdefault(thread, []).append((ts, ts + dur, int(tail)))
    if not step_ranges:
        return None
    thread = max(step_ranges, key=lambda t: len(step_ranges[t]))
    wanted = set(steps) if steps is not None else None
    kept_steps = sorted(r for r in step_ranges[thread] if wanted is None or r[2] in wanted)
    kept_ids = {r[2] for r in kept_steps}
    stage_ranges = []
    for ts, dur, name, th in annotations:
        if th != thread:
            continue
        step = _step_of(ts, kept_steps) if name == stage else _wait_of(name, stage)
        if step is not None and step in kept_ids:
            stage_ranges.append((ts, ts + dur, step))
    return thread, kept_steps, sorted(stage_ranges)


def overlaps(
    lo: float, hi: float, starts: list[float], ranges: Sequence[tuple[float, float, int]]
) -> bool:
    """Whether ``[lo, hi]`` meets one of the sorted ``ranges`` (``starts``: their starts)."""
    i = bisect.bisect_right(starts, lo) - 1
    if i >= 0 and ranges[i][1] >= lo:
        return True
    return i + 1 < len(ranges) and ranges[i + 1][0] <= hi


def within(
    lo: float, hi: float, starts: list[float], ranges: Sequence[tuple[float, float, int]]
) -> float:
    """How much of ``[lo, hi]`` lies inside the sorted, disjoint ``ranges`` (``starts``: their
    starts). An event that starts in the stage may run on past it: a stack sample's frame of
    the training loop spans the whole step, its children in the other stages left out."""
    i = max(bisect.bisect_right(starts, lo) - 1, 0)
    total = 0.0
    while i < len(ranges) and ranges[i][0] < hi:
        total += max(0.0, min(hi, ranges[i][1]) - max(lo, ranges[i][0]))
        i += 1
    return total


def _wait_of(name: str, stage: str) -> int | None:
    """The step a between-step wait range of ``stage`` is charged to; None for other names."""
    wait = parse_wait_range(name)
    return wait[1] if wait is not None and wait[0] == stage else None


def _step_of(ts: float, ranges: Sequence[tuple[float, float, int]]) -> int | None:
    """The step whose range holds ``ts``; None when none does."""
    return next((step for lo, hi, step in ranges if lo <= ts < hi), None)


def op_diff(
    suspect: OpTimes, reference: OpTimes | None, limit: int = MAX_ENTRIES
) -> list[dict[str, Any]]:
    """Entries ranked by how much more self time per step the suspect spends, largest first."""
    ref = reference.self_s if reference is not None else {}
    n_s = max(suspect.steps, 1)
    n_r = max(reference.steps, 1) if reference is not None else 1
    rows: list[dict[str, Any]] = []
    for key in set(suspect.self_s) | set(ref):
        s_ms = suspect.self_s.get(key, 0.0) / n_s * 1e3
        r_ms = ref.get(key, 0.0) / n_r * 1e3
        rows.append(
            {
                "name": key,
                "suspect_ms_per_step": round(s_ms, 4),
                "reference_ms_per_step": round(r_ms, 4),
                "diff_ms_per_step": round(s_ms - r_ms, 4),
                "call_path": suspect.call_paths.get(key)
                or (reference.call_paths.get(key, []) if reference is not None else []),
            }
        )
    rows.sort(key=lambda r: (-float(r["diff_ms_per_step"]), str(r["name"])))
    return rows[:limit]
