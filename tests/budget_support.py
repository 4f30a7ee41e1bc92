"""A 2-rank Gloo job that runs long enough to outgrow a small disk budget, for
``test_disk_budget``: every step times eight stages (sleeps, a real all-reduce in the backward
stage, and five that cost next to nothing) under store collection, and the forward stage of
each window named in ``slow_windows`` and the one after it sleeps longer on every rank (an
injected regression: two windows in a row, each sized to clear the check's threshold twice over
against the steps before it, ``regression_sleep_s``, so that the check flags it however loaded
the machine). Launched twice into one folder, the second launch is a job resumed into the folder
of the first. With ``router``, each launch opens one profiler-router incident, on its window
``MANUAL_WINDOW``."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rank_support import START_METHOD, join_gloo
from stagefrontier.analysis.noise import MAD_TO_SIGMA, MEDIAN_SE
from stagefrontier.analysis.regression import DEFAULT_REGRESSION
from trace_support import FIGURES_LATER, drawn_pages

STAGES = (
    "data.next_wait",
    "model.fwd_loss_cpu_wall",
    "model.backward_cpu_wall",
    "optim.step_cpu_wall",
    "callbacks.cpu_wall",
    "eval.cpu_wall",
    "ckpt.save_cpu_wall",
    "log.flush_cpu_wall",
)
MANUAL_WINDOW = 1
"""The window the router's capture asked by hand opens its incident on."""
BUDGET_WINDOWS = 80
BUDGET_MB = 2
BUDGET_SLOW = {0: (30, 60), 1: (40,)}
"""The session's resumed job (``conftest.budget_run``): its windows an attempt, its disk budget,
and its injected regressions, per attempt the first of the two windows whose forward stage is
slower. The budget decides what the tests see, not the job's timing. With ``STAGES``' eight
stages a window writes about 12.5 kB of record and 15 kB of packet (the last five stages cost
no time; they make each window's files bigger): the first launch alone writes more than the
budget, so each launch's incident page is left without its figures when they are drawn after
it; the two launches' whole records (160 x 12.5 kB) and the packets no compaction deletes
before it cuts records pass the budget, so one of the second launch's compactions must cut
records; cut down to their summary (about 3.6 kB), they leave the folder well within it."""


@dataclass(frozen=True)
class BudgetJob:
    out_dir: str
    windows: int
    slow_windows: tuple[int, ...]
    budget_mb: int
    window: int = 10
    step_s: float = 0.004
    slow_s: float = 0.04
    """The injected regression's least sleep per step (more on a busy machine:
    ``regression_sleep_s``)."""
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
    baseline = DEFAULT_REGRESSION.baseline_windows * job.window
    recent: deque[float] = deque(maxlen=baseline)  # this rank's last steps, wall seconds
    slow_s = 0.0
    for step in range(job.windows * job.window):
        window = step // job.window
        if window in job.slow_windows and step % job.window == 0:
            slow_s = regression_sleep_s(recent, job.window, job.slow_s)
        slow = window in job.slow_windows or window - 1 in job.slow_windows
        if router is not None and rank == 0 and step == (MANUAL_WINDOW + 1) * job.window:
            ask_for_capture(timer, router)
        began = time.perf_counter()
        with timer.step():
            with timer.stage(STAGES[0]):
                time.sleep(job.step_s)
            with timer.stage(STAGES[1]):
                time.sleep(job.step_s + (slow_s if slow else 0.0))
            with timer.stage(STAGES[2]):
                dist.all_reduce(grad)
            for stage in STAGES[3:]:
                with timer.stage(stage):
                    grad.mul_(1.0)
        recent.append(time.perf_counter() - began)
    timer.close()
    leave_process_group()


def regression_sleep_s(steps: Sequence[float], window: int, least_s: float) -> float:
    """The injected regression's sleep per step: twice the live regression check's threshold
    (``analysis.regression``: the larger of ``min_increase`` of the baseline's median step and
    ``noise_factor`` standard errors of a window's median against the baseline's) for a
    baseline of ``steps`` (this rank's steps before the slow window, as long as the check's
    baseline) and windows of ``window`` steps, ``least_s`` at least. Twice: each slow window
    then clears it on its own. A fixed 40 ms went unflagged beside CPU burners, whose
    windows' steps had become the baseline: a 40 ms shift was inside the noise of their
    steps."""
    if len(steps) < 2:
        return least_s
    x = np.asarray(steps)
    median = float(np.median(x))
    sigma = MAD_TO_SIGMA * float(np.median(np.abs(x - median)))
    error = MEDIAN_SE * sigma * math.sqrt(1.0 / window + 1.0 / x.size)
    cfg = DEFAULT_REGRESSION
    return max(least_s, 2.0 * max(cfg.min_increase * median, cfg.noise_factor * error))


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
    """Run the job's ranks to the end, and with ``router`` the process that draws its incident
    pages after it (it writes into the folder, which the next launch and the tests measure);
    fail on a rank error."""
    from stagefrontier.demo.launch import run_ranks

    codes = run_ranks(run_rank, job.ranks, job, deadline_s=300.0, start_method=START_METHOD)
    assert all(code == 0 for code in codes.values()), f"rank exit codes {codes}"
    if job.router:
        pages = drawn_pages(Path(job.out_dir))
        assert pages and all(FIGURES_LATER not in page for page in pages.values()), "not drawn"
