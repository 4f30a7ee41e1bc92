"""One capture's session in the job's store, for rank 0's router: the request written, the
named ranks' answers read (or timed out), the keys cleaned up; the manual requests read and
answered; and, when the session settles, what the answers say written into the incident."""

from __future__ import annotations

import logging
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..collect.store import previous_attempt_prefix
from ..errors import ReportFormatError
from ..formats.limits import regular_file_inside
from ..render.escape import printable
from ..window.merged import AnalyzedWindow
from .policy import EarlierTrace
from .requests import (
    MANUAL_KEY,
    REQUEST_KEY,
    CaptureRequest,
    CaptureStatus,
    ManualAnswer,
    ManualRequest,
    RequestChannel,
    manual_answer_key,
    status_key,
)

logger = logging.getLogger("stagefrontier")


@dataclass
class OpenCapture:
    """The incident in flight."""

    request: CaptureRequest
    incident: dict[str, Any]
    opened: float
    deadline: float
    answers: dict[int, CaptureStatus] = field(default_factory=dict)
    manual_id: str | None = None
    """The id of the manual request it answers (``stagefrontier capture`` waits for it)."""
    windows: list[AnalyzedWindow] = field(default_factory=list)
    """The analyzed windows that hold requested steps, kept with the capture until it settles
    (the router's live windows are only the latest ones: while its thread runs a trace's
    export, the windows analyzed meanwhile can push those of the captured steps out)."""


@dataclass(frozen=True)
class Settled:
    """What a settled capture left: the traces on this host by rank, those of every host by
    rank, and the traces to keep as later references."""

    local: dict[int, str]
    files: dict[int, str]
    kept: list[EarlierTrace]


class CaptureSession:
    """Rank 0's reads and writes in the store, through the router's ``channel``. A failed
    store call is a debug line (a read is tried again at the next tick) or, for the request
    itself, raised to the caller, which records it in the incident."""

    def __init__(self, channel: RequestChannel) -> None:
        self.channel = channel
        self.local_requests: deque[ManualRequest] = deque()
        """Requests made by ``ProfilerRouter.request_capture`` in this process, oldest first."""

    def delete_previous_attempt(self) -> None:
        """A torchelastic restart: the previous attempt's open request and manual keys."""
        previous = previous_attempt_prefix(self.channel.scope)
        if previous is None:
            return
        try:
            old = RequestChannel(self.channel.base, previous)
            old.delete(REQUEST_KEY, MANUAL_KEY)
        except Exception as exc:
            logger.debug("stagefrontier router: deleting stale request keys failed: %s", exc)

    def next_manual(self) -> ManualRequest | None:
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

    def answer_manual(self, answer: ManualAnswer) -> None:
        try:
            self.channel.write(manual_answer_key(answer.id), answer.encode())
        except Exception as exc:
            logger.debug("stagefrontier router: answering a manual request failed: %s", exc)

    def write_request(self, request: CaptureRequest) -> None:
        """The request, for every rank to read (raises what the store raises)."""
        self.channel.write(REQUEST_KEY, request.encode())

    def read_answers(self, current: OpenCapture) -> None:
        """The named ranks' answers that arrived since the last read, into ``current``."""
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

    def clean_up(self, request: CaptureRequest) -> None:
        try:
            self.channel.delete(REQUEST_KEY, *(status_key(request.id, r) for r in request.ranks))
        except Exception as exc:
            logger.debug("stagefrontier router: cleaning up request keys failed: %s", exc)


def settle_answers(current: OpenCapture, out_dir: str, why: str) -> Settled:
    """Write what the named ranks answered into the incident (its traces, their hosts and
    sizes, the steps captured, the training thread's cost); every gap becomes a reason."""
    incident = current.incident
    request = current.request
    reasons: list[str] = incident["reasons"]
    host = socket.gethostname()
    files: dict[int, str] = {}
    local: dict[int, str] = {}
    kept: list[EarlierTrace] = []
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
        # A trace missing from this host is said first: the reasons after it speak of a trace
        # that exists ("left unread").
        if answer.host == host and regular_file_inside(answer.path, out_dir) is None:
            reasons.append(
                f"rank {rank}'s trace {answer.path} never appeared on disk as a regular "
                "file inside the run folder"
            )
            continue
        if answer.last_step < request.first_step:  # paused or closed at the first step
            reasons.append(
                f"rank {rank} captured no step: its capture ended before step "
                f"{request.first_step} did; its trace is left unread"
            )
            continue
        files[rank] = answer.path
        incident["trace_hosts"][str(rank)] = answer.host
        incident["trace_bytes"][str(rank)] = answer.size
        if answer.host == host:
            local[rank] = answer.path
            kept.append(
                EarlierTrace(rank, answer.path, request.first_step, answer.last_step, request.id)
            )
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
    training = {
        str(rank): answer.training_s
        for rank, answer in sorted(current.answers.items())
        if answer.state == "captured"
    }
    if training:
        incident["training_thread_s"] = training
    return Settled(local, files, kept)


def export_cpu(current: OpenCapture) -> dict[str, float]:
    """The CPU seconds each captured rank's trace export took."""
    return {
        str(rank): answer.export_cpu_s
        for rank, answer in sorted(current.answers.items())
        if answer.state == "captured"
    }
