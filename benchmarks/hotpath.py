"""Benchmark: the recorder's hot path against a bare hand-written context manager.

In one run, with the variants interleaved in every repeat so that they share the machine's
noise, the script times loops of ``n`` uses of

* the floor: a bare class whose ``__enter__``/``__exit__`` make one ``time.perf_counter_ns``
  call each, instantiated per use (``with Bare():``), and the same class preallocated;
* an empty ``timer.step()`` and a step holding one ``timer.stage("x")``: their difference is the
  cost of one stage enter+exit;
* a full step with the five timed default stages;
* the same full step on a timer with a ``ProfilerRouter`` attached and nothing requested (its
  thread polls a real local c10d store every 50 ms; the step tests one flag);
* ``timer.stage("x")`` on a timer built with ``enabled=False``;
* Lightning's ``SimpleProfiler().profile("x")``, when Lightning is importable (a peer);

and, apart from the rounds, the window hand-off: the training-thread time of the step exit that
completes a window (a timer with a real ``LocalCollector``, whose thread analyzes each window
while the next steps run), as that exit minus the median exit of the window's other steps; and
the automatic hooks of ``stagefrontier run`` against hand-written contexts on a real training
loop (``hotpath_hooks``, with torch), and the cost per DDP gradient bucket of
the collectives a step issues (``hotpath_buckets``, with torch: DDP's buckets, FSDP2's
all-gathers and reduce-scatters, ZeRO-1's broadcasts, the program's own collectives).

Each figure is nanoseconds per use with the empty loop's cost removed; the reported value is
the median over repeats of the per-repeat figure, and the ratio divides it by the floor's median.

Targets: stage <= 1.3x the floor, a full step with every feature on (a router attached, pause
support, self-cost) <= 7.0x the floor, disabled stage <= 0.45x the floor, hand-off <= 50 us
median, the automatic hooks <= 1.5x the cost of hand-written contexts. A second table gives
what each feature adds to a recording step.

Usage::

    python benchmarks/hotpath.py            # full run, writes benchmarks/results/hotpath.md
    python benchmarks/hotpath.py --quick    # few short repeats, for a smoke check
    python benchmarks/hotpath.py --out PATH # write the markdown somewhere else
    python benchmarks/hotpath.py --hooks-only  # only the automatic hooks: results/hotpath_hooks.md
    python benchmarks/hotpath.py --hooks-only --instructions  # and their instructions counted
    python benchmarks/hotpath.py --buckets-only  # the timed collectives: results/hotpath_buckets.md
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import hotpath_buckets
import hotpath_hooks
import stagefrontier
from harness_common import (
    load_1min,
    load_text,
    quiet_check,
    result_header,
    script_parser,
    write_result,
)
from stagefrontier import DEFAULT_STAGES, RESIDUAL_STAGE, StageTimer, TimerConfig
from stagefrontier.record.noop import NOOP

_now = time.perf_counter_ns
_clock = time.thread_time_ns
"""What a timed loop is measured with: this thread's CPU time, so that the time the thread
spends descheduled on a shared machine is not counted (the floor's own two clock calls stay
``perf_counter_ns``, like the recorder's)."""

COMMAND = "python benchmarks/hotpath.py"

STAGE_TARGET = 1.3
FULL_STEP_TARGET = 7.0
DISABLED_TARGET = 0.45
HANDOFF_TARGET_US = 50.0
HANDOFF_WINDOW = 10
"""Steps per window in the hand-off measurement."""
HANDOFF_WORK = 20_000
"""``sum(range(HANDOFF_WORK))`` in the forward stage of each step of the hand-off measurement
(a few hundred microseconds: the steps are not empty, the analysis thread gets the GIL)."""


@dataclass(frozen=True)
class Settings:
    repeats: int
    """Interleaved rounds; every variant is timed once per round."""
    loops: int
    """Uses per timed loop."""
    warmup: int
    """Uses run before every timed loop (steps also recorded in the timer's window)."""
    handoff_windows: int
    """Windows handed off (the first one not measured) in the hand-off measurement."""
    hook_rounds: int
    """Interleaved rounds of the automatic hooks' measurement (``hotpath_hooks``)."""
    hook_steps: int
    """Training steps per loop in that measurement."""
    bucket_rounds: int
    """Interleaved rounds of each timed collective's measurement (``hotpath_buckets``)."""
    bucket_steps: int
    """DDP training steps per loop in that measurement."""
    count_rounds: int
    """Rounds of the automatic hooks' instruction count (``--instructions``; the first warms up)."""
    count_steps: int
    """Training steps per loop in that count."""


FULL = Settings(
    repeats=101,
    loops=5_000,
    warmup=500,
    handoff_windows=201,
    hook_rounds=101,
    hook_steps=500,
    bucket_rounds=31,
    bucket_steps=50,
    count_rounds=4,
    count_steps=200,
)
QUICK = Settings(
    repeats=3,
    loops=1_000,
    warmup=100,
    handoff_windows=6,
    hook_rounds=3,
    hook_steps=50,
    bucket_rounds=3,
    bucket_steps=10,
    count_rounds=2,
    count_steps=20,
)


class Bare:
    """The floor: the least a timing context manager can do in pure Python (no ``__init__``,
    slots, explicit ``__exit__`` arguments, one clock call on each side)."""

    __slots__ = ("elapsed", "start")

    def __enter__(self) -> None:
        self.start = _now()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.elapsed = _now() - self.start


class DiscardCollector:
    """Receives the timer's windows and drops them: only the training-thread side is timed."""

    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.sinks: list[Any] = []  # where a router on rank 0 attaches its coordinator

    def submit(self, window: object) -> bool:
        return True

    def close(self) -> None:
        return None


# ---------------------------------------------------------------------------- timed loops
# Each loop returns the nanoseconds taken by ``n`` uses. Loops are plain functions with local
# bindings so that every variant pays the same interpreter overhead around the measured code.


def loop_empty(n: int) -> int:
    start = _clock()
    for _ in range(n):
        pass
    return _clock() - start


def loop_bare(n: int) -> int:
    bare = Bare
    start = _clock()
    for _ in range(n):
        with bare():
            pass
    return _clock() - start


def loop_bare_prealloc(n: int) -> int:
    bare = Bare()
    start = _clock()
    for _ in range(n):
        with bare:
            pass
    return _clock() - start


def loop_noop(n: int) -> int:
    noop = NOOP
    start = _clock()
    for _ in range(n):
        with noop:
            pass
    return _clock() - start


def loop_empty_step(n: int, timer: StageTimer) -> int:
    step = timer.step
    start = _clock()
    for _ in range(n):
        with step():
            pass
    return _clock() - start


def loop_one_stage(n: int, timer: StageTimer) -> int:
    step, stage = timer.step, timer.stage
    start = _clock()
    for _ in range(n):
        with step(), stage("x"):
            pass
    return _clock() - start


def loop_full_step(n: int, timer: StageTimer) -> int:
    step, stage = timer.step, timer.stage
    s0, s1, s2, s3, s4 = (s for s in DEFAULT_STAGES if s != RESIDUAL_STAGE)
    start = _clock()
    for _ in range(n):
        with step():
            with stage(s0):
                pass
            with stage(s1):
                pass
            with stage(s2):
                pass
            with stage(s3):
                pass
            with stage(s4):
                pass
    return _clock() - start


def loop_disabled(n: int, timer: StageTimer) -> int:
    stage = timer.stage
    start = _clock()
    for _ in range(n):
        with stage("x"):
            pass
    return _clock() - start


def loop_flag_test(n: int, timer: StageTimer) -> int:
    """One attribute truth test per use, as the step does for each rare case (here the
    router's capture flag): what one such flag costs a recording step."""
    start = _clock()
    for _ in range(n):
        if timer._capture:
            pass
    return _clock() - start


def loop_profile(n: int, profiler: Any) -> int:
    profile = profiler.profile
    start = _clock()
    for _ in range(n):
        with profile("x"):
            pass
    return _clock() - start


def lightning_profiler() -> tuple[Callable[[], Any] | None, str]:
    """A factory for Lightning's SimpleProfiler and its version, or None when not installed."""
    try:
        import lightning
        from lightning.pytorch.profilers import SimpleProfiler

        return SimpleProfiler, f"lightning {lightning.__version__}"
    except ImportError:
        pass
    try:
        import pytorch_lightning
        from pytorch_lightning.profilers import SimpleProfiler

        return SimpleProfiler, f"pytorch_lightning {pytorch_lightning.__version__}"
    except ImportError:
        return None, "not installed"


# ---------------------------------------------------------------------------- measurement


def measure_handoff(windows: int) -> list[float]:
    """Microseconds per measured window: the exit of the step that completes it minus the
    median exit of its other steps (the part of that exit that is the hand-off)."""
    from stagefrontier.collect.local import LocalCollector

    timer = StageTimer(
        config=TimerConfig(window=HANDOFF_WINDOW),
        collector=LocalCollector(out_dir=".", sinks=[], queue_size=64),
    )
    step, stage = timer.step, timer.stage
    s0, s1, s2, s3, s4 = (s for s in DEFAULT_STAGES if s != RESIDUAL_STAGE)
    exits: list[int] = []
    for _ in range(windows * HANDOFF_WINDOW):
        ctx = step()
        ctx.__enter__()
        for name in (s0, s1, s2, s3, s4):
            with stage(name):
                if name == s1:
                    sum(range(HANDOFF_WORK))
        start = _now()
        ctx.__exit__(None, None, None)
        exits.append(_now() - start)
    timer.close()
    out = []
    for w in range(1, windows):  # the first window warms up
        rows = exits[w * HANDOFF_WINDOW : (w + 1) * HANDOFF_WINDOW]
        out.append((rows[-1] - statistics.median(rows[:-1])) / 1e3)
    return out


def fresh_timer(
    n: int, stages: Sequence[str] | None, annotate: bool = False, router: Any = None
) -> StageTimer:
    """A timer whose window holds the warm-up and the timed loop: no hand-off while timing."""
    named = DEFAULT_STAGES if stages is None else tuple(stages)
    config = TimerConfig(stages=named, window=n + 1, annotate=annotate, router=router)
    return StageTimer(config=config, collector=DiscardCollector())


def idle_router() -> Any:
    """A ProfilerRouter on a real local TCPStore (its thread polls it), or None without torch."""
    try:
        from datetime import timedelta

        import torch.distributed as dist
    except ImportError:
        return None
    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    return stagefrontier.ProfilerRouter(store=store, capture_timeout_s=0.0)


def routed_job(capacity: int, router: Any) -> Callable[[int], int]:
    """The full step on a timer with a router, whose thread runs only around this variant's
    warm-up and timed loop (so that it does not slow the other variants of the round)."""
    timers: list[StageTimer] = []

    def job(n: int) -> int:
        if not timers:  # the warm-up call: start the router's thread
            timers.append(fresh_timer(capacity, None, router=router))
            return loop_full_step(n, timers[0])
        try:
            return loop_full_step(n, timers[0])
        finally:
            timers[0].close()

    return job


def measure_round(
    settings: Settings, profiler_factory: Callable[[], Any] | None, rnd: int, router: Any
) -> dict[str, int]:
    """Time every variant once (in alternating order across rounds); raw ns per loop."""
    n = settings.loops
    capacity = n + settings.warmup
    one = fresh_timer(capacity, ["x"])
    empty = fresh_timer(capacity, ["x"])
    full = fresh_timer(capacity, None)
    annotated = fresh_timer(capacity, None, annotate=True)
    disabled = StageTimer(config=TimerConfig(stages=("x",), enabled=False))
    paused = fresh_timer(capacity + 1, None)
    with paused.step():  # one recorded step: the timer has a window to close with
        pass
    paused.pause()
    profiler = profiler_factory() if profiler_factory is not None else None
    jobs: list[tuple[str, Callable[[int], int]]] = [
        ("loop", loop_empty),
        ("bare", loop_bare),
        ("bare_prealloc", loop_bare_prealloc),
        ("noop", loop_noop),
        ("empty_step", lambda k: loop_empty_step(k, empty)),
        ("one_stage_step", lambda k: loop_one_stage(k, one)),
        ("full_step", lambda k: loop_full_step(k, full)),
        ("annotated_step", lambda k: loop_full_step(k, annotated)),
        ("disabled", lambda k: loop_disabled(k, disabled)),
        ("paused_step", lambda k: loop_full_step(k, paused)),
        ("flag_test", lambda k: loop_flag_test(k, full)),
    ]
    if router is not None:
        jobs.append(("router_step", routed_job(capacity, router)))
    if profiler is not None:
        jobs.append(("lightning", lambda k: loop_profile(k, profiler)))
    if rnd % 2:
        jobs.reverse()
    out: dict[str, int] = {}
    gc.collect()
    for name, job in jobs:
        job(settings.warmup)
        gc.disable()
        try:
            out[name] = job(n)
        finally:
            gc.enable()
    for timer in (one, empty, full, annotated, disabled, paused):
        timer.close()
    return out


@dataclass(frozen=True)
class Row:
    label: str
    ns: float | None
    """Median over rounds of the net ns per use; None when the variant did not run."""
    ratios: tuple[float, float, float] | None
    """25th, 50th and 75th percentile over rounds of the per-round ratio to the floor."""
    target: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.ratios is None else self.ratios[1]

    @property
    def verdict(self) -> str:
        if self.target is None or self.ratio is None:
            return "-"
        return f"{'met' if self.ratio <= self.target else 'MISSED'} (<= {self.target:g}x)"


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return q1, q2, q3


def summarize(rounds: Sequence[dict[str, int]], n: int, peer: str) -> list[Row]:
    """Per round, each variant's net ns per use and its ratio to that round's floor (the ratio
    cancels drifts in machine speed between rounds); then medians and quartiles over rounds."""

    def net(r: dict[str, int], name: str, base: str = "loop") -> float:
        return (r[name] - r[base]) / n

    def row(label: str, name: str | None, base: str = "loop", **extra: Any) -> Row:
        if name is None:
            return Row(label, None, None, **extra)
        values = [net(r, name, base) for r in rounds]
        ratios = [v / net(r, "bare") for v, r in zip(values, rounds, strict=True)]
        return Row(label, statistics.median(values), quartiles(ratios), **extra)

    has_peer = all("lightning" in r for r in rounds)
    loop = statistics.median(r["loop"] / n for r in rounds)
    return [
        row("floor: `with Bare():` (new instance per use)", "bare"),
        row("bare, preallocated instance (`with bare:`)", "bare_prealloc"),
        row("`timer.step()`, empty", "empty_step"),
        row(
            '`timer.stage("x")` enter+exit (step with one stage - empty step)',
            "one_stage_step",
            "empty_step",
            target=STAGE_TARGET,
        ),
        row("full step: `step()` + 5 default stages, no router", "full_step"),
        row(
            "full step with `annotate=True` (no profiler running: ranges skipped, one check each)",
            "annotated_step",
        ),
        row(
            "full step, every feature on: a `ProfilerRouter` attached, nothing requested (its "
            "thread polls the store every 50 ms), pause support and self-cost (always on)",
            "router_step" if all("router_step" in r for r in rounds) else None,
            target=FULL_STEP_TARGET,
        ),
        row("full step while paused (`timer.pause()`: contexts do nothing)", "paused_step"),
        row('`timer.stage("x")` with `enabled=False`', "disabled", target=DISABLED_TARGET),
        row("(reference: `with NOOP:`, the shared no-op context, no call)", "noop"),
        row(
            'Lightning `SimpleProfiler().profile("x")`',
            "lightning" if has_peer else None,
            note=peer,
        ),
        Row(f"(empty loop iteration, {loop:.1f} ns, subtracted above)", None, None, note="-"),
    ]


DEFAULT_WINDOW = 100
"""StageTimer's default steps per window: a window's hand-off is shared by this many steps."""


def feature_rows(
    rounds: Sequence[dict[str, int]], n: int, handoff_us: Sequence[float]
) -> list[tuple[str, str, str, str]]:
    """What each feature adds to one recording step: (feature, the work it puts on the step,
    ns per step, x floor), the ns a median over rounds of per-round differences."""

    def per_step(name: str, base: str) -> tuple[str, str]:
        if not all(name in r and base in r for r in rounds):
            return "not measured", "-"
        values = [(r[name] - r[base]) / n for r in rounds]
        floors = [(r["bare"] - r["loop"]) / n for r in rounds]
        ratio = statistics.median(v / f for v, f in zip(values, floors, strict=True))
        return f"{statistics.median(values):.1f}", f"{ratio:.3f}"

    flag = per_step("flag_test", "loop")
    handoff_ns = statistics.median(handoff_us) * 1e3
    floor = statistics.median((r["bare"] - r["loop"]) / n for r in rounds)
    share = handoff_ns / DEFAULT_WINDOW
    return [
        (
            "profiler router, support",
            "one flag test in `step()`'s enter (`_capture`, set by the router's thread)",
            *flag,
        ),
        (
            "profiler router, attached and idle",
            "none on the step; its thread polls the store (full step with the router - without)",
            *per_step("router_step", "full_step"),
        ),
        (
            "pause support",
            "none: the step's enter tests `_active is not OUTSIDE` for nested steps already, and "
            "a paused timer's marker fails the same test",
            "0",
            "0",
        ),
        (
            "data waits (`timer.iter`, `timer.fetch`), CUDA-event sampling",
            "one flag test in `step()`'s enter (`_step_hooks`)",
            *flag,
        ),
        ("gradient accumulation", "one flag test in `step()`'s exit (`_accumulating`)", *flag),
        (
            "self-cost, loader worker counts",
            "none on the step: read at the window's end, in the hand-off "
            f"(median {handoff_ns / 1e3:.1f} us), shared by the {DEFAULT_WINDOW} steps of a "
            "default window",
            f"{share:.1f}",
            f"{share / floor:.3f}",
        ),
        (
            "`annotate=True` (off by default)",
            "a profiler-range check around each context (full step annotated - plain)",
            *per_step("annotated_step", "full_step"),
        ),
    ]


def feature_table(rows: Sequence[tuple[str, str, str, str]]) -> list[str]:
    lines = [
        "| feature | what it adds to a recording step | ns per step | x floor |",
        "|---|---|---:|---:|",
    ]
    return lines + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]


HEADER = "| variant | ns/op | x floor | x floor, quartiles | target |"


def markdown_table(rows: Sequence[Row]) -> str:
    lines = [HEADER, "|---|---:|---:|---:|---|"]
    for row in rows:
        if row.ns is None or row.ratios is None:
            lines.append(f"| {row.label} | {row.note} | - | - | - |")
            continue
        q1, q2, q3 = row.ratios
        lines.append(
            f"| {row.label} | {row.ns:.1f} | {q2:.2f} | {q1:.2f} - {q3:.2f} | {row.verdict} |"
        )
    return "\n".join(lines)


def verdicts(rows: Sequence[Row]) -> list[str]:
    out = []
    for row in rows:
        if row.target is None or row.ratios is None:
            continue
        q1, q2, q3 = row.ratios
        out.append(
            f"- {row.label}: {q2:.2f}x the floor (quartiles {q1:.2f} - {q3:.2f}), "
            f"target <= {row.target:g}x: {'MET' if q2 <= row.target else 'MISSED'}."
        )
    return out


EXPLANATIONS = {
    STAGE_TARGET: (
        "Stage: `timer.stage(name)` is a C-level dict lookup, then the `with` statement calls "
        "two Python-level methods, like the floor's, but binds none: each context holds its "
        "bound enter and exit in its `__enter__` and `__exit__` slots, where a method on the "
        "class is bound anew at every lookup (an allocation the floor pays twice per use). "
        "Beyond the floor's two clock calls, the enter reads the timer's `_active` (no "
        "ordered stage open, a step open) and stores `_active` and `_start`; the exit tests "
        "that it is the open stage, clears `_active`, computes its column (`_base + _column`), "
        "checks schema order against `_last` and stores the span in a list of ints. The "
        "timer's fields the contexts touch are slots too (the timer has too many attributes "
        "for its instance dict to share keys, so a dict field is a hashed lookup). What "
        "remains above the floor is those reads and writes: the one-open-stage and "
        "schema-order checks themselves."
    ),
    FULL_STEP_TARGET: (
        "Full step: `step()` plus five stages is six context managers where the floor is one. "
        "`timer.step` is a C-level callable (`itertools.repeat(ctx).__next__`), so the step "
        "costs only its context's enter and exit: about 1.2x the floor (the enter opens the "
        "row: `_active`, `_base`, and tests the router's capture flag and the rare-work flag; "
        "the exit stores the wall time, tests the accumulation flag and counts the step "
        "against the window's end), and each stage about 1.1x, so the sum lands near 6.6x. "
        "The features add three flag tests of about 7 ns each (0.01x the floor; the table "
        "above) and nothing else: the rest is the interpreter's cost of six `with` blocks "
        "around the contract checks (one open stage, schema order, nested steps), which are "
        "kept. Python-level alternatives measured (each against the current contexts in the "
        "same rounds) and dropped: the clock as a default argument of the methods; the timer "
        "bound as a closure variable of per-timer context classes instead of read from a "
        "slot (no faster); the open stage held as a small int instead of the context (no "
        "faster); schema order checked by set membership of the last closed stage's marker "
        "instead of against `_last` (3-4% slower)."
    ),
    DISABLED_TARGET: (
        "Disabled: a disabled `timer.stage(name)` is a C-level `defaultdict` lookup returning "
        "the shared no-op context, whose `__enter__` and `__exit__` are C-level callables "
        "too (no Python frame at all); the reference row is the `with` over the no-op alone."
    ),
}


def explanations(rows: Sequence[Row]) -> list[str]:
    """Why a target is missed, or why a met one is close: its quartiles reach past the target,
    so a repeated run can fall on the other side."""
    out = []
    for row in rows:
        if row.target is None or row.ratios is None:
            continue
        _, q2, q3 = row.ratios
        if q2 > row.target:
            out.extend([f"- Missed. {EXPLANATIONS[row.target]}", ""])
        elif q3 > row.target:
            out.extend(
                [
                    f"- Met at the edge ({q2:.2f}x, quartiles up to {q3:.2f}x; repeated runs land "
                    f"on either side of {row.target:g}x). {EXPLANATIONS[row.target]}",
                    "",
                ]
            )
    return out


def torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "not installed"
    return str(torch.__version__)


def environment(peer: str, load_start: str, load_end: str) -> list[str]:
    return [
        f"- Python: {platform.python_version()} ({platform.python_implementation()})",
        f"- numpy: {np.__version__}",
        f"- torch: {torch_version()} (not used by the measured code)",
        f"- stagefrontier: {stagefrontier.__version__}",
        f"- Lightning: {peer}",
        f"- CPU count: {os.cpu_count()}",
        f"- Platform: {platform.platform()} ({platform.machine()})",
        f"- Load average (1/5/15 min) at start: {load_start}; at end: {load_end}",
    ]


def handoff_lines(handoff_us: Sequence[float]) -> list[str]:
    median = statistics.median(handoff_us)
    p90 = float(np.percentile(handoff_us, 90))
    met = "MET" if median <= HANDOFF_TARGET_US else "MISSED"
    return [
        f"- window hand-off on the training thread: median {median:.1f} us (p90 {p90:.1f} us, "
        f"{len(handoff_us)} windows), target <= {HANDOFF_TARGET_US:g} us: {met}."
    ]


def render(
    rows: Sequence[Row],
    features: Sequence[tuple[str, str, str, str]],
    handoff_us: Sequence[float],
    settings: Settings,
    quick: bool,
    peer: str,
    loads: tuple[str, str, list[str]],
    hooks: Sequence[str],
    buckets: Sequence[str],
) -> str:
    load_start, load_end, quiet = loads
    command = COMMAND + (" --quick" if quick else "")
    parts = [
        *result_header(
            "Recorder hot-path benchmark: `StageTimer` vs. a bare context manager", command
        ),
        *environment(peer, load_start, load_end),
        *quiet,
        "",
        f"Method: {settings.repeats} interleaved rounds (variant order reversed every other "
        f"round); in each round every variant runs {settings.warmup} warm-up uses and then one "
        f"timed loop of {settings.loops} uses with the garbage collector off, timed with "
        "`time.thread_time_ns` (the thread's CPU time: time spent descheduled on a shared "
        "machine is left out). A variant's figure is (loop time - empty loop time) / uses; "
        "the stage figure is (step with one stage - empty step) / uses, so it is the marginal "
        'cost of one `with timer.stage("x"):` inside a step. ns/op is the median over rounds; '
        "the ratio to the floor is taken within each round (so that drifts of the machine's "
        "speed between rounds cancel) and reported as the median, with the quartiles over "
        "rounds beside it to show the noise. Loops are short and rounds many so that most "
        "rounds run undisturbed. Timers get a fresh window larger "
        "than the warm-up plus the loop, so no window is handed off while timing, and a "
        "collector that "
        "discards windows (analysis runs off the training thread and is not measured here).",
        "",
        f"Hand-off: after the rounds, {settings.handoff_windows} windows of {HANDOFF_WINDOW} "
        "steps (a step and the five default stages, `sum(range("
        f"{HANDOFF_WORK}))` in the forward) on a timer with a real `LocalCollector` (no sinks), "
        "whose thread analyzes each window while the next steps run; per window after the "
        "first, the exit of the step that completes it minus the median exit of its other "
        "steps, each exit timed with `time.perf_counter_ns`.",
        "",
        markdown_table(rows),
        "",
        "Verdicts:",
        "",
        *verdicts(rows),
        *handoff_lines(handoff_us),
        "",
        "## What each feature adds to a recording step",
        "",
        "Every feature of the recorder is on in every timer (a router is attached or not); a "
        "flag test is measured as a loop of `if timer._capture: pass` less the empty loop.",
        "",
        *feature_table(features),
        "",
        "## The automatic hooks (`stagefrontier run`) against hand-written contexts",
        "",
        hotpath_hooks.METHOD.format(rounds=settings.hook_rounds, steps=settings.hook_steps),
        "",
        *hooks,
        "",
        "## The collectives timed (`watch_ddp`, `watch_fsdp`, `watch_zero`, `timer.collective`)",
        "",
        hotpath_buckets.METHOD.format(
            rounds=settings.bucket_rounds,
            steps=settings.bucket_steps,
            layers=hotpath_buckets.LAYERS,
        ),
        "",
        *buckets,
        "",
    ]
    why = explanations(rows)
    if why:
        parts.extend(["Where the hot path stands against its targets, and why:", "", *why])
    return "\n".join(parts)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = script_parser("hotpath", __doc__, quick="few short repeats")
    parser.add_argument(
        "--hooks-only",
        action="store_true",
        help="measure only the automatic hooks against hand-written contexts (default out: "
        "benchmarks/results/hotpath_hooks.md)",
    )
    parser.add_argument(
        "--buckets-only",
        action="store_true",
        help="measure only the cost per timed collective: DDP, FSDP2, ZeRO-1, own (default out: "
        "benchmarks/results/hotpath_buckets.md)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="with --hooks-only: also count the automatic hooks' instructions against "
        "hand-written contexts under valgrind's callgrind (minutes; a ratio the machine's load "
        "does not move)",
    )
    return parser.parse_args(argv)


def counting(args: argparse.Namespace) -> tuple[int, int] | None:
    """The rounds and steps of the hooks' instruction count, when ``--instructions`` asks."""
    settings = QUICK if args.quick else FULL
    return (settings.count_rounds, settings.count_steps) if args.instructions else None


def section_only(args: argparse.Namespace, settings: Settings, buckets: bool) -> int:
    """``--hooks-only`` (the automatic hooks) or ``--buckets-only`` (the timed collectives): that
    measurement alone, in its own results file."""
    name, flag = (
        ("hotpath_buckets", "--buckets-only") if buckets else ("hotpath_hooks", "--hooks-only")
    )
    out: Path = args.out
    if out.name == "hotpath.md":
        out = out.with_name(f"{name}.md")
    load_start, load_1min_start = load_text(), load_1min()
    if buckets:
        title = "The cost per timed collective (DDP, FSDP2, ZeRO-1, the program's own)"
        method = hotpath_buckets.METHOD.format(
            rounds=settings.bucket_rounds,
            steps=settings.bucket_steps,
            layers=hotpath_buckets.LAYERS,
        )
        lines = hotpath_buckets.report(settings.bucket_rounds, settings.bucket_steps)
    else:
        title = "The automatic hooks (`stagefrontier run`) vs hand-written contexts"
        method = hotpath_hooks.METHOD.format(rounds=settings.hook_rounds, steps=settings.hook_steps)
        lines = hotpath_hooks.report(settings.hook_rounds, settings.hook_steps, counting(args))
    load_end = load_text()
    quiet = quiet_check([load_1min_start, load_1min()])
    command = f"{COMMAND} {flag}" + (" --quick" if args.quick else "")
    command += " --instructions" if args.instructions else ""
    text = [
        *result_header(title, command),
        *(
            line.replace(" (not used by the measured code)", "")
            for line in environment("not measured here", load_start, load_end)
        ),
        *quiet,
        "",
        method,
        "",
        *lines,
        "",
    ]
    print("\n".join(lines))
    write_result(out, "\n".join(text), echo=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else FULL
    if args.instructions and not args.hooks_only:
        print("--instructions counts the automatic hooks: add --hooks-only", file=sys.stderr)
        return 2
    if args.hooks_only or args.buckets_only:
        return section_only(args, settings, buckets=args.buckets_only)
    load_start, load_1min_start = load_text(), load_1min()
    factory, peer = lightning_profiler()
    if factory is None:
        print("Lightning SimpleProfiler: not installed", file=sys.stderr)
    gc.collect()
    gc.freeze()  # keep the collections between rounds short (Lightning imports torch)
    router = idle_router()
    rounds = []
    for rnd in range(settings.repeats):
        rounds.append(measure_round(settings, factory, rnd, router))
    handoff_us = measure_handoff(settings.handoff_windows)
    hooks = hotpath_hooks.report(settings.hook_rounds, settings.hook_steps)
    buckets = hotpath_buckets.report(settings.bucket_rounds, settings.bucket_steps)
    load_end = load_text()
    quiet = quiet_check([load_1min_start, load_1min()])
    rows = summarize(rounds, settings.loops, peer)
    features = feature_rows(rounds, settings.loops, handoff_us)
    print(markdown_table(rows))
    print()
    print("\n".join([*verdicts(rows), *handoff_lines(handoff_us), *quiet]))
    print("\n".join(feature_table(features)))
    print("\n".join(hooks))
    print("\n".join(buckets))
    loads = (load_start, load_end, quiet)
    text = render(rows, features, handoff_us, settings, args.quick, peer, loads, hooks, buckets)
    write_result(args.out, text, echo=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
