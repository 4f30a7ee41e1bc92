"""Rank 0's side of the router, on the router thread: each analyzed window the analysis thread
hands over (``take``) is put to the policy (``policy``); an incident it plans is opened with a
request in the store, its capture session followed until every named rank answered or timed
out (``capture_session``), and the settled incident reduced and written
(``incident_writer``). One incident is in flight at a time.

Nothing here runs on the training thread; every failure is logged and recorded as a reason.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..environment import current_attempt
from ..formats.incident import incident_id_of, new_incident
from ..render.incident import summary_line
from ..sinks.output_folder import shared_folder
from ..window.merged import AnalyzedWindow, wall_clock
from .capture import incident_dir
from .capture_session import CaptureSession, OpenCapture, export_cpu, settle_answers
from .decide import start_margin
from .incident_writer import IncidentWriter, capture_cost
from .policy import CapturePolicy, Plan
from .reduction import leave_for_after_run, live_windows
from .requests import CaptureRequest, ManualAnswer, ManualRequest, RequestChannel

logger = logging.getLogger("stagefrontier")

LIVE_WINDOWS = 16
"""Analyzed windows kept for the live side of a confirmation."""


class Coordinator:
    """A ``WindowConsumer`` of rank 0's analysis thread (``take``), driven by the router
    thread (``tick``, ``finish``)."""

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
        self.current_step = current_step
        self.world_size = world_size
        self.policy = CapturePolicy(config)
        self.session = CaptureSession(channel)
        self.writer = IncidentWriter(config, out_dir)
        self.windows: queue.SimpleQueue[AnalyzedWindow] = queue.SimpleQueue()
        self.live: deque[AnalyzedWindow] = deque(maxlen=LIVE_WINDOWS)
        self.open: OpenCapture | None = None
        self.step_s = float("nan")
        self.closing = False
        self.run_ending = run_ending
        self._stale_checked = False

    @property
    def captures(self) -> int:
        """The captures opened so far (their requests written)."""
        return self.policy.captures

    # ------------------------------------------------------------------ analysis thread
    def take(self, window: AnalyzedWindow) -> None:
        """The analysis thread's hand-off: queued for the router thread, nothing more."""
        self.windows.put(window)

    # ------------------------------------------------------------------ router thread
    def tick(self) -> None:
        if not self._stale_checked:
            self._stale_checked = True
            self.session.delete_previous_attempt()
            self.writer.remove_temporaries()
        while True:
            try:
                window = self.windows.get_nowait()
            except queue.Empty:
                break
            self.live.append(window)
            self._hold(window)
            self.policy.remember(window)
            if window.report.n_steps:
                self.step_s = window.report.exposed_s / window.report.n_steps
            if self.open is None and not self.closing:
                plan = self.policy.consider(window)
                if plan is not None:
                    self._open(plan)
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
        self.writer.draw_pending()

    def request_capture(self, ranks: list[int], steps: int, stage: str | None = None) -> None:
        """A manual request from Python on rank 0 (scheduled at a tick with no incident open,
        after the ones before it)."""
        self.session.local_requests.append(ManualRequest(tuple(ranks), steps, stage))

    def _manual(self) -> None:
        manual = self.session.next_manual()
        if manual is None:
            return
        world = self.world_size() if self.world_size is not None else None
        plan = self.policy.manual(manual, world, self.live[-1] if self.live else None)
        if isinstance(plan, Plan):
            self._open(plan)
            return
        logger.warning("stagefrontier router: manual capture refused: %s", plan)
        if manual.id is not None:
            self.session.answer_manual(ManualAnswer(manual.id, "refused", plan))

    def _folder_attempt(self) -> int:
        """This process's attempt in the output folder: the ``attempt`` of the newest window's
        record, which the file sinks set before the router takes the window; before the router
        took one, the attempt the folder's sinks gave or will give the first window (one
        decision, ``OutputFolder.claim_attempt``: the sinks may have written a window the
        router has not taken yet)."""
        attempt = self.live[-1].record.get("attempt") if self.live else None
        if isinstance(attempt, int):
            return attempt
        return shared_folder(self.out_dir).claim_attempt(current_attempt()[1])

    def _poll_words(self) -> str:
        """How the margin's poll reads in an incident's reasons."""
        poll_ms, travel_ms = self.config.poll_s * 1e3, self.request_poll_s * 1e3
        if travel_ms <= poll_ms:
            return f" and a {poll_ms:.0f} ms poll"
        return (
            f" and a {travel_ms:.0f} ms way to every rank (node leaders read the job's store "
            f"every {travel_ms - poll_ms:.0f} ms, their nodes' ranks theirs every {poll_ms:.0f} ms)"
        )

    def _open(self, plan: Plan) -> None:
        decision, ranks = plan.decision, plan.ranks
        window = decision.window
        if plan.trigger != "manual" and decision.suspect_rank == decision.reference_rank:
            logger.info(
                "stagefrontier router: no capture for window %d: suspect rank %d would be its "
                "own reference",
                window,
                decision.suspect_rank,
            )
            return
        manual = self.captures if plan.trigger == "manual" else None
        incident_id = incident_id_of(window, self._folder_attempt(), manual)
        steps = plan.steps or self.config.steps
        margin = start_margin(self.step_s, self.request_poll_s)
        first = self.current_step() + margin
        request = CaptureRequest(incident_id, tuple(ranks), first, steps, decision.stage or None)
        incident = new_incident(incident_id, plan.trigger)
        opened_ns = time.time_ns()
        incident.update(
            wall_clock=wall_clock(opened_ns, opened_ns),
            window=window if window >= 0 else None,
            steps=[request.first_step, request.last_step],
            stage=decision.stage or None,
            leader_rank=decision.suspect_rank,
            reference_rank=decision.reference_rank,
            requested_ranks=list(ranks),
            **({"lead_block_steps": decision.burst} if decision.burst > 1 else {}),
            **({"routed_below_top": True} if decision.below_top else {}),
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
            **(plan.extra or {}),
        )
        now = time.monotonic()
        step_s = self.step_s if math.isfinite(self.step_s) else 1.0
        deadline = now + (margin + steps + 2) * step_s + self.config.capture_timeout_s
        try:
            self.session.write_request(request)
        except Exception as exc:
            incident["reasons"].append(f"writing the request failed: {exc}")
            self.writer.write(incident)
            self.policy.opened(window, counted=False)
            if plan.manual_id is not None:
                failed = ManualAnswer(plan.manual_id, "refused", f"writing failed: {exc}")
                self.session.answer_manual(failed)
            return
        self.open = OpenCapture(request, incident, now, deadline, manual_id=plan.manual_id)
        self.policy.opened(window, counted=True)
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

    def _hold(self, window: AnalyzedWindow) -> None:
        """A window that holds steps of the open capture stays with it until it settles."""
        current = self.open
        if current is None:
            return
        ref, request = window.merged.reference, current.request
        if ref.first_step <= request.last_step and ref.last_step >= request.first_step:
            current.windows.append(window)

    def _advance(self) -> None:
        current = self.open
        assert current is not None
        self.session.read_answers(current)
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
        incident, request = current.incident, current.request
        settled = settle_answers(current, self.out_dir, why)
        for trace in settled.kept:
            self.policy.keep_trace(trace)
        if not incident["captured"]:
            incident["reasons"].append("not captured: " + self._why_not(request, settled.files))
        export = export_cpu(current)
        reduction = 0.0
        windows = [w for w in current.windows if not any(w is k for k in self.live)]
        windows.extend(self.live)
        live = [block for w in windows for block in live_windows(w)]
        since = self.policy.first_step(incident["window"], request.first_step)
        capture_cost(incident, request, live, since)
        if incident["captured"] and len(settled.local) == len(settled.files):
            if self.closing or self.run_ending():  # by the process ``finish`` starts
                leave_for_after_run(incident)
            else:
                unanalyzed(incident, windows)
                reduction = self.writer.reduce(incident, settled.local, live, windows, self.step_s)
        if export or reduction:
            incident["router_cpu_s"] = {"export": export, "reduction": round(reduction, 4)}
        incident["time_to_confirmation_s"] = round(time.monotonic() - current.opened, 3)
        self.policy.settled(self.current_step() + 1)
        self.writer.write(incident)
        self.session.clean_up(request)
        if current.manual_id is not None:
            folder = str(incident_dir(self.out_dir, request.id).resolve())
            self.session.answer_manual(ManualAnswer(current.manual_id, "opened", folder))
        logger.info("stagefrontier: %s", summary_line(incident))

    def _why_not(self, request: CaptureRequest, files: dict[int, str]) -> str:
        if files:
            return f"only ranks {sorted(files)} of {list(request.ranks)} wrote a trace"
        if self.closing and self.current_step() <= request.first_step:
            return f"training ended before step {request.first_step}"
        return "no named rank wrote a trace"


def unanalyzed(incident: dict[str, Any], windows: list[AnalyzedWindow]) -> None:
    """Captured steps that no analyzed window holds, as a reason: the live side of the
    confirmation lacks them. Lost when a window past them arrived (dropped from the full
    hand-off queue, or its analysis failed); else not analyzed before the capture timed out."""
    first, last = incident["steps"]
    spans = [(w.merged.reference.first_step, w.merged.reference.last_step) for w in windows]
    missing = [s for s in range(first, last + 1) if not any(a <= s <= b for a, b in spans)]
    if not missing:
        return
    why = (
        "their window was dropped from the analysis hand-off (its queue was full) or its "
        "analysis failed"
        if any(b >= last for _, b in spans)
        else "their window was not analyzed before the capture settled"
    )
    incident["reasons"].append(
        f"no analyzed window holds captured step(s) {', '.join(map(str, missing))}: {why}; "
        "the trace is compared with the live steps that remain"
    )
