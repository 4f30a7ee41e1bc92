"""A slowdown of the whole job is named as such in the window line and never captured; and a
capture whose suspect is its own reference cannot be requested.

Two slowdowns of a healthy 4-rank Gloo DDP run. Sleeps: from step 60 on, each rank sleeps in
each of four stages of every step (data, forward, backward and the callbacks), as when every
part of the job waits on the same slower resource; the four sleeps add up to the suite's fault
size (``demo_fault_ms``: four times the median step this session measured, scaled to 4 ranks,
120 ms at least), so the slowdown stays large against the step however busy the machine is (a
fixed 30 ms a stage went unflagged at a load average of 85). A neighbour: CPU-burning
processes started beside the job from step 50 to step 100, as many as the job's ranks and
everything else already runnable, so that the job's share of the CPUs halves however busy the
machine was (a fixed number of burners slows a loaded machine's job less than an idle one's).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from conftest import demo_fault_ms
from rank_support import START_METHOD
from stagefrontier.demo import DemoConfig, launch, parse_fault
from stagefrontier.demo.train import STEP_MARKER
from stagefrontier.render.regression_text import regression_text
from stagefrontier.route import list_incidents

pytestmark = pytest.mark.machine_to_itself  # jobs side by side or beside its own burners

STEPS = 120
WINDOW = 20
SPREAD_STAGES = ("data", "forward", "backward", "callback_host")
RANKS = 4


def spread(untimed: Any) -> tuple[Any, ...]:
    """Every rank slower in each of ``SPREAD_STAGES`` from step 60 (three healthy windows make
    the baseline), the sleeps of a step adding up to ``demo_fault_ms`` (30 ms a stage at least)."""
    stage_ms = math.ceil(demo_fault_ms(untimed, RANKS) / len(SPREAD_STAGES))
    return tuple(parse_fault(f"{kind}@all:{stage_ms}ms,from=60") for kind in SPREAD_STAGES)


STRAGGLER_WINDOW = 10
STRAGGLER = tuple(
    parse_fault(f"{kind}@2:300ms,from={3 * STRAGGLER_WINDOW}") for kind in SPREAD_STAGES
)
"""Rank 2 alone slower in each of its stages, as ``spread`` slows every rank: 1.2 s a step,
far above what a busy machine's own swings move the other ranks' stages (and than the spread
of a window's median over ten steps), after three healthy windows."""
STRAGGLER_STEPS = 5 * STRAGGLER_WINDOW
"""The straggler's run ends after two slowed windows (each adds 12 s of sleeps). One was not
enough on a busy machine: while the baseline holds fewer than ``min_baseline`` windows, a
window faster than it reads as the end of a warm-up and starts it again, and a loaded machine's
windows can each run faster than the one before (seen: 1.8, 0.98 s), so the baseline may still
hold one window when the slowdown starts; against it the first slowed window is only marked
above the threshold, and the second, two in a row at more than twice it, is flagged whatever
the baseline went through."""


def run_demo(
    out: Path,
    faults: tuple[Any, ...] = (),
    router: bool = True,
    steps: int = STEPS,
    window: int = WINDOW,
) -> list[dict[str, Any]]:
    """A 4-rank Gloo DDP demo run of ``steps`` steps in windows of ``window`` into ``out``; its
    window records. Its ranks fork from the session's server (``rank_support.START_METHOD``: no
    rank imports torch), with the router on or off."""
    run = launch(
        DemoConfig(
            ranks=RANKS,
            steps=steps,
            window=window,
            faults=faults,
            out_dir=str(out),
            collect_timeout_s=10.0,
            quiet=True,
            router=router,
        ),
        deadline_s=500.0,
        start_method=START_METHOD,
    )
    records = [json.loads(line) for line in (out / "windows.jsonl").read_text().splitlines()]
    assert len(records) == steps // window == len(run.windows)
    return records


def test_a_slowdown_of_every_stage_and_rank_is_the_whole_jobs_and_opens_no_incident(
    tmp_path: Path, untimed_demo: Any
) -> None:
    out = tmp_path / "spread"
    records = run_demo(out, spread(untimed_demo))
    flagged = [r["regression"] for r in records if r.get("regression")]
    assert flagged, "the slowed windows were not flagged"
    assert [f["kind"] for f in flagged] == ["whole_job"] * len(flagged), flagged
    line = regression_text(flagged[0])
    assert "the whole job slowed" in line and "the cause is outside the training code" in line
    assert "host" in flagged[0] and "load_average" in flagged[0]["host"]["now"]
    assert list_incidents(out) == [], [i["reasons"] for i in list_incidents(out)]


BURN_FROM, BURN_TO = 50, 100
"""Rank 0's steps between which CPU-burning processes run beside the job: windows 3 and 4 (steps
60 to 99) are wholly inside, windows 0 and 1 make the baseline."""
MAX_BURNERS = 32


def burners_to_halve_the_jobs_cpu(ranks: int) -> int:
    """As many busy processes as the job's ranks and everything else already runnable: each
    rank's share of the CPUs then halves however busy the machine was (the load average counts
    the runnable processes, the job's own among them)."""
    load = os.getloadavg()[0]
    return min(MAX_BURNERS, max(ranks, math.ceil(load) + ranks))


@contextmanager
def neighbour(markers: Path, ranks: int) -> Iterator[list[int]]:
    """CPU burners started at rank 0's step ``BURN_FROM`` marker and killed at ``BURN_TO`` (or
    when the run ends); yields the list the started burners' count is appended to."""
    done = threading.Event()
    started: list[int] = []
    procs: list[subprocess.Popen[bytes]] = []

    def reached(step: int) -> bool:
        marker = markers / STEP_MARKER.format(step=step)
        while not done.wait(0.05):
            if marker.exists():
                return True
        return False

    def burn() -> None:
        if not reached(BURN_FROM):
            return
        count = burners_to_halve_the_jobs_cpu(ranks)
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        started.append(count)
        reached(BURN_TO)
        for proc in procs:
            proc.kill()

    thread = threading.Thread(target=burn, daemon=True)
    thread.start()
    try:
        yield started
    finally:
        done.set()
        thread.join()
        for proc in procs:
            proc.kill()
            proc.wait()


def test_cpu_burning_neighbours_slow_the_whole_job_and_open_no_incident(tmp_path: Path) -> None:
    """A real neighbour: busy processes start beside a 4-rank Gloo DDP job part way through and
    stop before its end, as many as halve the job's share of the CPUs whatever the machine's
    load. Every rank and every CPU stage slows: the windows that flag it say the whole job
    slowed, none names a stage or a rank, and the router opens no incident."""
    out = tmp_path / "neighbour"
    with neighbour(out / ".markers", RANKS) as started:
        records = run_demo(out)
    assert started, "the run ended before the neighbour's first step"
    flagged = [r["regression"] for r in records if r.get("regression")]
    assert [f["kind"] for f in flagged if f["kind"] != "whole_job"] == [], flagged
    lines = [regression_text(f) for f in flagged]
    assert any("the whole job slowed" in line for line in lines), (started, flagged)
    # the neighbour halves the job's share of the CPUs: rank 0's process gets less CPU per
    # second of its windows than in the healthy ones, and the line says so
    said = [line for line in lines if "rank 0's process got" in line]
    assert said and all("the whole job slowed" in line for line in said), lines
    assert list_incidents(out) == [], [i["reasons"] for i in list_incidents(out)]


def test_one_rank_slower_in_all_its_stages_is_not_the_whole_jobs(tmp_path: Path) -> None:
    """Rank 2 alone sleeps 300 ms in each of four stages from its fourth window on: the
    frontier grows in every stage, which read as "the whole job slowed evenly over its stages
    (most on rank 2)", with no capture. The other ranks grew only in backward, where they wait
    for rank 2's gradients: a stage regression on rank 2."""
    out = tmp_path / "straggler"
    records = run_demo(out, STRAGGLER, False, STRAGGLER_STEPS, STRAGGLER_WINDOW)
    flagged = [r["regression"] for r in records if r.get("regression")]
    on_rank_2 = [f for f in flagged if f["kind"] == "stage" and f["ranks"] == [2]]
    assert on_rank_2, flagged
    assert "whole job" not in regression_text(on_rank_2[0])


def test_a_capture_whose_suspect_is_its_own_reference_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0's coordinator, on a real c10d store: a decision naming rank 1 as both suspect
    and reference writes no request and opens no incident; it says why in one line."""
    from torch.distributed import TCPStore

    from stagefrontier import ProfilerRouter
    from stagefrontier.route.coordinator import Coordinator
    from stagefrontier.route.decide import Decision
    from stagefrontier.route.policy import Plan
    from stagefrontier.route.requests import REQUEST_KEY, RequestChannel

    store = TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10))
    channel = RequestChannel(store, prefix="refusal/")
    coordinator = Coordinator(
        ProfilerRouter(), out_dir=str(tmp_path), channel=channel, current_step=lambda: 40
    )
    decision = Decision("data.next_wait", 1, 1, 0.5, 4, ("every rank grew alike",))
    with caplog.at_level(logging.INFO, logger="stagefrontier"):
        coordinator._open(Plan(decision, "regression", [1]))
    assert coordinator.open is None and coordinator.captures == 0
    assert channel.read(REQUEST_KEY) is None
    assert not (tmp_path / "incidents").exists()
    said = [r.getMessage() for r in caplog.records]
    assert any("would be its own reference" in m for m in said), said
