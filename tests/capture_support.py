"""A small spawned Gloo job with a profiler router, for the tests of a capture's lifecycle.

Every rank trains a tiny MLP whose gradients it all-reduces and applies itself (DDP and
``torch.optim`` import ``torch._inductor``, which would hide the profiler's cold start) under a
StageTimer with a ``ProfilerRouter``. Rank 0 asks for one manual capture of both ranks per
phase, in order, the next once the previous incident is written; while a capture runs, every
rank does what its phase needs, keyed on the capture's own steps, so both ranks act at the same
steps:

* ``foreign``: the application starts its own ``torch.profiler.profile`` at the capture's second
  step, stops it three steps after the capture's last step and exports its trace
  (``user-rank<r>.json``);
* ``capped``: the request is written into the store by hand, with a million steps;
* ``paused``: ``timer.pause()`` before the capture's third step, ``resume()`` 15 steps later.

The ranks stop together (an all-reduce of rank 0's "done" flag every step) once every phase's
incident is written and every rank finished what its phases do.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rank_support import join_gloo, stacks_to_file

PAUSED_STEPS = 15
HUGE_STEPS = 10**6
WARM_FILE = "warm-rank{rank}.json"
CRASH_FILE = "crash-rank{rank}.txt"
"""Every thread's Python stack when the rank crashes (empty when it did not)."""
USER_TRACE = "user-rank{rank}.json"


@dataclass(frozen=True)
class CaptureJob:
    out_dir: str
    phases: tuple[str, ...]
    ranks: int = 2
    window: int = 10
    capture_steps: int = 6
    step_sleep_s: float = 0.01
    max_steps: int = 1000


def _phase(request: Any, phases: tuple[str, ...]) -> str:
    """The phase of a manual request: its id ends in ``-manual<k>`` (the router decides no
    capture by itself in this job)."""
    return phases[int(request.id.rsplit("-manual", 1)[1])]


class _Phases:
    """One rank's actions, called at the top of every step (between steps)."""

    def __init__(self, rank: int, job: CaptureJob, timer: Any) -> None:
        self.rank = rank
        self.job = job
        self.timer = timer
        self.capture = timer._router.capture
        self.user: Any = None
        self.user_stop = -1
        self.resume_at = -1
        self.seen: set[str] = set()
        self.warm: dict[str, Any] = {}
        self.sessions: dict[str, int] = {}  # profiler sessions started during each phase's capture
        self._counting: tuple[str, int] | None = None  # (phase, the count before its capture)

    def before(self, step: int) -> None:
        import torch

        from stagefrontier.route import profiler_session

        request = self.capture._request
        running = request is not None and self.capture._prof is not None
        if running and not self.warm:  # the first captured step has just started the profiler
            self.warm = {"step": step, "inductor_imported_before": self._inductor_before}
        self._inductor_before = "torch._inductor.config" in sys.modules
        if running and request.id not in self.seen:
            self.seen.add(request.id)
            # the capture's session started at the previous step's start
            self._counting = (_phase(request, self.job.phases), profiler_session.started() - 1)
        if not running and self._counting is not None:
            phase, before = self._counting
            self.sessions[phase] = profiler_session.started() - before
            self._counting = None
        phase = _phase(request, self.job.phases) if running else None
        if phase == "foreign" and step == request.first_step + 1 and self.user is None:
            self.user = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.user.start()
            self.user_stop = request.last_step + 3
        if phase == "paused" and step == request.first_step + 2:
            self.timer.pause()
            self.resume_at = step + PAUSED_STEPS
        if step == self.user_stop:
            self.user.stop()
            self.user.export_chrome_trace(
                str(Path(self.job.out_dir, USER_TRACE.format(rank=self.rank)))
            )
            self.user_stop = -1
        if step == self.resume_at:
            self.timer.resume()
            self.resume_at = -1

    @property
    def busy(self) -> bool:
        return self.user_stop >= 0 or self.resume_at >= 0

    _inductor_before = False


def _request_next(router: Any, requested: int, job: CaptureJob) -> int:
    """On rank 0: the next phase's request once the previous incident is written."""
    coordinator = router._attached.runtime.coordinator
    if requested >= len(job.phases) or coordinator is None:
        return requested
    if coordinator.open is not None or coordinator.captures != requested:
        return requested
    ranks = list(range(job.ranks))
    if job.phases[requested] == "capped":
        from stagefrontier.route.requests import MANUAL_KEY, ManualRequest, RequestChannel

        channel = RequestChannel(router.store)
        channel.write(MANUAL_KEY, ManualRequest(tuple(ranks), HUGE_STEPS, id="capped").encode())
        channel.close()
    else:
        router.request_capture(ranks)
    return requested + 1


def train_step(timer: Any, model: Any, gen: Any, sleep_s: float) -> None:
    """One timed step of the tiny MLP on a random batch (a sleep in its data stage), its
    gradients all-reduced and applied by hand."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    with timer.step():
        with timer.stage("data.next_wait"):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randint(0, 4, (8,), generator=gen)
            time.sleep(sleep_s)
        with timer.stage("model.fwd_loss_cpu_wall"):
            loss = F.cross_entropy(model(x), y)
        with timer.stage("model.backward_cpu_wall"):
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
        with timer.stage("optim.step_cpu_wall"), torch.no_grad():
            for p in model.parameters():  # plain SGD by hand: see the module doc
                p -= 0.05 * p.grad
                p.grad = None


def run_rank(rank: int, job: CaptureJob, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from stagefrontier import CollectConfig, Gates, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group

    stacks_to_file(Path(job.out_dir, CRASH_FILE.format(rank=rank)))
    join_gloo(rank, job.ranks, port, timeout_s=120.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    gen = torch.Generator().manual_seed(1000 + rank)
    router = ProfilerRouter(
        steps=job.capture_steps,
        poll_s=0.02,
        capture_timeout_s=20.0,
        max_captures=len(job.phases),
        gates=Gates(min_confident_fraction=2.0),  # no window is actionable: manual ones only
    )
    collection = CollectConfig(
        mode="store", out_dir=job.out_dir, timeout_s=10.0, log=False, regression=None
    )
    timer = StageTimer(config=TimerConfig(window=job.window, collection=collection, router=router))
    phases = _Phases(rank, job, timer)
    requested = 0
    for step in range(job.max_steps):
        phases.before(step)
        finished = False
        if rank == 0:
            requested = _request_next(router, requested, job)
            coordinator = router._attached.runtime.coordinator  # type: ignore[union-attr]
            finished = (
                requested == len(job.phases)
                and coordinator is not None
                and coordinator.open is None
                and coordinator.captures == requested
            )
        # Stop together: rank 0's incidents are written and no rank is pausing or profiling.
        flags = torch.tensor([float(finished), float(phases.busy)])
        dist.all_reduce(flags)
        if flags[0] > 0 and flags[1] == 0:
            break
        train_step(timer, model, gen, job.step_sleep_s)
    timer.close()
    record = {**phases.warm, "sessions": phases.sessions}
    Path(job.out_dir, WARM_FILE.format(rank=rank)).write_text(json.dumps(record))
    del model
    leave_process_group()
