"""The collector interface the recorder hands windows to, and the shared analysis worker,
and what rank 0 does with the windows it received: merge them, analyze them, and hand each
analyzed window to the sinks, then to the consumers registered with the analysis thread."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..analysis.block_lead import LeadTest
from ..analysis.gates import Gates
from ..analysis.regression import DEFAULT_REGRESSION, RegressionConfig
from ..failures import say_failed
from ..sinks.base import Sink, emit
from ..window.merged import AnalyzedWindow, MergedWindow, merge_windows
from ..window.rank import PendingWindow, RankWindow

logger = logging.getLogger("stagefrontier")


@dataclass(frozen=True)
class CollectorSettings:
    """What every cross-rank collector (store, Gloo, node member and leader) is built with.

    Args:
        rank, world_size: this process in the job.
        out_dir: where rank 0's default sinks write.
        timeout_s: how long one store or group operation may wait for the other ranks.
        queue_size: windows that may wait for the thread before new ones are dropped.
        sinks: rank 0's sinks, replacing the defaults (windows.jsonl, the log line and packets);
            started by the collector and closed after the last window.
        join_timeout_s: how long ``close`` waits for queued windows (None: the collector's own
            default).
        gates: the labeler's gates for rank 0's analysis (None: the defaults).
        regression: rank 0's live regression check (None: off).
    """

    rank: int
    world_size: int
    out_dir: str | os.PathLike[str]
    timeout_s: float = 10.0
    queue_size: int = 4
    sinks: Sequence[Sink] | None = None
    join_timeout_s: float | None = None
    gates: Gates | None = None
    regression: RegressionConfig | None = DEFAULT_REGRESSION


class WindowConsumer(Protocol):
    """Takes every window rank 0 analyzed, on the analysis thread, after the sinks (the
    profiler router's coordinator is one). ``take`` must return at once: it hands the window
    to a thread of its own."""

    def take(self, window: AnalyzedWindow) -> None: ...


class Consumers:
    """The consumers registered with one collector's analysis thread, in the order they
    registered. ``register`` may be called from any thread; a consumer that raises is said in
    one line and the others still take the window."""

    def __init__(self) -> None:
        self._registered: tuple[WindowConsumer, ...] = ()
        self._lock = threading.Lock()
        self._lead_test: LeadTest | None = None

    def register(self, consumer: WindowConsumer, lead_test: LeadTest | None = None) -> None:
        """``lead_test``: when a rank's lead in a stage below the top one is one ``consumer``
        acts on (the profiler router's ``min_share`` and ``noise_factor``); every window
        published from then on carries it (``stamped``), so that the window line the sinks
        write names no lead the consumer would not act on."""
        with self._lock:  # a new tuple: the analysis thread iterates the one it read
            self._registered = (*self._registered, consumer)
            if lead_test is not None:
                self._lead_test = lead_test

    def stamped(self, window: AnalyzedWindow) -> AnalyzedWindow:
        """``window`` with the registered lead test (itself when none was given)."""
        test = self._lead_test
        if test is None or test == window.lead_test:
            return window
        return window.changed(lead_test=test)

    def deliver(self, window: AnalyzedWindow) -> None:
        for consumer in self._registered:
            try:
                consumer.take(window)
            except Exception as exc:
                name = type(consumer).__name__
                say_failed(logger, f"handing a window to {name}", exc, "the others go on")


def publish(sinks: Sequence[Sink], consumers: Consumers, window: AnalyzedWindow) -> None:
    """An analyzed window to the sinks, then to the consumers (with the lead test they act on:
    ``Consumers.stamped``)."""
    window = consumers.stamped(window)
    emit(sinks, window)
    consumers.deliver(window)


class Collector(Protocol):
    """Receives this rank's completed windows. ``submit`` is called on the training thread and
    must return at once: True when the window was queued, False when it was dropped. On rank 0,
    ``consumers`` take every analyzed window after the sinks."""

    rank: int
    world_size: int
    consumers: Consumers

    def submit(self, window: PendingWindow) -> bool: ...

    def close(self) -> None: ...


_STOP = object()


class BackgroundWorker:
    """One daemon thread fed by a bounded queue; the training thread only ever calls ``offer``.

    The queue is a C ``SimpleQueue`` bounded by a size check: ``offer`` never takes a Python-level
    lock or condition, which halves its cost at a window boundary when the training thread comes
    back from a wait with cold caches (``queue.Queue.put_nowait`` is Python code around a
    Condition). The training thread is the only producer, so the check cannot overfill it.

    ``after_last`` (the owner closes its sinks there) runs once, after the last queued item:
    inside ``close`` on the closing thread when the work finished within the bound, else on the
    worker's thread when it does finish. Either way it follows the last item and is never
    skipped, and ``close`` stays bounded by the work alone.
    """

    def __init__(
        self,
        name: str,
        handle: object,
        queue_size: int,
        join_timeout_s: float,
        after_last: Callable[[], None] = lambda: None,
    ) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._maxsize = max(1, queue_size)
        self._handle = handle
        self._after_last = after_last
        self._said: set[tuple[str, str]] = set()  # the worker's failures said so far
        self._handover = threading.Lock()
        self._drained = False  # the worker took the stop marker
        self._abandoned = False  # close stopped waiting first: the worker runs after_last
        self._after_last_claimed = False
        self._join_timeout_s = join_timeout_s
        self._stopping = False
        self.activity = "idle"
        """What the thread is doing now, kept up to date by the handler (for the warning of a
        ``close`` that stops waiting for it)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread is still running (after ``close``: it overran its bound)."""
        return self._thread.is_alive()

    @property
    def full(self) -> bool:
        """Whether the next ``offer`` would be refused: work that waits should stop waiting."""
        return self._queue.qsize() >= self._maxsize

    def offer(self, item: object) -> bool:
        if self._stopping or self._queue.qsize() >= self._maxsize:
            return False
        self._queue.put(item)
        return True

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                with self._handover:
                    self._drained = True
                    mine = self._abandoned
                if mine:
                    self._run_after_last()
                return
            try:
                self._handle(item)  # type: ignore[operator]
            except Exception as exc:  # a telemetry failure is said, never raised into training
                say_failed(
                    logger,
                    "background window processing",
                    exc,
                    "that window is lost, the next ones are processed",
                    self._said,
                )
            self.activity = "idle"

    def close(self) -> None:
        """Let queued work finish, waiting at most ``join_timeout_s`` for it, then run
        ``after_last`` (left to the worker when the wait ran out). Past the wait, say what the
        (daemon) thread was doing and how many windows it leaves unprocessed. Safe twice."""
        if not self._stopping:
            self._stopping = True
            self._queue.put(_STOP)
        self._thread.join(self._join_timeout_s)
        with self._handover:
            drained = self._drained
            self._abandoned = not drained
        if drained:
            self._run_after_last()
        else:
            logger.warning(
                "stagefrontier: %s thread still %s after %.1f s at close; leaving it with "
                "%d more window(s) unprocessed",
                self._thread.name,
                self.activity,
                self._join_timeout_s,
                max(0, self._queue.qsize() - 1),  # the stop marker is not a window
            )

    def _run_after_last(self) -> None:
        with self._handover:
            if self._after_last_claimed:
                return
            self._after_last_claimed = True
        try:
            self._after_last()
        except Exception as exc:  # the owner's clean-up is telemetry too: said, never raised
            say_failed(logger, "clean-up after the last window", exc, "the run goes on")


def merge_received(
    windows: Sequence[RankWindow], world_size: int, notes: Sequence[str] = ()
) -> MergedWindow:
    """``merge_windows`` plus a step-range check: a rank whose window of the same index covers
    other steps than the reference's (its window counter drifted, e.g. a timer built later or
    an extra flush on that rank), or paused other steps of them (``StageTimer.pause``), is
    reported as mismatched instead of merged step by step with steps it never ran alongside."""
    merged = merge_windows(windows, world_size, notes)
    ref = merged.reference
    span = (ref.first_step, ref.last_step)
    drifted = [w for w in merged.ranks if (w.first_step, w.last_step) != span]
    paused_apart = [
        w
        for w in windows
        if (w.first_step, w.last_step) == span
        and w.paused_ranges != ref.paused_ranges
        and w.schema_hash == ref.schema_hash
    ]
    if not drifted and not paused_apart:
        return merged
    gone = {id(w) for w in (*drifted, *paused_apart)}
    return replace(
        merged,
        ranks=[w for w in merged.ranks if id(w) not in gone],
        mismatched_ranks=sorted(
            {*merged.mismatched_ranks, *(w.rank for w in (*drifted, *paused_apart))}
        ),
        notes=[
            *merged.notes,
            *(
                f"rank {w.rank} window {w.window} covers steps {w.first_step}-{w.last_step}, "
                f"rank {ref.rank}'s covers {span[0]}-{span[1]}: not merged"
                for w in drifted
            ),
            *(
                f"rank {w.rank} paused {_ranges_text(w.paused_ranges)} of steps "
                f"{span[0]}-{span[1]}, rank {ref.rank} paused "
                f"{_ranges_text(ref.paused_ranges)}: not merged"
                for w in paused_apart
            ),
        ],
    )


def _ranges_text(ranges: Sequence[tuple[int, int]]) -> str:
    """``steps 3-7,12`` or ``no steps``."""
    if not ranges:
        return "no steps"
    return "steps " + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def analyze_received(
    merged: MergedWindow, analyze: Callable[[MergedWindow], AnalyzedWindow]
) -> AnalyzedWindow | None:
    """``analyze`` (rank 0's ``LiveAnalysis.analyze``), never losing the window to one rank's
    data: when the analysis fails,
    every merged rank is analyzed alone, the ranks that fail alone are dropped (reported missing,
    with the error as the reason) and the rest are analyzed together. If no single rank is to
    blame, the reference rank is analyzed alone, with the reason. None only when not even that
    works (logged as an error: the window is lost)."""
    try:
        return analyze(merged)
    except Exception as exc:
        failure = _describe(exc)
    failed: dict[int, str] = {}
    for window in merged.ranks:
        try:
            analyze(merge_windows([window], merged.world_size))
        except Exception as exc:
            failed[window.rank] = _describe(exc)
    kept = [w for w in merged.ranks if w.rank not in failed]
    notes = [
        *merged.notes,
        *(f"rank {r} window dropped: its analysis failed: {why}" for r, why in failed.items()),
    ]
    if not failed and kept:
        kept = [merged.reference]
        notes.append(
            f"the merged ranks could not be analyzed together ({failure}): rank "
            f"{merged.reference.rank} analyzed alone"
        )
    if not kept:
        logger.error(
            "stagefrontier: window %d lost: no rank's window could be analyzed: %s",
            merged.reference.window,
            failure,
        )
        return None
    dropped = [w.rank for w in merged.ranks if not any(w is k for k in kept)]
    salvaged = replace(
        merged,
        reference=kept[0],
        ranks=kept,
        missing_ranks=sorted([*merged.missing_ranks, *dropped]),
        notes=notes,
    )
    try:
        return analyze(salvaged)
    except Exception as exc:
        logger.error(
            "stagefrontier: window %d lost: analysis failed even without ranks %s: %s",
            merged.reference.window,
            sorted(failed),
            _describe(exc),
        )
        return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
