"""A 2-rank Gloo job that runs long enough to outgrow a small disk budget, for
``test_disk_budget``: every step times four stages (sleeps, and a real all-reduce in the
backward stage) under store collection, and the forward stage of each window named in
``slow_windows`` and the one after it sleeps ``slow_s`` longer on every rank (an injected
regression: two windows in a row, which the check flags however loaded the machine). Launched twice
into one folder, the second launch is a job resumed into the folder of the first. With
``router``, each launch opens one profiler-router incident, on its window ``MANUAL_WINDOW``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rank_support import START_METHOD, join_gloo

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall", "model.backward_cpu_wall")
MANUAL_WINDOW = 1
"""The window the router's capture asked by hand opens its incident on."""
BUDGET_WINDOWS = 80
BUDGET_MB = 2
BUDGET_SLOW = {0: (30, 60), 1: (40,)}
"""The session's resumed job (``conftest.budget_run``): its windows an attempt, its disk budget,
and its injected regressions, per attempt the first of the two windows whose forward stage is
slower."""


@dataclass(frozen=True)
class BudgetJob:
    out_dir: str
    windows: int
    slow_windows: tuple[int, ...]
    budget_mb: int
    window: int = 10
    step_s: float = 0.004
    slow_s: float = 0.04
    ranks: int = 2
    router: bool = False
    """Give the timer a profiler router that decides no capture by itself (``min_share`` 1),
    and have rank 0 ask it for one by hand once window ``MANUAL_WINDOW`` reached it: its one
    incident opens on that window in every launch."""


def run_rank(rank: int, job: BudgetJob, port: int) -> None:
    import torch
    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.demo.train import leave_process_group

    join_gloo(rank, job.ranks, port, timeout_s=300.0)  # rank 1 waits while rank 0 asks
    collection = CollectConfig(
        mode="store",
        out_dir=job.out_dir,
        timeout_s=60.0,
        queue_size=256,  # every window reaches the analysis however loaded the machine
        log=False,
        disk_budget_mb=job.budget_mb,
    )
    router = (
        ProfilerRouter(steps=2, max_captures=1, min_share=1.0, with_stack=False)
        if job.router
        else None
    )
    timer = StageTimer(
        config=TimerConfig(STAGES, window=job.window, collection=collection, router=router)
    )
    grad = torch.zeros(64)
    for step in range(job.windows * job.window):
        window = step // job.window
        slow = window in job.slow_windows or window - 1 in job.slow_windows
        if router is not None and rank == 0 and step == (MANUAL_WINDOW + 1) * job.window:
            ask_for_capture(timer, router)
        with timer.step():
            with timer.stage(STAGES[0]):
                time.sleep(job.step_s)
            with timer.stage(STAGES[1]):
                time.sleep(job.step_s + (job.slow_s if slow else 0.0))
            with timer.stage(STAGES[2]):
                dist.all_reduce(grad)
    timer.close()
    leave_process_group()


def ask_for_capture(timer: Any, router: Any) -> None:
    """On rank 0, between two steps: once the router took window ``MANUAL_WINDOW`` (and none
    after it: the next ends only when this rank goes on), ask for a capture of ranks 1 and 0,
    and wait until the router opened its incident, which is then on that window."""
    coordinator = timer._router.coordinator
    deadline = time.monotonic() + 120.0
    while not coordinator.live or coordinator.live[-1].merged.reference.window < MANUAL_WINDOW:
        assert time.monotonic() < deadline, "the router never took the window"
        time.sleep(0.01)
    router.request_capture([1, 0], steps=2)
    while not coordinator.captures:
        assert time.monotonic() < deadline, "the router never opened the incident"
        time.sleep(0.01)


def launch(job: BudgetJob) -> None:
    """Run the job's ranks to the end; fail on a rank error."""
    from stagefrontier.demo.launch import run_ranks

    codes = run_ranks(run_rank, job.ranks, job, deadline_s=300.0, start_method=START_METHOD)
    assert all(code == 0 for code in codes.values()), f"rank exit codes {codes}"
