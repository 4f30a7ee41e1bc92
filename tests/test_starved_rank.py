"""A rank starved of CPU is not a late rank (``record.run_queue``, ``analysis.collectives``).

One real 4-rank Gloo DDP job, its ranks forked from the session's server
(``starved_rank_job.py``): rank 2 pinned to one core on which the test keeps CPU burners
running, the other ranks on the other cores. Rank 2
runs the same code as the others and reaches backward's all-reduce late every step because it
waits for a CPU; the windows must not name it late (nor route it), and must say why it was
behind. The rule's other half, a rank late by its own code (a sleep, a compute delay), stays
named: ``test_collectives.py`` and ``test_backward_incident.py`` run those.

Cost on the 2-core machine, this module alone (the burners' CPU and the fork server's start
included; in the whole suite the server is shared): 57 s of wall and 28 s of CPU, children
included, at load 29-26, where the same job under torchrun took 112 s and 65 s just before
(load 18-29): the ranks no longer import torch each, rank 2 at its starved share of a core.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

from rank_support import START_METHOD
from recorder_support import DATA, FWD, CaptureCollector, read_records
from stagefrontier import StageTimer, TimerConfig
from stagefrontier.analysis.collectives import CollectiveTimes, read_collectives
from stagefrontier.analysis.window_report import WindowReport
from stagefrontier.record import run_queue
from stagefrontier.record.run_queue import RunQueueClock
from stagefrontier.render.verdict import verdict
from starved_rank_job import RANKS, STARVED_RANK, run_rank

pytestmark = pytest.mark.machine_to_itself  # jobs side by side or beside its own burners

BURNERS = 3
DEADLINE_S = 300
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


@pytest.fixture(scope="module")
def starved() -> Iterator[int]:
    """The core rank 2 is pinned to, kept busy by ``BURNERS`` spinning processes of the test's
    own, pinned there too, for as long as the module's tests run (each in a session of its own:
    where the kernel schedules sessions as groups, each burner then weighs as one)."""
    if len(CORES) < 2 or not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("needs Linux's scheduler statistics and two cores to starve one rank")
    core = CORES[-1]
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True:\n    pass\n"
    burners = [
        subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
        for _ in range(BURNERS)
    ]
    try:
        yield core
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.fixture(scope="module")
def records(starved: int, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from stagefrontier.demo.launch import run_ranks

    out = tmp_path_factory.mktemp("starved")
    job = (str(out), starved)
    codes = run_ranks(run_rank, RANKS, job, deadline_s=DEADLINE_S, start_method=START_METHOD)
    assert all(code == 0 for code in codes.values()), f"rank exit codes {codes}"
    return read_records(out)


def test_a_rank_starved_of_cpu_is_not_named_late_and_the_window_says_why(
    records: list[dict[str, Any]],
) -> None:
    assert [r["window"] for r in records] == [0, 1, 2]
    for record in records:
        comm = record["communication"]
        assert comm["late_rank"] is None, (record["window"], comm["late"])
        assert not any("run-queue wait not read" in u for u in comm["untimed"])
    said = [r for r in records if r["communication"]["starved"] is not None]
    assert len(said) >= 2, [r["communication"]["collectives"] for r in records]
    for record in said:
        starved = record["communication"]["starved"]
        assert starved["starved_rank"] == STARVED_RANK
        assert starved["cpu_wait_ms"] > 0
        names = set(WindowReport.__dataclass_fields__)
        report = WindowReport.from_dict({k: v for k, v in record.items() if k in names} | {
            "format": "stagefrontier.window_report", "version": 3
        })  # fmt: skip
        line = verdict(report, record)
        assert f"Rank {STARVED_RANK} reaches backward's" in line
        assert "longer for a CPU than they did: the machine held it back" in line
        assert f"on rank {STARVED_RANK}" not in line  # nothing to profile there


def _times(run_queue_ms: tuple[float | None, ...]) -> CollectiveTimes:
    """Ten steps of one bucket at 4 ranks, rank 2 arriving 90 ms after the others."""
    wait = np.tile([100.0, 101.0, 10.0, 99.0], (10, 1))[:, :, None]
    return CollectiveTimes(
        keys=(("all_reduce", 0, "model.backward_cpu_wall", 0),),
        nbytes=(1 << 20,),
        wait_ms=wait,
        reached_ms=np.full_like(wait, 50.0),
        run_queue_ms=run_queue_ms,
    )


def test_the_lateness_a_cpu_wait_explains_is_discounted_and_what_is_left_stays_named() -> None:
    ranks, step_ms = [0, 1, 2, 3], 200.0
    plain = read_collectives(_times(()), ranks, step_ms)
    assert plain.late is not None and plain.late.late_rank == 2  # no run-queue figures: as before
    starved = read_collectives(_times((5.0, 6.0, 90.0, 4.0)), ranks, step_ms)
    assert starved.late is None and starved.starved is not None
    assert starved.starved.starved_rank == 2 and starved.starved.cpu_wait_ms == 85.0
    slept = read_collectives(_times((5.0, 6.0, 40.0, 4.0)), ranks, step_ms)  # 50 ms its own
    assert slept.late is not None and slept.late.late_rank == 2 and slept.starved is None
    unknown = read_collectives(_times((5.0, None, 90.0, 4.0)), ranks, step_ms)
    assert unknown.late is not None and unknown.late.late_rank == 2


def test_a_small_cpu_wait_leaves_a_late_rank_in_a_noisy_window_named() -> None:
    """Rank 2 107 ms late, the others scattered so that 107 ms just clears the noise bar: 22
    ms more of a CPU wait leaves 85 ms of its own, material, so it stays named (the noise bar
    reads its whole arrival) and is not said to be starved (a routing row at 8 ranks, where the
    fault rank's window went unnamed and was called starved)."""
    wait = np.tile([162.0, 200.0, 93.0, 238.0], (10, 1))[:, :, None]
    times = CollectiveTimes(
        keys=(("all_reduce", 0, "model.backward_cpu_wall", 0),),
        nbytes=(1 << 20,),
        wait_ms=wait,
        reached_ms=np.full_like(wait, 50.0),
        run_queue_ms=(30.0, 31.0, 52.0, 29.0),
    )
    reading = read_collectives(times, [0, 1, 2, 3], 200.0)
    assert reading.late is not None and reading.late.late_rank == 2
    assert reading.late.lateness_ms == 107.0 and reading.starved is None


def test_an_unreadable_run_queue_is_said_once_and_reads_as_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(run_queue, "SCHEDSTAT", str(tmp_path / "absent-{tid}"))
    clock = RunQueueClock()
    clock.start()
    assert clock.take() is None and clock.take() is None
    assert clock.reason is not None and "FileNotFoundError" in clock.reason
    assert clock.reason.startswith("run-queue wait not read")


def test_the_run_queue_wait_counts_from_start_to_take_on_the_same_thread() -> None:
    if not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("Linux's scheduler statistics are not here")
    clock = RunQueueClock()
    assert clock.take() is None  # nothing counted yet
    clock.start()
    waited = clock.take()
    assert waited is not None and waited >= 0 and clock.reason is None
    assert clock.take() is None  # take stops the count


UNCOUNTED_NS = 10**15
"""A CPU wait fed into the real reading (about 11 days) where no window's step runs: no real
wait over a few empty steps comes near it, so a window that shows it counted set-up or a pause."""
STEP_NS = 3_000_000


def test_a_window_counts_the_cpu_wait_of_its_recorded_steps_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real schedstat of the test's thread plus a wait the test feeds in: a huge one in the
    set-up after the log exists (as after ``watch_ddp``) and during a paused stretch, 3 ms in
    each recorded step. Each window shows its recorded steps' 3 ms each and none of the huge
    ones: the count starts at a window's first step and again after a pause."""
    if not Path("/proc/thread-self/schedstat").exists():
        pytest.skip("Linux's scheduler statistics are not here")
    fed = [0]
    real = run_queue._waited_ns
    monkeypatch.setattr(run_queue, "_waited_ns", lambda fd: real(fd) + fed[0])
    collector = CaptureCollector()
    timer = StageTimer(config=TimerConfig(stages=(DATA, FWD), window=4), collector=collector)

    def steps(n: int, fed_ns: int) -> None:
        for _ in range(n):
            with timer.step(), timer.stage(FWD), timer.collective("loss", 8):
                fed[0] += fed_ns

    timer.collective("loss", 8)  # the log exists from here on
    fed[0] += UNCOUNTED_NS  # compile, warm-up
    steps(4, STEP_NS)  # window 0
    steps(1, STEP_NS)  # window 1: one step, two paused, one
    timer.pause()
    steps(2, UNCOUNTED_NS)
    fed[0] += UNCOUNTED_NS
    timer.resume()
    steps(1, STEP_NS)
    timer.close()
    waited = [w.collectives["run_queue_us"] for w in collector.windows]
    assert [w.n_steps for w in collector.windows] == [4, 2]
    for us, recorded in zip(waited, (4, 2), strict=True):
        assert recorded * STEP_NS // 1000 <= us < UNCOUNTED_NS // 1000, waited
