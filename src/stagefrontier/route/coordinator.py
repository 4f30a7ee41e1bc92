"""Rank 0's side of the router, on the router thread: decide on each analyzed window, write the
request, collect the named ranks' answers (or time them out), confirm, diff, write the incident.

Nothing here runs on the training thread; every failure is logged and recorded as a reason.
"""

from __future__ import annotations

import logging
import math
import queue
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..collect.store import previous_attempt_prefix
from ..errors import ReportFormatError
from ..failures import say_failed
from ..formats.limits import regular_file_inside
from ..formats.packet import remove_temporaries
from ..record.attempt import current_attempt
from ..record.window import AnalyzedWindow
from ..render.escape import printable
from ..render.incident import new_incident, summary_line, write_incident
from .capture import incident_dir
from .confirm import LiveWindow
from .decide import Decision, decide, regression_decision, start_margin
from .html import draw_later, write_html
from .reduction import analyze_traces, leave_for_after_run, live_windows
from .requests import (
    MANUAL_KEY,
    MAX_CAPTURE_STEPS,
    REQUEST_KEY,
    CaptureRequest,
    CaptureStatus,
    ManualAnswer,
    ManualRequest,
    RequestChannel,
    manual_answer_key,
    status_key,
)
from .worker_profile import worker_findings

logger = logging.getLogger("stagefrontier")

LIVE_WINDOWS = 16
"""Analyzed windows kept for the live side of a confirmation."""
WINDOW_STEPS_KEPT = 256
"""Step ranges of recent windows kept to tell whether an earlier trace fell in a baseline."""


@dataclass(frozen=True)
class _Trace:
    """A trace captured earlier in this run, kept as a possible reference for a regression."""

    rank: int
    path: str
    first_step: int
    last_step: int
    incident: str

    def as_reference(self, baseline: bool) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "path": self.path,
            "steps": [self.first_step, self.last_step],
            "incident": self.incident,
            "from_baseline": baseline,
        }


@dataclass
class _Open:
    """The incident in flight."""

    request: CaptureRequest
    incident: dict[str, Any]
    opened: float
    deadline: float
    answers: dict[int, CaptureStatus] = field(default_factory=dict)
    manual_id: str | None = None
    """The id of the manual request it answers (``stagefrontier capture`` waits for it)."""


class Coordinator:
    def __init__(
        self,
        config: Any,
        *,
        out_dir: str,
        channel: RequestChannel,
        current_step: Callable[[], int],
        world_size: Callable[[], int] | None = None,
        request_poll_s: float | None = None,
        run_ending: Callable[[], bool] = lambda: False,
    ) -> None:
        """``request_poll_s``: the longest a request waits between polls on its way to a rank
        (``relay.request_poll_s``; the router's poll by default), what the start margin
        covers. ``run_ending``: whether the timer is closing (its last window can settle an
        incident before ``finish`` is called)."""
        self.config = config
        self.request_poll_s = config.poll_s if request_poll_s is None else request_poll_s
        self.out_dir = out_dir
        self.channel = channel
        self.current_step = current_step
        self.world_size = world_size
        self.local_requests: deque[ManualRequest] = deque()
        """Requests made by ``ProfilerRouter.request_capture`` in this process, oldest first."""
        self.windows: queue.SimpleQueue[AnalyzedWindow] = queue.SimpleQueue()
        self.live: deque[AnalyzedWindow] = deque(maxlen=LIVE_WINDOWS)
        self.open: _Open | None = None
        self.captures = 0
        self.next_window = 0  # the first window index the cooldown allows
        self.step_s = float("nan")
        self.closing = False
        self.run_ending = run_ending
        self._stale_checked = False
        self.traces: dict[int, list[_Trace]] = {}  # rank -> its earlier local traces, oldest first
        self.window_steps: dict[int, tuple[int, int]] = {}
        self.pages_pending: list[dict[str, Any]] = []  # incident pages still without figures

    # ------------------------------------------------------------------ sink (collector thread)
    def write(self, window: AnalyzedWindow) -> None:
        self.windows.put(window)

    def close(self) -> None:
        return None

    # ------------------------------------------------------------------ router thread
    def tick(self) -> None:
        if not self._stale_checked:
            self._stale_checked = True
            self._delete_previous_attempt()
            self._remove_temporaries()
        while True:
            try:
                window = self.windows.get_nowait()
            except queue.Empty:
                break
            self.live.append(window)
            self._remember_steps(window)
            if window.report.n_steps:
                self.step_s = window.report.exposed_s / window.report.n_steps
            self._consider(window)
        if self.open is None and not self.closing:
            self._manual()
        if self.open is not None:
            self._advance()

    def finish(self, wait_s: float) -> None:
        """The run ends: analyze what is queued and settle the open incident (bounded)."""
        self.closing = True
        end = time.monotonic() + wait_s
        while True:
            self.tick()
            if self.open is None or time.monotonic() > end:
                break
            time.sleep(self.config.poll_s)
        if self.open is not None:
            self._settle("the run ended before every named rank answered")
        draw_later([incident_dir(self.out_dir, i["id"]) for i in self.pages_pending])
        self.pages_pending.clear()

    def request_capture(self, ranks: list[int], steps: int, stage: str | None = None) -> None:
        """A manual request from Python on rank 0 (scheduled at a tick with no incident open,
        after the ones before it)."""
        self.local_requests.append(ManualRequest(tuple(ranks), steps, stage))

    def _delete_previous_attempt(self) -> None:
        """A torchelastic restart: the previous attempt's open request and manual keys."""
        previous = previous_attempt_prefix(self.channel.scope)
        if previous is None:
            return
        try:
            old = RequestChannel(self.channel.base, previous)
            old.delete(REQUEST_KEY, MANUAL_KEY)
        except Exception as exc:
            logger.debug("stagefrontier router: deleting stale request keys failed: %s", exc)

    def _remove_temporaries(self) -> None:
        """Before this run's first incident: the temporary files of trace exports and incident
        writes that a killed process left in earlier incidents' folders."""
        for folder in sorted(Path(self.out_dir, "incidents").glob("*/")):
            remove_temporaries(folder, "*.tmp")

    def _consider(self, window: AnalyzedWindow) -> None:
        index = window.merged.reference.window
        if self.open is not None or self.closing:
            return
        if self.captures >= self.config.max_captures or index < self.next_window:
            return
        decision, why = decide(
            window,
            self.config.gates,
            min_share=self.config.min_share,
            noise_factor=self.config.noise_factor,
        )
        if decision is not None:
            self._open(decision, "window", [decision.suspect_rank, decision.reference_rank])
            return
        regressed = regression_decision(window)
        if regressed is None:
            logger.debug("stagefrontier router: window %d not actionable: %s", index, why)
            return
        self._open_regression(regressed, window.regression or {})

    def _open_regression(self, decision: Decision, regression: dict[str, Any]) -> None:
        """A regression's capture: the suspect alone when it has a trace from the baseline
        windows (the reference), else the suspect and a rank that did not grow."""
        suspect = decision.suspect_rank
        first, last = regression["baseline_windows"]
        earlier = self.traces.get(suspect, [])
        lo = self.window_steps.get(first, (None, None))[0]
        hi = self.window_steps.get(last, (None, None))[1]
        in_baseline = [
            t for t in earlier if lo is not None and hi is not None and lo <= t.first_step <= hi
        ]
        reasons = list(decision.reasons)
        reference: dict[str, Any] | None = None
        ranks = [suspect, decision.reference_rank]
        if in_baseline:
            reference = in_baseline[-1].as_reference(baseline=True)
            ranks = [suspect]
            reasons.append(
                f"reference: rank {suspect}'s own trace of steps {reference['steps'][0]}-"
                f"{reference['steps'][1]} (incident {reference['incident']}), taken in the "
                "baseline windows"
            )
        decision = replace(decision, reasons=tuple(reasons))
        self._open(
            decision,
            "regression",
            ranks,
            extra={"regression": regression, "reference_capture": reference},
        )

    def _remember_steps(self, window: AnalyzedWindow) -> None:
        ref = window.merged.reference
        self.window_steps[ref.window] = (ref.first_step, ref.last_step)
        while len(self.window_steps) > WINDOW_STEPS_KEPT:
            del self.window_steps[next(iter(self.window_steps))]

    def _next_manual(self) -> ManualRequest | None:
        """The oldest request made in this process, else the one in the store's manual slot
        (taken out of it, so the next client can write)."""
        if self.local_requests:
            return self.local_requests.popleft()
        try:
            data = self.channel.read(MANUAL_KEY)
            if data is None:
                return None
            self.channel.delete(MANUAL_KEY)
        except Exception as exc:
            logger.debug("stagefrontier router: reading manual requests failed: %s", exc)
            return None
        try:
            return ManualRequest.decode(data)
        except ReportFormatError as exc:
            logger.warning("stagefrontier router: manual request rejected: %s", printable(str(exc)))
            return None

    def _manual(self) -> None:
        manual = self._next_manual()
        if manual is None:
            return
        world = self.world_size() if self.world_size is not None else None
        outside = [r for r in manual.ranks if world is not None and r >= world]
        if outside:
            self._refuse_manual(
                manual,
                f"rank{'s' if len(outside) > 1 else ''} {','.join(map(str, outside))} "
                f"outside the job's {world} ranks",
            )
            return
        if self.captures >= self.config.max_captures:
            self._refuse_manual(manual, f"max_captures={self.config.max_captures} reached")
            return
        last = self.live[-1] if self.live else None
        stage = manual.stage or (last.report.top1 if last is not None else None)
        ranks = list(dict.fromkeys(manual.ranks))
        steps = min(manual.steps, MAX_CAPTURE_STEPS)
        capped = f"; capped at {MAX_CAPTURE_STEPS} steps" if steps < manual.steps else ""
        decision = Decision(
            stage=stage or "",
            suspect_rank=ranks[0],
            reference_rank=ranks[1] if len(ranks) > 1 else ranks[0],
            share=float("nan"),
            window=last.merged.reference.window if last is not None else -1,
            reasons=(f"manual request for ranks {ranks}, {manual.steps} steps{capped}",),
        )
        self._open(decision, "manual", ranks, steps, manual_id=manual.id)

    def _refuse_manual(self, manual: ManualRequest, why: str) -> None:
        logger.warning("stagefrontier router: manual capture refused: %s", why)
        if manual.id is not None:
            self._answer_manual(ManualAnswer(manual.id, "refused", why))

    def _poll_words(self) -> str:
        """How the margin's poll reads in an incident's reasons."""
        poll_ms, travel_ms = self.config.poll_s * 1e3, self.request_poll_s * 1e3
        if travel_ms <= poll_ms:
            return f" and a {poll_ms:.0f} ms poll"
        return (
            f" and a {travel_ms:.0f} ms way to every rank (node leaders read the job's store "
            f"every {travel_ms - poll_ms:.0f} ms, their nodes' ranks theirs every {poll_ms:.0f} ms)"
        )

    def _open(
        self,
        decision: Decision,
        trigger: str,
        ranks: list[int],
        steps: int | None = None,
        extra: dict[str, Any] | None = None,
        manual_id: str | None = None,
    ) -> None:
        window = decision.window
        if trigger != "manual" and decision.suspect_rank == decision.reference_rank:
            logger.info(
                "stagefrontier router: no capture for window %d: suspect rank %d would be its "
                "own reference",
                window,
                decision.suspect_rank,
            )
            return
        attempt = current_attempt()[1]
        incident_id = f"w{max(window, 0):05d}" + (f"-attempt{attempt}" if attempt else "")
        incident_id += f"-manual{self.captures}" if trigger == "manual" else ""
        steps = steps or self.config.steps
        margin = start_margin(self.step_s, self.request_poll_s)
        first = self.current_step() + margin
        request = CaptureRequest(incident_id, tuple(ranks), first, steps, decision.stage or None)
        incident = new_incident(incident_id, trigger)
        incident.update(
            window=window if window >= 0 else None,
            steps=[request.first_step, request.last_step],
            stage=decision.stage or None,
            leader_rank=decision.suspect_rank,
            reference_rank=decision.reference_rank,
            requested_ranks=list(ranks),
            reasons=[
                *decision.reasons,
                f"start margin {margin} steps at "
                + (
                    f"{self.step_s * 1e3:.1f} ms/step"
                    if math.isfinite(self.step_s)
                    else "an unknown step time (no window analyzed yet)"
                )
                + self._poll_words(),
            ],
            **(extra or {}),
        )
        now = time.monotonic()
        step_s = self.step_s if math.isfinite(self.step_s) else 1.0
        deadline = now + (margin + steps + 2) * step_s + self.config.capture_timeout_s
        try:
            self.channel.write(REQUEST_KEY, request.encode())
        except Exception as exc:
            incident["reasons"].append(f"writing the request failed: {exc}")
            self._write(incident)
            self.next_window = max(window, 0) + self.config.cooldown_windows + 1
            if manual_id is not None:
                self._answer_manual(ManualAnswer(manual_id, "refused", f"writing failed: {exc}"))
            return
        self.open = _Open(request, incident, now, deadline, manual_id=manual_id)
        self.captures += 1
        self.next_window = max(window, 0) + self.config.cooldown_windows + 1
        logger.info(
            "stagefrontier: incident %s opened: %s led by rank %d (reference rank %d); "
            "capturing steps %d-%d on ranks %s",
            incident_id,
            decision.stage or "no stage",
            decision.suspect_rank,
            decision.reference_rank,
            request.first_step,
            request.last_step,
            ",".join(map(str, ranks)),
        )

    def _advance(self) -> None:
        current = self.open
        assert current is not None
        for rank in current.request.ranks:
            if rank in current.answers:
                continue
            try:
                data = self.channel.read(status_key(current.request.id, rank))
                if data is not None:
                    current.answers[rank] = CaptureStatus.decode(data)
            except ReportFormatError as exc:
                current.answers[rank] = CaptureStatus(
                    current.request.id, rank, "failed", f"unreadable answer: {exc}"
                )
            except Exception as exc:
                logger.debug("stagefrontier router: reading answers failed: %s", exc)
        answered = len(current.answers) == len(current.request.ranks)
        covered = any(w.merged.reference.last_step >= current.request.last_step for w in self.live)
        captured = any(a.state == "captured" for a in current.answers.values())
        # A trace is compared with the live windows of its steps: wait for them (or the end).
        if answered and (covered or self.closing or not captured):
            self._settle("")
        elif time.monotonic() > current.deadline:
            self._settle(f"timed out after {current.deadline - current.opened:.1f} s")

    def _settle(self, why: str) -> None:
        """Close the open incident with what arrived; every gap becomes a reason."""
        current, self.open = self.open, None
        assert current is not None
        incident = current.incident
        request = current.request
        reasons: list[str] = incident["reasons"]
        host = socket.gethostname()
        files: dict[int, str] = {}
        local: dict[int, str] = {}
        for rank in request.ranks:
            answer = current.answers.get(rank)
            if answer is None:
                reasons.append(
                    f"rank {rank} never answered ({why or 'no answer'}): dead, disabled, or it "
                    "never saw the request"
                )
                continue
            if answer.state != "captured":
                reasons.append(f"rank {rank} {answer.state}: {answer.reason}")
                continue
            if answer.reason:  # why a capture ended early, or was capped
                reasons.append(f"rank {rank}: {answer.reason}")
            if answer.last_step < request.first_step:  # paused or closed at the first step
                reasons.append(
                    f"rank {rank} captured no step: its capture ended before step "
                    f"{request.first_step} did; its trace is left unread"
                )
                continue
            if answer.host == host and regular_file_inside(answer.path, self.out_dir) is None:
                reasons.append(
                    f"rank {rank}'s trace {answer.path} never appeared on disk as a regular "
                    "file inside the run folder"
                )
                continue
            files[rank] = answer.path
            if answer.host == host:
                self.traces.setdefault(rank, []).append(
                    _Trace(rank, answer.path, request.first_step, answer.last_step, request.id)
                )
            incident["trace_hosts"][str(rank)] = answer.host
            incident["trace_bytes"][str(rank)] = answer.size
            if answer.host == host:
                local[rank] = answer.path
            else:
                reasons.append(
                    f"rank {rank}'s trace is on host {answer.host}: reduce it there with "
                    "`stagefrontier incident`"
                )
            if answer.last_step < request.last_step:
                last = min(incident["steps"][1], answer.last_step)  # the shortest rank's
                incident["steps"] = [request.first_step, last]
                reasons.append(f"rank {rank} captured only up to step {answer.last_step}")
        incident["trace_files"] = {str(r): p for r, p in files.items()}
        incident["ranks"] = sorted(files)
        incident["captured"] = bool(files) and set(files) == set(request.ranks)
        if not incident["captured"]:
            reasons.append("not captured: " + self._why_not_captured(request, files))
        export = {
            str(rank): answer.export_cpu_s
            for rank, answer in sorted(current.answers.items())
            if answer.state == "captured"
        }
        training = {
            str(rank): answer.training_s
            for rank, answer in sorted(current.answers.items())
            if answer.state == "captured"
        }
        if training:
            incident["training_thread_s"] = training
        reduction = 0.0
        live = [block for w in self.live for block in live_windows(w)]
        self._cost(incident, request, live)
        if incident["captured"] and len(local) == len(files):
            if self.closing or self.run_ending():  # by the process ``finish`` starts
                leave_for_after_run(incident)
            else:
                reduction = self._reduce(incident, local, live)
        if export or reduction:
            incident["router_cpu_s"] = {"export": export, "reduction": round(reduction, 4)}
        incident["time_to_confirmation_s"] = round(time.monotonic() - current.opened, 3)
        self._write(incident)
        self._cleanup(request)
        if current.manual_id is not None:
            folder = str(incident_dir(self.out_dir, request.id).resolve())
            self._answer_manual(ManualAnswer(current.manual_id, "opened", folder))
        logger.info("stagefrontier: %s", summary_line(incident))

    def _reduce(
        self, incident: dict[str, Any], local: dict[int, str], live: list[LiveWindow]
    ) -> float:
        """Confirm the incident, diff its traces and its DataLoader workers' profiles, in place;
        returns the CPU seconds all of it took on this thread (the incident's reduction cost).
        The traces' part is budgeted at the captured steps' wall time (``analyze_traces``)."""
        start = time.thread_time()
        steps = incident["steps"][1] - incident["steps"][0] + 1
        step_ms = incident["capture_step_ms"] or self.step_s * 1e3
        budget = steps * step_ms / 1e3 if math.isfinite(step_ms) else None
        analyze_traces(
            incident, local, live, self.config.gates, self.out_dir, budget, self.config.min_share
        )
        incident["reduced"] = "live"
        worker_findings(incident, self.live, self.config.min_share)
        return time.thread_time() - start

    def _why_not_captured(self, request: CaptureRequest, files: dict[int, str]) -> str:
        if files:
            return f"only ranks {sorted(files)} of {list(request.ranks)} wrote a trace"
        if self.closing and self.current_step() <= request.first_step:
            return f"training ended before step {request.first_step}"
        return "no named rank wrote a trace"

    def _cost(
        self, incident: dict[str, Any], request: CaptureRequest, live: list[LiveWindow]
    ) -> None:
        """Mean step time of the captured ranks during the capture, and their median step time
        in the other steps of the same regime: from the first step of the window that opened
        the incident on (steps from before a stall began would make the capture look costly),
        in the live windows kept. Under hierarchical collection rank 0 holds their rows of the
        captured steps only, so there is no ``baseline_step_ms``."""
        ranks = list(request.ranks)
        during: list[float] = []
        outside: dict[int, float] = {}
        captured = range(request.first_step, request.last_step + 1)
        since = self.window_steps.get(incident["window"], (request.first_step, None))[0]
        for window in live:
            cols = [window.ranks.index(r) for r in ranks if r in window.ranks]
            if not cols:
                continue
            totals = window.d[:, cols, :].sum(axis=2).mean(axis=1)
            first = window.first_step
            for i, total in enumerate(totals):
                if first + i in captured:
                    during.append(float(total))
                elif first + i >= since:
                    outside[first + i] = float(total)
        if during:
            incident["capture_step_ms"] = round(float(np.mean(during)) * 1e3, 3)
        if outside:
            incident["baseline_step_ms"] = round(float(np.median(list(outside.values()))) * 1e3, 3)
            incident["baseline_steps"] = [min(outside), max(outside)]

    def _write(self, incident: dict[str, Any]) -> None:
        """``incident.json`` and ``.md``, and the page without its figures (drawn after the
        run by a process of their own: ``finish``)."""
        folder = incident_dir(self.out_dir, incident["id"])
        try:
            write_incident(folder, incident)
        except Exception as exc:
            say_failed(logger, f"writing incident {incident['id']}", exc, "it is not on disk")
            return
        try:
            write_html(folder, incident, self.out_dir, figures=False)
        except Exception as exc:
            say_failed(logger, f"writing incident {incident['id']}'s page", exc, "it has none")
        self.pages_pending.append(incident)

    def _cleanup(self, request: CaptureRequest) -> None:
        try:
            self.channel.delete(REQUEST_KEY, *(status_key(request.id, r) for r in request.ranks))
        except Exception as exc:
            logger.debug("stagefrontier router: cleaning up request keys failed: %s", exc)

    def _answer_manual(self, answer: ManualAnswer) -> None:
        try:
            self.channel.write(manual_answer_key(answer.id), answer.encode())
        except Exception as exc:
            logger.debug("stagefrontier router: answering a manual request failed: %s", exc)
