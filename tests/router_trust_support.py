"""A 3-rank Gloo job (its ranks forked from the session's server) whose ranks 1 and 2 read the
capture request through a store with a schedule, for the tests of ``route.requests.read_key``
and the router's back-off.

Every store below is the job's real TCPStore; the schedule only decides when a call returns:

* rank 1 (``race``): once it has answered a capture, the next read of the request key that sees
  the key returns only after rank 0 deleted it (the incident closed), so the key is deleted
  between the read seeing it and the read's end: between the ``check`` and the ``get`` of a
  two-request read;
* rank 2 (``flaky``): once it has answered a capture, its next ``FLAKY_READS`` reads of the
  request key raise, as a store past its timeout does.

Rank 0 asks for a manual capture of all three ranks, then a second once the first incident is
written; the ranks stop together once the second is written. Each rank writes what the
``stagefrontier`` logger said (``log-rank<r>.txt``), what its schedule did, how many profiler
sessions its captures ran, its process id and whether it imported matplotlib
(``schedule-rank<r>.json``), and, for each profiler session's JSON written, the writing
process's id and the step the rank's loop was at (``writers-rank<r>.txt``, see
``note_trace_writers``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from capture_support import train_step
from rank_support import join_gloo, log_to_file
from stagefrontier.route.requests import REQUEST_KEY

FLAKY_READS = 4
HOLD_LIMIT_S = 60.0
"""The longest the race schedule holds a read for rank 0 to delete the key."""
LOG_FILE = "log-rank{rank}.txt"
SCHEDULE_FILE = "schedule-rank{rank}.json"
WRITERS_FILE = "writers-rank{rank}.txt"
CAPTURES = 2
CAPTURE_STEPS = 3


@dataclass(frozen=True)
class RaceJob:
    """A job of ``CAPTURES`` manual captures in a row, whose ranks 1 and 2 read the request
    through a store that races rank 0's delete (rank 1) or fails ``FLAKY_READS`` reads (rank 2)."""

    out_dir: str
    ranks: int = 3
    window: int = 10
    step_sleep_s: float = 0.01  # each step's work beside the tiny model's
    max_steps: int = 3000  # a bound only: the ranks stop together after the last capture


class Schedule:
    """What the store of one rank does, shared by every clone of it (the router opens its
    connection again after a failure)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.answered = False  # this rank wrote a capture answer
        self.armed = True  # the schedule has not acted yet
        self.held = 0  # reads held until the key was deleted
        self.raised = 0  # reads made to fail
        self.stores: list[ScheduledStore] = []
        """Every store built on it, kept alive: a c10d ``PrefixStore`` holds only the C++ side
        of a store written in Python, whose methods fail once its Python object is freed."""

    def fail_read(self, key: str) -> None:
        if self.kind != "flaky" or not self.answered or not key.endswith(REQUEST_KEY):
            return
        if self.raised < FLAKY_READS:
            self.raised += 1
            raise RuntimeError(f"injected store failure {self.raised} of {FLAKY_READS}")

    def after_seen(self, store: Any, key: str) -> None:
        """``key`` was just seen present: under the race schedule, hold the read until rank 0
        deleted it (once, after this rank answered a capture)."""
        if self.kind != "race" or not self.answered or not self.armed:
            return
        if not key.endswith(REQUEST_KEY):
            return
        self.armed = False
        end = time.monotonic() + HOLD_LIMIT_S
        while store.check([key]) and time.monotonic() < end:
            time.sleep(0.01)
        self.held += 1


class ScheduledStore(dist.Store):
    """The job's store, answering through ``schedule``."""

    def __init__(self, inner: Any, schedule: Schedule) -> None:
        super().__init__()
        self.inner = inner
        self.schedule = schedule
        schedule.stores.append(self)

    def clone(self) -> ScheduledStore:
        return ScheduledStore(self.inner.clone(), self.schedule)

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def set(self, key: str, value: Any) -> None:
        if "/route/status/" in key:
            self.schedule.answered = True
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.schedule.fail_read(key)
        return bytes(self.inner.get(key))

    def check(self, keys: list[str]) -> bool:
        for key in keys:
            self.schedule.fail_read(key)
        present = bool(self.inner.check(keys))
        if present:
            for key in keys:
                self.schedule.after_seen(self.inner, key)
        return present

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self.schedule.fail_read(key)
        value = bytes(self.inner.compare_set(key, expected, desired))
        if value != (expected.encode() if isinstance(expected, str) else bytes(expected)):
            self.schedule.after_seen(self.inner, key)
        return value

    def add(self, key: str, amount: int) -> int:
        return int(self.inner.add(key, amount))


def note_trace_writers(path: Path, step: list[int]) -> None:
    """Before each profiler session's JSON is written (the real write follows), append to
    ``path`` the writing process's id and ``step[0]``, the step the rank's loop was at as seen
    by that process (a forked writer sees the step at its fork)."""
    import torch.profiler

    export = torch.profiler.profile.export_chrome_trace

    def noted(prof: Any, trace: str) -> Any:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()} {step[0]}\n")
        return export(prof, trace)

    torch.profiler.profile.export_chrome_trace = noted  # type: ignore[method-assign]


def ask_for_a_capture_of_a_rank_against_itself(coordinator: Any) -> dict[str, Any]:
    """On rank 0 of the running job, once its captures are done: its coordinator is handed a
    regression's plan naming rank 1 as both suspect and reference, as rank 0's analysis thread
    would hand it a decided window's. What came of it: whether an incident opened, the captures
    counted, and the ranks of the request the request key holds (read on a connection of its
    own to the job's store, as every rank's watcher reads it; the last capture's request may
    still be there, as rank 0 deletes it after the incident is written)."""
    from stagefrontier.route.decide import Decision
    from stagefrontier.route.policy import Plan
    from stagefrontier.route.requests import CaptureRequest, RequestChannel

    captures = coordinator.captures
    decision = Decision("data.next_wait", 1, 1, 0.5, 40, ("rank 1 grew alone",))
    coordinator._open(Plan(decision, "regression", [1]))
    data = RequestChannel(scope=coordinator.session.channel.scope).read(REQUEST_KEY)
    return {
        "opened": coordinator.open is not None,
        "captures_before": captures,
        "captures_after": coordinator.captures,
        "request_ranks": None if data is None else list(CaptureRequest.decode(data).ranks),
    }


def run_rank(rank: int, job: RaceJob, port: int) -> None:
    import torch
    from torch import nn

    from stagefrontier import CollectConfig, Gates, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group
    from stagefrontier.route import profiler_session

    log_to_file(Path(job.out_dir, LOG_FILE.format(rank=rank)))
    store = join_gloo(rank, job.ranks, port, timeout_s=120.0)
    schedule = Schedule({1: "race", 2: "flaky"}.get(rank, "plain"))
    router = ProfilerRouter(
        steps=CAPTURE_STEPS,
        poll_s=0.02,
        capture_timeout_s=20.0,
        max_captures=CAPTURES,
        with_stack=False,
        gates=Gates(min_confident_fraction=2.0),  # no window is actionable: manual ones only
        store=None if rank == 0 else ScheduledStore(store, schedule),
    )
    collection = CollectConfig(
        mode="store", out_dir=job.out_dir, timeout_s=10.0, log=False, regression=None
    )
    timer = StageTimer(config=TimerConfig(window=job.window, collection=collection, router=router))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    gen = torch.Generator().manual_seed(1000 + rank)
    requested = 0
    step = [0]
    note_trace_writers(Path(job.out_dir, WRITERS_FILE.format(rank=rank)), step)
    refusal: dict[str, Any] = {}
    for step[0] in range(job.max_steps):
        finished = False
        coordinator = router._attached.runtime.coordinator if router._attached.runtime else None
        if coordinator is not None:
            idle = coordinator.open is None and coordinator.captures == requested
            if idle and requested == CAPTURES and not refusal:
                refusal = ask_for_a_capture_of_a_rank_against_itself(coordinator)
            finished = idle and requested == CAPTURES
            if idle and requested < CAPTURES:
                router.request_capture(list(range(job.ranks)))
                requested += 1
        flag = torch.tensor([float(finished)])
        dist.all_reduce(flag)
        if flag[0] > 0:
            break
        train_step(timer, model, gen, job.step_sleep_s)
    timer.close()
    Path(job.out_dir, SCHEDULE_FILE.format(rank=rank)).write_text(
        json.dumps(
            {
                "kind": schedule.kind,
                "held": schedule.held,
                "raised": schedule.raised,
                "sessions": profiler_session.started(),
                "pid": os.getpid(),
                "matplotlib": "matplotlib" in sys.modules,  # the job drew no figure itself
                "refusal": refusal,
            }
        )
    )
    del model
    leave_process_group()
