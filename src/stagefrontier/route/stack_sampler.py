"""The training thread's Python stack during a capture, sampled by a thread of the router's, and
written into the trace as the profiler's own Python events would be.

The op diff names the user's function that took the time (``model.py(22): slow_forward``). The
profiler can record it itself (``with_stack=True``: its Python tracer hooks every call of every
thread), but its stop then converts every recorded call on the training thread while holding the
GIL (0.4 to 0.5 s of the demo's ranks after a five-step capture), which the step after the
capture carries on every rank (the next collective waits for the slowest). The tracer is also
the one suspect left of a rank that died of SIGSEGV now and then in a test job (a thread
starting or ending while it hooked every thread).

So a capture runs the profiler without it, and ``StackSampler`` reads the training thread's
frames (``sys._current_frames``) every ``SAMPLE_INTERVAL_S`` from one daemon thread, started with
the router and idle between captures (no thread starts or ends while a profiler runs). At the
export, ``stack_events`` turns the samples into ``python_function`` events of the training thread:
a frame seen in consecutive samples is one event, from the first of them to the sample that no
longer shows it, named as the profiler names its Python events (``path(first line): function``,
the path relative to its ``sys.path`` entry), and the line an innermost user frame was at one
more event inside it. The op diff reads them as it read the tracer's; a function shorter than
the interval may be missed, and a builtin (``time.sleep``) is charged to the line of the Python
function that called it.

A garbage collection holds the GIL for as long as it runs (hundreds of milliseconds in a process
holding a framework's objects), and no sample can be taken meanwhile. The sampled thread cannot
run Python during another thread's collection, so its stack then is the stack it has when the
collection ends: a ``gc`` callback (while sampling) only stamps the time such a collection
started, and the next regular sample is stamped there, so the collection's time goes to the stack
read after it, not to one sampled before. Another thread holding the GIL in a long C call is
still a gap that the stack sampled before it fills.

Reading another thread's frames is where CPython 3.11 can crash (SIGSEGV in ``PyFrame_GetBack``
from a profiler thread): the reader holds frame objects of a live thread, and if the GIL passes
to that thread in the middle of the walk it pops and materializes frames under them. So the walk
holds the GIL from the first frame to the last: the switch interval is raised and the collector
paused for the few microseconds it takes (both process-wide, both restored to exactly what they
were), and the ``gc`` callback, which runs inside a collection at any allocation of another
thread, reads no frame at all.
"""

from __future__ import annotations

import gc
import linecache
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from ..failures import say_failed
from ..record.self_cost import ROUTER_THREAD
from .opdiff import is_user_frame

logger = logging.getLogger("stagefrontier")

SAMPLE_INTERVAL_S = 0.002
"""Between two samples (the GIL's switch interval, 5 ms, bounds it while the training thread
runs Python; a wait in C, a sleep or a collective, is sampled at this rate)."""
MAX_SAMPLES = 100_000
"""At most this many samples a capture (200 s at the interval): the rest are dropped."""
MAX_DEPTH = 1000
"""Frames kept of a sample, the innermost (Python's default recursion limit: a stack is rarely
deeper; a training loop under a launcher and a framework is 60 to 100 frames deep, the user's
function among the innermost)."""

Stack = tuple[CodeType, ...]
Sample = tuple[int, Stack, int]
"""When it was taken (``time.time_ns``), the frames (outermost first) and the line the
innermost one was at; no frames at a cut (``StackSampler.cut``)."""
MAX_LINE_CHARS = 80
HOLD_GIL_S = 0.1
"""The switch interval while a stack is read (20 times Python's default; a read takes tens of
microseconds), so that no other thread asks for the GIL in the middle of it."""
CLOSE_JOIN_S = 1.0
"""The longest ``close`` waits for the sampling thread to end (it takes one interval)."""


@dataclass(frozen=True)
class SampledStacks:
    """A capture's samples of one thread, and when sampling ended (``time.time_ns``)."""

    samples: list[Sample]
    pid: int
    tid: int
    """The thread's native id: the profiler's ``tid`` of its events."""
    end_ns: int


class StackSampler:
    """One daemon thread that samples a thread's Python stack between ``begin`` and ``end``.

    ``begin`` and ``end`` are called on the sampled (training) thread and only set flags; the
    samples are handed over by ``end``. ``close`` ends the thread (the timer's close)."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._wake = threading.Condition()
        self._target: int | None = None  # the thread sampled now (``threading.get_ident``)
        self._native_id = 0
        self._samples: list[Sample] = []
        self._cuts: list[int] = []  # when the sampled thread cut (``cut``), written by it alone
        self._collection_ns: int | None = None  # when another thread's collection started
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"{ROUTER_THREAD}-sampler", daemon=True
        )
        self._thread.start()

    def begin(self) -> None:
        """Sample the calling thread from now on."""
        with self._wake:
            self._samples = []
            self._cuts = []
            self._collection_ns = None
            self._target = threading.get_ident()
            self._native_id = threading.get_native_id()
            self._wake.notify()
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)

    def end(self) -> SampledStacks:
        """Stop sampling; the samples taken since ``begin``, the cuts among them, oldest
        first."""
        self._forget_collections()
        with self._wake:
            self._target = None
            samples, self._samples = self._samples, []
        cuts, self._cuts = self._cuts, []
        samples += [(at_ns, (), 0) for at_ns in cuts]
        samples.sort(key=lambda sample: sample[0])
        return SampledStacks(samples, os.getpid(), self._native_id, time.time_ns())

    def cut(self) -> None:
        """On the sampled thread, where it opens or closes a step's range: every frame open now
        ends here and starts again at the next sample. The op diff counts an event where it
        starts, inside the stage's range of a captured step; a frame seen unchanged across
        steps (a loop sleeping in its data wait every step) would start in the first one only.

        It takes no lock (``end`` puts the cuts among the samples by time): the sampling thread
        holds its lock while it reads a stack, and on a busy machine the kernel may preempt it
        there; a cut waiting for it would stretch the captured step that is ending by as much,
        after its profiler range closed, and the trace would disagree with the live step."""
        if self._target is not None and len(self._cuts) < MAX_SAMPLES:
            self._cuts.append(time.time_ns())

    def close(self) -> None:
        """End the thread and wait for it (it is idle or between two samples: at most one
        interval), so that nothing of it runs while the interpreter shuts down."""
        self._forget_collections()
        with self._wake:
            self._closed = True
            self._target = None
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_JOIN_S)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        """A garbage collection on another thread (the router's, say) holds the GIL until it
        ends, and the sampled thread cannot run Python meanwhile: its stack as the collection
        starts is its stack as it ends. Only the start is stamped (reading frames here, inside a
        collection at an arbitrary allocation, is what crashed): the next regular sample is
        stamped there (``_run``). The sampled thread's own collections are its own time, and the
        sampling thread runs none while it reads (``_sample``)."""
        if phase != "start" or self._target is None or self._collection_ns is not None:
            return
        if threading.get_ident() not in (self._target, self._thread.ident):
            self._collection_ns = time.time_ns()

    def _keep(self, sample: Sample | None) -> None:
        """Keep a sample, never stamped before the last cut: a sample is stamped before its
        stack is read, and a cut (which waits for nothing) may come in between; the stack read
        then is the next step's, and it starts just after that cut, not inside the step the cut
        closed."""
        if sample is None:
            return
        cuts = self._cuts  # end() may swap in a new list meanwhile: this one is read whole
        if cuts and cuts[-1] >= sample[0]:
            sample = (cuts[-1] + 1, sample[1], sample[2])
        self._samples.append(sample)

    def _forget_collections(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _run(self) -> None:
        last_ns = 0  # the last sample's stamp
        while True:
            with self._wake:
                while self._target is None and not self._closed:
                    self._wake.wait()
                target = self._target
                if target is None:  # closed
                    return
                try:
                    if len(self._samples) < MAX_SAMPLES:
                        collection_ns, self._collection_ns = self._collection_ns, None
                        sample = _sample(target)
                        if sample is not None:
                            if collection_ns is not None and last_ns < collection_ns < sample[0]:
                                sample = (collection_ns, sample[1], sample[2])
                            last_ns = sample[0]
                        self._keep(sample)
                except Exception as exc:  # telemetry never fails: this capture has no more
                    say_failed(logger, "sampling the training thread's stack", exc, "it stops")
                    self._target = None
            time.sleep(self._interval_s)


def _sample(thread_id: int) -> Sample | None:
    """One sample of a thread's stack, or None when the thread is gone, read while this thread
    holds the GIL throughout: the switch interval is raised, so that no other thread takes the
    GIL in the middle of the walk, and the collector paused, so that no collection (whose
    finalizers and callbacks run Python, and may release the GIL) runs inside it; both are put
    back exactly as they were. The stamp is then the moment the stack was read.

    The thread's frame is referenced only inside ``_read``: a frame kept by the sampling thread
    would keep the training loop's locals (its model, its DataLoader) alive after the loop
    returned, and free them on the sampling thread later, possibly while the interpreter shuts
    down, where freeing a tensor aborts the process (the tensor's release of the GIL cannot take
    it back then)."""
    switch_s = sys.getswitchinterval()
    collecting = gc.isenabled()
    sys.setswitchinterval(HOLD_GIL_S)
    gc.disable()
    try:
        return _read(thread_id)
    finally:
        # Kept in whole microseconds, read back as a float that may fall just short of them:
        # set as read, 249 us would come back 248, one less at every sample.
        sys.setswitchinterval((round(switch_s * 1e6) + 0.5) / 1e6)
        if collecting:
            gc.enable()


def _read(thread_id: int) -> Sample | None:
    at_ns = time.time_ns()
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return None
    return (at_ns, _stack(frame), frame.f_lineno)


def _stack(frame: FrameType | None) -> Stack:
    codes: list[CodeType] = []
    while frame is not None and len(codes) < MAX_DEPTH:
        codes.append(frame.f_code)
        frame = frame.f_back
    return tuple(reversed(codes))


def stack_events(sampled: SampledStacks, base_ns: int) -> list[dict[str, Any]]:
    """The samples as ``python_function`` events of the sampled thread, timed in microseconds
    since ``base_ns`` (the trace's ``baseTimeNanoseconds``: the profiler's events count from it
    on the same wall clock); a frame still open at the last sample ends where sampling ended.

    Where the innermost frame is the user's, the line it was at is one more event inside it
    (``<line 160: time.sleep(seconds)>``): the op diff then says what the function was doing
    (the builtin it called, which no sample of Python frames sees) as ``delay › <line ...>``.

    Ordered by start, longest first, and a caller before what it called where both span the
    same samples: the op diff nests a thread's events in that order (a stable sort by start and
    length), so a caller must come first to be the parent."""
    names: dict[Frame, str] = {}
    roots = _path_roots()
    spans: list[tuple[int, int, int, Frame]] = []  # (start, -end, depth, frame), in ns
    open_frames: list[tuple[Frame, int]] = []  # (frame, start ns), outermost first

    def name_of(frame: Frame) -> str:
        name = names.get(frame)
        if name is None:
            name = names[frame] = _name(frame, roots)
        return name

    def close_from(depth: int, at_ns: int) -> None:
        while len(open_frames) > depth:
            frame, start = open_frames.pop()
            spans.append((start, -at_ns, len(open_frames), frame))

    last_ns = sampled.end_ns
    for at_ns, stack, line in sampled.samples:
        frames: list[Frame] = list(stack)
        if stack and is_user_frame(name_of(stack[-1])):
            frames.append((stack[-1], line))
        same = 0
        while same < min(len(open_frames), len(frames)) and open_frames[same][0] == frames[same]:
            same += 1
        close_from(same, at_ns)
        open_frames.extend((frame, at_ns) for frame in frames[same:])
        last_ns = max(last_ns, at_ns)
    close_from(0, last_ns)
    spans.sort(key=lambda span: span[:3])
    return [
        {
            "ph": "X",
            "cat": "python_function",
            "name": name_of(frame),
            "pid": sampled.pid,
            "tid": sampled.tid,
            "ts": (start - base_ns) / 1e3,
            "dur": (-neg_end - start) / 1e3,
        }
        for start, neg_end, _, frame in spans
    ]


Frame = CodeType | tuple[CodeType, int]
"""A function's frame, or the line its innermost user frame was at."""


def _name(frame: Frame, roots: list[str]) -> str:
    if isinstance(frame, CodeType):
        return frame_name(frame, roots)
    code, line = frame
    text = linecache.getline(code.co_filename, line).strip()[:MAX_LINE_CHARS]
    return f"<line {line}: {text}>" if text else f"<line {line}>"


def frame_name(code: CodeType, roots: list[str]) -> str:
    """``path(first line): function`` with the path relative to the longest ``roots`` entry
    that holds it (the profiler's Python events are named so)."""
    path = code.co_filename
    for root in roots:
        if path.startswith(root):
            path = path[len(root) :]
            break
    return f"{path}({code.co_firstlineno}): {code.co_name}"


def _path_roots() -> list[str]:
    """The folders of ``sys.path``, longest first, each ending in a separator."""
    roots = {os.path.join(os.path.abspath(p or os.curdir), "") for p in sys.path}
    return sorted(roots, key=len, reverse=True)
