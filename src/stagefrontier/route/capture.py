"""A named rank's capture: the profiler around the agreed steps, on the training thread.

The router thread arms a capture (``arm``) by storing the request and asking the timer to be
told of steps (``Instrumentation.tell_steps``: one flag ``StageTimer.step()`` tests at each step's
start); ``on_step`` is called only while it is set. One step before the request's first step
(``LEAD_IN_STEPS``) this starts ``torch.profiler.profile`` (CPU, plus CUDA when available; the
``record_function`` ranges without the operators unless ``record_ops``; no Python tracer: the
training thread's Python stack is sampled instead, ``stack_sampler``, so the op diff can name
the user's function), has the timer record its stages, its steps' ends and the
between-step data waits of ``timer.iter``, ``timer.fetch`` and the callbacks' hook clocks as
profiler ranges (``Instrumentation.record_ranges``); each captured step's
``stagefrontier.step#<n>`` range opens once the step's live clock runs and closes once it
stopped (``on_step_started``, ``on_step_end``), as the stages' ranges do, so a stall of the
thread in the profiler's calls counts in both records or in neither. After the last step it
stops the sampling and the session and has the timer stop the ranges; as the next step starts
it hands the stopped session and the samples to the router thread, which has the trace written.

One session for the whole capture, started and stopped once on this thread (a session a step
killed ranks under load and slowed long captures several times over). The stop must run on
this thread, so the step after the capture carries it, made cheap by recording the ranges
alone (``profiler_session``). The trace is written by a forked child the router thread waits
for (``trace_writer``), off this process's GIL, and no capture starts on this rank until it is
done (see ``docs/router.md``, the cost of a capture).

A profiler session the router did not start is never stopped: a capture is skipped when one is
already running, and abandoned, its session left alone, when the application starts its own
during the capture (``profiler_session``). A capture ends early at ``pause()`` (with the steps
before it), at ``MAX_CAPTURE_STEPS`` steps, or once the process grew by ``max_trace_mb`` while
it ran; the answer says why. What a capture costs the training thread is added to the timer's
self-cost (``capture_ns``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from ..failures import reason, say_failed
from ..record.annotate import step_range_name
from ..record.instrumentation import Instrumentation
from . import profiler_session
from .requests import MAX_CAPTURE_STEPS, CaptureRequest, CaptureState, CaptureStatus
from .stack_sampler import SampledStacks, StackSampler, stack_events
from .trace_parts import TraceParts
from .trace_slice import drop_slice, remove_slice, write_slice
from .trace_writer import WRITE_TIMEOUT_S, anonymous_resident_bytes, export_failure, write_trace
from .worker_profile import WorkerCapture

logger = logging.getLogger("stagefrontier")

TRACE_NAME = "rank{rank}.pt.trace.json.gz"


def incident_dir(out_dir: str | os.PathLike[str], incident_id: str) -> Path:
    return Path(out_dir) / "incidents" / incident_id


LEAD_IN_STEPS = 1
"""The profiler starts this many steps before the first captured step, so the data wait that
step consumes (fetched before it begins, or prefetched in the step before) is in the trace."""


class RankCapture:
    """One rank's capture state. ``arm`` runs on the router thread, ``on_step`` and ``finish``
    on the training thread; ``export`` (handed to the router thread) writes the trace."""

    def __init__(
        self,
        timer: Instrumentation,
        *,
        out_dir: str,
        with_stack: bool,
        max_trace_bytes: int,
        record_ops: bool = False,
        submit: Callable[[Callable[[], None]], None],
        answer: Callable[[CaptureStatus], None],
    ) -> None:
        self._timer = timer
        self._out_dir = out_dir
        # started here, idle between captures: no thread starts or ends while a profiler runs
        self._sampler = StackSampler() if with_stack else None
        self._max_trace_bytes = max_trace_bytes
        self._record_ops = record_ops
        self._submit = submit  # runs a job on the router thread
        self._answer = answer  # posts a status (on the router thread)
        self._request: CaptureRequest | None = None
        self._withdrawn: tuple[str, str] | None = None  # (request id, why), set by the router
        self._prof: Any = None
        self._parts: TraceParts | None = None  # the running capture's trace, part by part
        self._step_scope: Any = None
        self._range_step: int | None = None  # the step whose range opens once its clock runs
        self._host = socket.gethostname()
        self._session = 0  # ``profiler_session.started()`` right after our start
        self._rss_start: int | None = None
        self._note = ""  # why the running capture ends or ended early, for its answer
        self._spent_ns = 0  # the running capture's time on this thread so far
        self._entered_ns = 0  # when the call into this object running now began
        self._workers = WorkerCapture(timer)  # the DataLoader's workers, profiled alongside
        self._saved = threading.Event()  # clear while the router thread has a trace written
        self._saved.set()
        # the stopped capture's request and its trace's export, held until the next step
        self._held: tuple[CaptureRequest, Callable[[], None]] | None = None

    @property
    def _rank(self) -> int:
        """The timer's rank (known once its collector exists: it may be built late)."""
        return int(self._timer.rank)

    # ------------------------------------------------------------------ router thread
    def arm(self, request: CaptureRequest) -> None:
        if self._request is not None:
            self._answer(self._status(request, "skipped", "another capture is in progress"))
            return
        self._request = request
        self._timer.tell_steps(True)

    def pending(self) -> str | None:
        """The armed request's id, not started yet (read on the router thread: it may start)."""
        request = self._request
        return request.id if request is not None and self._prof is None else None

    def withdraw(self, request_id: str, reason: str) -> None:
        """The store no longer holds request ``request_id``: if it has not started by the next
        step, it never will (the training thread answers it skipped with ``reason``)."""
        self._withdrawn = (request_id, reason)

    # ------------------------------------------------------------------ training thread
    def on_step(self, step: int) -> None:  # each step's start (before its clock) while armed
        self._guarded(lambda: self._on_step(step), f"the profiler capture at step {step}")

    def on_step_started(self) -> None:
        """Called once a step's live clock runs: a captured step's range opens (and closes once
        the clock stopped, ``on_step_end``): a stall in the profiler's calls, which give the
        GIL away, counts in both records or in neither; what runs between steps in neither."""
        self._guarded(self._open_step_range, "opening the step's profiler range")

    def on_step_end(self) -> None:
        self._guarded(self._close_step_range, "closing the step's profiler range")

    def _guarded(self, call: Callable[[], None], doing: str) -> None:
        """``call`` on the training thread, its time charged: a failure abandons the capture."""
        start = self._entered_ns = time.perf_counter_ns()
        try:
            call()
        except Exception as exc:  # telemetry never fails training
            say_failed(logger, doing, exc, "the capture is abandoned")
            self._abort(f"{doing} failed: {reason(exc)}")
        self._charge(start)

    def on_pause(self, step: int) -> None:
        """Called at the start of every paused step while a capture is armed or running: a
        running capture ends with the steps before the pause; one whose first step is paused
        is skipped."""
        self._guarded(lambda: self._paused(step), f"ending the capture at the pause of step {step}")

    def _paused(self, step: int) -> None:
        self._release_held()
        request = self._request
        if request is None:
            self._timer.tell_steps(False)
        elif self._prof is not None:
            self._close_step_range()
            self._note = f"the timer was paused at step {step}: the capture ends before it"
            self._stop(request, step - 1)
        elif step >= request.first_step:
            self._give_up(f"the timer on rank {self._rank} was paused at step {step}")

    def _charge(self, start_ns: int) -> None:
        """Add the time since ``start_ns`` to the timer's self-cost and to this capture's."""
        spent = time.perf_counter_ns() - start_ns
        self._timer.charge(spent)
        self._spent_ns += spent

    def _on_step(self, step: int) -> None:
        self._release_held()
        request = self._request
        if request is None:
            self._timer.tell_steps(False)
            return
        if self._prof is None:
            withdrawn = self._withdrawn
            if withdrawn is not None and withdrawn[0] == request.id:
                self._give_up(withdrawn[1])
                return
            if step < request.first_step - LEAD_IN_STEPS:
                return
            if step > request.first_step:
                self._give_up(
                    f"the request reached rank {self._rank} at step {step}, after its first "
                    f"step {request.first_step}"
                )
                return
            self._start(request, step)
            return
        self._close_step_range()
        if profiler_session.foreign(self._session) is not None:
            self._stop(request, step - 1)  # abandoned: the session is not ours any more
            return
        if step > request.last_step:
            self._stop(request, request.last_step)
            return
        over = self._over_budget(step)
        if over:
            self._note = over
            self._stop(request, step - 1)
            return
        self._mark_step_range(step)

    def _over_budget(self, step: int) -> str:
        """Why the running capture must stop before ``step`` (empty while within budget): the
        profiler holds every event in memory until it stops, so the growth of the process's
        anonymous memory since the capture started is its size."""
        if self._rss_start is None:
            return ""
        rss = anonymous_resident_bytes()
        grown = 0 if rss is None else rss - self._rss_start
        if grown <= self._max_trace_bytes:
            return ""
        return (
            f"stopped before step {step}: the process grew by {grown / 2**20:.0f} MiB while "
            f"profiling, over the {self._max_trace_bytes / 2**20:.0f} MiB budget (max_trace_mb)"
        )

    def finish(self, step: int) -> None:
        """The timer closes: stop a running capture (its trace covers the steps run) or answer
        an armed one that never started."""
        self._entered_ns = time.perf_counter_ns()
        request = self._request
        if request is not None:
            self._finish(request, step)
        self._release_held()  # no step follows

    def _finish(self, request: CaptureRequest, step: int) -> None:
        ended = f"training on rank {self._rank} ended before step {request.first_step}"
        if self._prof is None:
            self._give_up(ended)
            return
        self._close_step_range()
        if step <= request.first_step:  # only the lead-in ran: nothing of the request was traced
            self._abort(ended, state="skipped")
            return
        self._stop(request, step - 1)

    def _start(self, request: CaptureRequest, step: int) -> None:
        import torch

        if torch._C._autograd._profiler_enabled():
            self._give_up("a profiler the user started is already active on this rank")
            return
        if not self._saved.is_set():
            self._give_up(
                f"rank {self._rank} is still writing the trace of its last capture (a writer "
                f"may take up to {WRITE_TIMEOUT_S:g} s)"
            )
            return
        if request.steps > MAX_CAPTURE_STEPS:
            self._note = f"{request.steps} steps asked: capped at {MAX_CAPTURE_STEPS} steps"
            self._request = request = replace(request, steps=MAX_CAPTURE_STEPS)
        profiler_session.watch()
        folder = incident_dir(self._out_dir, request.id)
        self._parts = TraceParts(folder, TRACE_NAME.format(rank=self._rank))
        self._spent_ns = 0
        self._prof = self._new_session()
        if self._sampler is not None:
            self._sampler.begin()
        self._rss_start = anonymous_resident_bytes()
        self._workers.started()
        self._timer.record_ranges()
        if step < request.first_step or request.steps == 1:
            self._mark_step_range(step)
        else:  # the request came too late for the lead-in: this step's data wait is untraced
            self._note = f"step {step} left out: the profiler started after its data wait"

    def _new_session(self) -> Any:
        """A started profiler session of this capture (noted as the router's own)."""
        prof = profiler_session.capture_profile(self._record_ops)
        prof.start()
        self._session = profiler_session.started()
        return prof

    def _stop(self, request: CaptureRequest, last: int) -> None:
        sampled = self._end_sampling()
        foreign = profiler_session.foreign(self._session)
        prof, self._prof = self._prof, None
        parts, self._parts = self._parts, None
        self._request = None
        self._timer.stop_ranges()
        self._workers.stopped()
        note, self._note = self._note, ""
        assert parts is not None
        if foreign is not None:  # the session is not ours to stop: leave it running
            self._timer.tell_steps(False)
            self._submit(parts.discard)
            self._submit(lambda: self._answer(self._status(request, "skipped", _left(foreign))))
            return
        prof.stop()
        # what the capture took on this thread, this stop included
        spent_s = (self._spent_ns + time.perf_counter_ns() - self._entered_ns) / 1e9
        self._saved.clear()
        # held until the next step starts: this one (the stop's) runs without the fork's hold
        # of the GIL and the writer's use of a core (the timer keeps telling steps till then)
        self._held = (
            request,
            lambda: self._export(parts, prof, sampled, request, last, note, spent_s),
        )

    def _release_held(self) -> None:
        """The step after a capture (or none follows): its trace's export to the router thread."""
        held, self._held = self._held, None
        if held is not None:
            self._submit(held[1])

    def _end_sampling(self) -> SampledStacks | None:
        return self._sampler.end() if self._sampler is not None else None

    def close(self) -> None:
        """The timer closed (after ``finish``): the sampling thread ends."""
        if self._sampler is not None:
            self._sampler.close()

    def drop(self, reason: str) -> None:
        """The process ends by a signal: the capture ends (``RouterRuntime.close`` says how); a
        stopped one's trace is not written (no writer is forked while the process ends)."""
        held, self._held = self._held, None
        if held is not None:
            self._saved.set()
            why = f"{reason}: its trace was not written"
            self._submit(lambda: self._answer(self._status(held[0], "skipped", why)))
        self._prof, parts, self._parts = None, self._parts, None
        if parts is not None:
            self._submit(parts.discard)
        self._workers.stopped()
        self._give_up(reason)

    def _give_up(self, reason: str) -> None:
        request, self._request = self._request, None
        self._timer.tell_steps(False)
        if request is not None:
            self._submit(lambda: self._answer(self._status(request, "skipped", reason)))

    def _abort(self, reason: str, state: CaptureState = "failed") -> None:
        self._end_sampling()
        prof, self._prof = self._prof, None
        parts, self._parts = self._parts, None
        if parts is not None:
            self._submit(parts.discard)
        request, self._request = self._request, None
        self._timer.tell_steps(False)
        self._note = ""
        try:
            self._workers.stopped()
            self._timer.stop_ranges()
            if prof is not None and profiler_session.foreign(self._session) is None:
                prof.stop()
        except Exception as exc:
            say_failed(
                logger, "stopping the profiler after a failure", exc, "it is left to PyTorch"
            )
        if request is not None:
            self._submit(lambda: self._answer(self._status(request, state, reason)))

    def _mark_step_range(self, step: int) -> None:  # its range opens once its clock runs
        self._cut_samples()
        self._range_step = step

    def _open_step_range(self) -> None:
        import torch

        step, self._range_step = self._range_step, None
        if step is not None:
            self._step_scope = torch.profiler.record_function(step_range_name(step))
            self._step_scope.__enter__()

    def _close_step_range(self) -> None:
        scope, self._step_scope = self._step_scope, None
        self._range_step = None
        if scope is not None:
            scope.__exit__(None, None, None)
            self._cut_samples()

    def _cut_samples(self) -> None:
        if self._sampler is not None:
            self._sampler.cut()

    # ------------------------------------------------------------------ router thread
    def _export(
        self,
        parts: TraceParts,
        prof: Any,
        sampled: SampledStacks | None,
        request: CaptureRequest,
        last: int,
        note: str,
        training_s: float,
    ) -> None:
        """Write the stopped session and the samples into the rank's trace (in a forked child
        where it can: ``trace_writer``; that child then cuts the trace's slice, ``trace_slice``)
        and answer; ``training_s``: what the capture took on the training thread. The training
        thread no longer touches the session; it starts no other until the trace is written."""
        try:
            steps = range(request.first_step, last + 1)
            written = write_trace(
                lambda: _write(parts, prof, sampled),
                resident_bytes=anonymous_resident_bytes(),
                then=lambda trace: write_slice(trace, request.stage, steps),  # a child's only
            )
        finally:
            self._saved.set()
        path, error, size = written.path, written.error, 0
        if path is not None:
            try:
                size = path.stat().st_size
            except OSError as exc:
                error = export_failure(exc)
        if path is None or error:  # a full disk, a read-only folder, a killed writer: said
            parts.remove()
            remove_slice(parts.folder / parts.name)
            why = f"trace export failed, nothing was kept: {error}"
            logger.warning("stagefrontier: rank %d, incident %s: %s", self._rank, request.id, why)
            self._answer(self._status(request, "failed", why))
            return
        if size > self._max_trace_bytes:
            path.unlink(missing_ok=True)
            remove_slice(path)
            self._answer(
                self._status(
                    request,
                    "failed",
                    f"trace of {size_text(size)} exceeds the "
                    f"{size_text(self._max_trace_bytes)} limit: deleted",
                )
            )
            return
        if written.note:  # the child's slice for the reduction failed, or was cut short
            drop_slice(path, written.note)
        cpu_start = time.thread_time()
        self._workers.exported(path.parent, self._rank)
        status = self._status(request, "captured", note, str(path.resolve()), size)
        # the trace's writing (the child's CPU where a child wrote it), then the workers' profiles
        export_cpu_s = round(written.cpu_s + time.thread_time() - cpu_start, 4)
        # ``last`` is earlier if the run ended
        self._answer(
            replace(
                status,
                last_step=last,
                export_cpu_s=export_cpu_s,
                training_s=round(training_s, 4),
            )
        )

    def _status(
        self,
        request: CaptureRequest,
        state: CaptureState,
        reason: str,
        path: str = "",
        size: int = 0,
    ) -> CaptureStatus:
        return CaptureStatus(
            id=request.id,
            rank=self._rank,
            state=state,
            reason=reason,
            path=path,
            size=size,
            host=self._host,
            first_step=request.first_step,
            last_step=request.last_step,
        )


def _write(parts: TraceParts, prof: Any, sampled: SampledStacks | None) -> Path:
    """The stopped session's JSON, then the sampled stacks, into the trace: its path (or
    raises)."""
    parts.append(parts.save(prof))
    if sampled is not None:
        parts.append_events(lambda base: stack_events(sampled, base))
    return parts.join()


def _left(why: str) -> str:
    return f"{why}: the capture is abandoned and that session left as it is"


def size_text(size: int) -> str:
    """A byte count people can compare: ``512 bytes``, ``3.4 KiB``, ``12.0 MiB`` (a small
    limit never reads "0.0 MiB exceeds 0.0 MiB")."""
    if size < 1 << 10:
        return f"{size} bytes"
    if size < 1 << 20:
        return f"{size / 2**10:.1f} KiB"
    return f"{size / 2**20:.1f} MiB"
