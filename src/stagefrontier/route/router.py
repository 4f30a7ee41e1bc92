"""``ProfilerRouter``: the configuration, and the per-rank runtime it attaches to a StageTimer.

Every rank gets one router thread with its own store connection. It watches the request key
and arms this rank's capture when the rank is named; it runs the trace export; on rank 0 it also
runs the coordinator (decision, request, answers, confirmation, incident). Under hierarchical
collection only node leaders read the request in the job's store, and copy it into their node's
store for the node's other ranks (``relay``); a leader's thread also tells its collector which
ranks a request names, so that the node's part carries their rows of the captured steps to
rank 0.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..analysis.block_lead import LeadTest
from ..analysis.gates import Gates
from ..collect.base import Consumers
from ..collect.hierarchical import NodeLeader
from ..collect.settings import (
    FLAG,
    MAX_TIMEOUT_S,
    between,
    check_fields,
    check_has_methods,
    check_int,
    check_optional_text,
)
from ..collect.store import claim_scope, release_scope
from ..errors import NoStoreError, ReportFormatError, StageFrontierError, TimerSettingError
from ..failures import say_failed
from ..record.instrumentation import Instrumentation
from ..render.escape import first_line, printable
from . import profiler_session
from .capture import RankCapture
from .coordinator import Coordinator
from .decide import MIN_SHARE, NOISE_FACTOR
from .relay import RETRY_MAX_S, RequestRelay, request_poll_s
from .requests import (
    MAX_CAPTURE_STEPS,
    MAX_VALUE_BYTES,
    CaptureRequest,
    CaptureStatus,
    RequestChannel,
    status_key,
)

logger = logging.getLogger("stagefrontier")

MAX_COUNT = 1_000_000
"""The largest count of windows, captures or a rank number the router accepts."""
MAX_TRACE_MB = 1_000_000.0
"""A terabyte: a larger trace limit is a mistake (and an infinite one overflows)."""
MAX_POLL_S = 60.0
MIN_POLL_S = 0.01
"""A faster poll reads the store hundreds of times a second on every rank (at 1e-6 s it cost a
fifth of the step time) for a request that takes a step to act on."""
END_WAIT_S = 0.5
"""At the timer's close, the longest rank 0 waits for the open incident's answers (ranks
answer as their own timers close) before settling it with what arrived (a capture setting,
``capture_timeout_s``, may be shorter)."""
MAX_NOISE_FACTOR = 100.0
OVERSIZED_REREAD_S = 10.0
"""How long a rank leaves a request value over ``MAX_VALUE_BYTES`` unread before fetching the
key again (a store gives no value's size before the value: each read fetches all of it)."""


class Attachment:
    """The runtime a timer started from a ProfilerRouter's settings, held apart from them (the
    settings stay frozen) so that ``request_capture`` reaches it."""

    __slots__ = ("runtime",)

    def __init__(self) -> None:
        self.runtime: RouterRuntime | None = None


@dataclass(frozen=True)
class ProfilerRouter:
    """Turns an actionable window into a profiler trace of the suspect rank and a reference rank.

    Give it as ``TimerConfig(router=ProfilerRouter())`` (or to either framework callback). Off by
    default. On rank 0, ``request_capture`` asks for a capture by hand. Args:
        steps: steps captured per incident, 1 to ``MAX_CAPTURE_STEPS`` (100).
        cooldown_windows: windows after an incident before the next may open.
        max_captures: incidents per run.
        max_trace_mb: a capture stops once its process grew by this much while profiling (the
            profiler holds every event in memory), and a trace file larger than this is
            deleted and the capture reported failed.
        poll_s: how often each rank's router thread reads the request key; [0.01, 60] seconds.
            Under hierarchical collection node leaders read the job's store less often once
            there are more than 50 nodes (see ``route.relay``).
        capture_timeout_s: how long past the capture's expected end rank 0 waits for a named
            rank's answer before recording the incident as not captured; [0, 86400] seconds.
        with_stack: sample the training thread's Python stack during a capture (the op diff
            names the user's functions from it; see ``route.stack_sampler``).
        record_ops: record every operator (``aten::...``) in the capture, for an op diff
            that names them; off, the capture records the ``record_function`` ranges only
            (steps, stages, the DataLoader's and the optimizer's ranges) and, on a GPU, the
            kernels, and its stop costs the training thread little (see ``docs/router.md``).
        min_share: the least share of the step by which the suspect's time in the stage must
            exceed its reference's, on average over the steps, to open an incident (and over
            the captured steps in the trace, to confirm it); [0, 1].
        noise_factor: how many standard errors of that mean per-step difference it must also
            clear in a window (the run's own step-to-step noise); >= 0.
        gates: the gates of the decision and the confirmation; the window's own by default.
        store: the store to clone for the router's connections; the job's by default.

    An argument of the wrong type or out of its range raises
    :class:`~stagefrontier.TimerSettingError` naming it. Building it with a StageTimer imports
    what the profiler's first start needs (see ``profiler_session.warm_up``), so that the first
    capture does not stall a step.
    """

    steps: int = field(default=5, metadata=between(1, MAX_CAPTURE_STEPS))
    cooldown_windows: int = field(default=5, metadata=between(0, MAX_COUNT))
    max_captures: int = field(default=3, metadata=between(0, MAX_COUNT))
    max_trace_mb: float = field(default=200.0, metadata=between(0.0, MAX_TRACE_MB, open_low=True))
    poll_s: float = field(default=0.05, metadata=between(MIN_POLL_S, MAX_POLL_S))
    capture_timeout_s: float = field(default=30.0, metadata=between(0.0, MAX_TIMEOUT_S))
    with_stack: bool = field(default=True, metadata=FLAG)
    record_ops: bool = field(default=False, metadata=FLAG)
    min_share: float = field(default=MIN_SHARE, metadata=between(0.0, 1.0))
    noise_factor: float = field(default=NOISE_FACTOR, metadata=between(0.0, MAX_NOISE_FACTOR))
    gates: Gates | None = None
    store: Any = None
    _attached: Attachment = field(default_factory=Attachment, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check every argument (each number against the range its field states); a wrong one
        raises TimerSettingError naming it."""
        check_fields(self, "ProfilerRouter")
        if self.gates is not None and not isinstance(self.gates, Gates):
            raise TimerSettingError(
                f"ProfilerRouter gates must be a Gates or None, got {self.gates!r:.60}"
            )
        if self.store is not None:
            check_has_methods(
                "ProfilerRouter store", self.store, "set", "get", "check", "delete_key"
            )

    def attach(self, timer: Instrumentation) -> RouterRuntime:
        """Start this rank's router thread for ``timer`` (called by StageTimer)."""
        runtime = self._attached.runtime = RouterRuntime(self, timer)
        return runtime

    def request_capture(
        self, ranks: list[int], steps: int | None = None, stage: str | None = None
    ) -> None:
        """On rank 0: profile ``steps`` steps (default ``self.steps``, at most
        ``MAX_CAPTURE_STEPS``) on ``ranks`` (suspect first, then a reference) a few steps from
        now, diffing ``stage`` (default: the last window's top stage); answered with an incident
        like a decided capture. A wrong argument raises TimerSettingError naming it."""
        if not isinstance(ranks, list) or not ranks:
            raise TimerSettingError(
                f"request_capture ranks must be a non-empty list of ranks, got {ranks!r:.60}"
            )
        for rank in ranks:
            check_int("request_capture ranks", rank, 0, MAX_COUNT)
        steps = self.steps if steps is None else steps
        check_int("request_capture steps", steps, 1, MAX_CAPTURE_STEPS)
        check_optional_text("request_capture stage", stage)
        runtime = self._attached.runtime
        if runtime is None:
            raise StageFrontierError("the router is not attached to a StageTimer yet")
        runtime.request_capture(ranks, steps, stage)


class RouterRuntime:
    """One rank's router: the thread, the capture state and, on rank 0, the coordinator."""

    def __init__(self, config: ProfilerRouter, timer: Instrumentation) -> None:
        self.config = config
        self._timer = timer
        self._scope = claim_scope("router")
        self._channel = RequestChannel(config.store, scope=self._scope)
        self._relay = RequestRelay(self._channel, config.poll_s, closing=lambda: timer.closed)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._seen: set[str] = set()
        self._rejected: bytes | None = None  # the last request value refused (warned once)
        self._oversized_until = 0.0  # an oversized value is not fetched again before then
        self._said: set[tuple[str, str]] = set()  # the thread's failures said so far
        self._store_warned = False  # a failed read of the request was said
        self._store_back = False  # a read answering after failures was said
        self.capture = RankCapture(
            timer,
            out_dir=timer.out_dir,
            with_stack=config.with_stack,
            record_ops=config.record_ops,
            max_trace_bytes=int(config.max_trace_mb * 2**20),
            submit=self._jobs.put,
            answer=self._answer,
        )
        self.coordinator: Coordinator | None = None
        self._attached = False
        self._attach_coordinator()
        try:  # here, before any step, not at the first capture's start (see warm_up)
            profiler_session.warm_up()
        except Exception as exc:
            say_failed(logger, "warming the profiler up", exc, "it loads at the first capture")
        self._thread = threading.Thread(target=self._run, name="stagefrontier-router", daemon=True)
        self._thread.start()

    @property
    def rank(self) -> int:
        return int(self._timer.rank)

    def _attach_coordinator(self) -> None:
        """On rank 0, register the coordinator with the collector's analysis thread, once the
        collector exists (a timer built before ``init_process_group`` builds it at its first
        window boundary)."""
        collector = self._timer.collector
        if self._attached or collector is None:
            return
        self._attached = True
        self._relay.bind(collector)
        if self.rank != 0:
            return
        self.coordinator = Coordinator(
            self.config,
            out_dir=self._timer.out_dir,
            channel=self._channel,
            current_step=lambda: self._timer.step,
            world_size=lambda: self._timer.world_size,
            request_poll_s=request_poll_s(collector, self.config.poll_s),
            run_ending=lambda: self._timer.closed,
        )
        consumers = getattr(collector, "consumers", None)
        if isinstance(consumers, Consumers):
            test = LeadTest(self.config.min_share, self.config.noise_factor, self.config.gates)
            consumers.register(self.coordinator, lead_test=test)
        else:
            logger.warning("stagefrontier: this collector hands no windows on; the router is idle")

    def on_step(self, step: int) -> None:
        self.capture.on_step(step)

    def on_step_started(self) -> None:
        self.capture.on_step_started()

    def on_step_end(self) -> None:
        self.capture.on_step_end()

    def on_pause(self, step: int) -> None:
        self.capture.on_pause(step)

    def request_capture(self, ranks: list[int], steps: int, stage: str | None) -> None:
        coordinator = self.coordinator
        if coordinator is None:
            raise StageFrontierError("request captures on rank 0 (or with `stagefrontier capture`)")
        self._jobs.put(lambda: coordinator.request_capture(ranks, steps, stage))

    def close(self, join_s: float, process_ends: bool = False) -> None:
        """On the training thread at the timer's close: stop a running capture, then let the
        thread export, answer and (rank 0) settle the open incident, waiting at most
        ``join_s`` from the call for it (what the timer's close deadline leaves it).

        ``process_ends``: the process ends by a signal and this runs on another thread (see
        ``record.on_sigterm``): a capture armed or running ends with the reason, its trace
        discarded and its profiler session left to end with the process (a session is the
        training thread's to stop); a trace held for export is not written (no writer is forked
        while the process ends) and its capture answered skipped; the sampling ends
        with ``capture.close``."""
        ends = time.monotonic() + join_s
        if process_ends:
            self.capture.drop(f"rank {self.rank}'s process was ended by SIGTERM during the capture")
        else:
            self.capture.finish(self._timer.step)
        self.capture.close()
        self._jobs.put(None)
        self._thread.join(max(ends - time.monotonic(), 0.0))
        if self._thread.is_alive():
            logger.warning(
                "stagefrontier: rank %d's router thread was still busy %.3g s after its timer "
                "closed; the rank goes on without it (a last trace or incident may be missing)",
                self.rank,
                join_s,
            )
        release_scope(self._scope, "router")

    # ------------------------------------------------------------------ router thread
    def _run(self) -> None:
        poll = self.config.poll_s
        while True:
            try:
                job = self._jobs.get(timeout=poll)
            except queue.Empty:
                self._safely(self._tick)
                continue
            if job is None:
                break
            self._safely(job)
        self._safely(self._refuse_late)
        if self.coordinator is not None:
            wait = min(self.config.capture_timeout_s, END_WAIT_S)
            self._safely(lambda: self.coordinator.finish(wait))  # type: ignore[union-attr]
        self._safely(self._relay.close)

    def _safely(self, job: Callable[[], None]) -> None:
        try:
            job()
        except Exception as exc:
            say_failed(logger, "a router thread job", exc, "the router goes on", self._said)

    def _tick(self) -> None:
        self._attach_coordinator()
        self._watch()
        if self.coordinator is not None:
            self.coordinator.tick()

    def _watch(self) -> None:
        if not self._relay.due() or time.monotonic() < self._oversized_until:
            return
        data = self._read_request()
        if self._relay.failures:  # read again after the back-off
            return
        if data is not None and len(data) > MAX_VALUE_BYTES:  # refused below, warned once
            self._oversized_until = time.monotonic() + OVERSIZED_REREAD_S
        request = self._decode(data)
        pending = self.capture.pending()
        if pending is not None and (request is None or request.id != pending):
            # The store's open request is another one (or none): the armed one is stale, from
            # an incident rank 0 closed or a request written by hand. Drop it; the new one is
            # armed at a later poll, once the training thread has let the old one go.
            why = "withdrawn: " + (
                f"request {request.id} replaced it" if request else "no longer open"
            )
            self.capture.withdraw(pending, why)
            return
        if request is None or request.id in self._seen:
            return
        self._seen.add(request.id)
        collector = self._timer.collector
        if isinstance(collector, NodeLeader):  # its node's part carries the named ranks' rows
            collector.want_rows(request.ranks, request.first_step, request.last_step)
        if self.rank in request.ranks:
            self.capture.arm(request)

    def _read_request(self) -> bytes | None:
        """The request key's value, None when no request is open or the read failed (the next
        read then waits: ``RequestRelay.failed``). The first failure is said, once per run,
        and so is the first read that answers after failures."""
        if self._relay.stopped:
            return None
        try:
            data = self._relay.read()
        except NoStoreError as exc:  # a single process given no store: none comes later
            self._relay.stop()
            logger.warning(
                "stagefrontier: the router reads no capture request in this process: %s",
                printable(first_line(exc)),
            )
            return None
        except Exception as exc:
            wait = self._relay.failed()
            if not self._store_warned:
                self._store_warned = True
                logger.warning(
                    "stagefrontier: reading the capture request failed; the router reads again "
                    "in %.3g s, backing off to every %.3g s while it fails (said once): %s",
                    wait,
                    RETRY_MAX_S,
                    printable(first_line(exc)),
                )
            return None
        failures = self._relay.succeeded()
        if failures and not self._store_back:
            self._store_back = True
            logger.info(
                "stagefrontier: the capture request is readable again after %d failed read(s)",
                failures,
            )
        return data

    def _decode(self, data: bytes | None) -> CaptureRequest | None:
        """The request in the key, or None: absent, or refused (warned once per value, however
        long the value stays in the store)."""
        if data is None or data == self._rejected:
            return None
        try:
            return CaptureRequest.decode(data)
        except ReportFormatError as exc:
            self._rejected = data
            logger.warning(
                "stagefrontier: capture request rejected (ignored while it stays in the store): %s",
                printable(str(exc)),
            )
            return None

    def _refuse_late(self) -> None:
        """A request that names this rank after its training ended is answered, not left to
        time out."""
        self._relay.bind(self._timer.collector)  # built at the last hand-off, if not before
        request = self._decode(self._read_request())
        if request is None:
            return
        if request.id not in self._seen and self.rank in request.ranks:
            self._seen.add(request.id)
            reason = f"training on rank {self.rank} ended before the request arrived"
            self._answer(CaptureStatus(request.id, self.rank, "skipped", reason))

    def _answer(self, status: CaptureStatus) -> None:
        try:
            self._channel.write(status_key(status.id, status.rank), status.encode())
        except Exception as exc:
            logger.warning("stagefrontier: answering capture %s failed: %s", status.id, exc)
