"""Between-step data waits while a rank captures: one rule for the recorder and the reducers.

A wait that ``timer.iter``, ``timer.fetch`` or a callback's hook clock charges to the next step
is, while the router captures, a profiler range ``<stage>@step#<N>`` named for the step that
consumes the batch. The reducers and the op diff charge it to step N whichever step range it
falls in, so a reduced trace agrees with the live matrix. One process, a real profiler.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier.analysis.wait_rule import (
    charge_waits,
    consuming_step,
    parse_wait_range,
    wait_range_name,
)
from stagefrontier.cli import main
from stagefrontier.formats.incident import read_incident
from stagefrontier.reducers import reduce_kineto
from stagefrontier.render.incident import summary_line
from stagefrontier.route.opdiff import stage_op_times
from trace_support import manual_incident, thread_trace

DATA = "data.next_wait"
OPEN_DEADLINE_S = 120.0
"""How long a test waits for the router thread to open a requested incident (it polls every
50 ms; a busy machine may leave the thread unscheduled for seconds)."""
FWD = "model.fwd_loss_cpu_wall"


def test_a_wait_range_names_its_stage_and_the_step_that_consumes_the_batch() -> None:
    assert wait_range_name(DATA, 17) == "data.next_wait@step#17"
    assert parse_wait_range("data.next_wait@step#17") == (DATA, 17)
    for other in ("data.next_wait", "stagefrontier.step#3", "x@step#", "@step#4", "a@step#1x"):
        assert parse_wait_range(other) is None
    assert consuming_step(5, inside_step=False) == 5  # between steps: the next to begin
    assert consuming_step(5, inside_step=True) == 6  # prefetched in step 5: step 6's


def test_charge_waits_moves_wall_time_to_the_consuming_step() -> None:
    starts = np.array([0, 1000, 2000], dtype=np.int64)
    ends = np.array([900, 1900, 2900], dtype=np.int64)
    # step 1's wait between steps 0 and 1; step 2's prefetched inside step 1; step 3's (past
    # the capture) inside step 2.
    waits = [(1, 920, 60), (2, 1800, 90), (3, 2850, 40)]
    charged, wall, unmatched = charge_waits([0, 1, 2], starts, ends, waits)
    assert charged.tolist() == [0, 60, 90]
    assert wall.tolist() == [0, 60 - 90, 90 - 40]
    assert unmatched == 1


def test_the_reducer_and_the_op_diff_charge_a_prefetched_wait_to_the_next_step(
    tmp_path: Path,
) -> None:
    """Steps of 1000 µs; each step prefetches the next step's batch at its end (300 µs, a user
    function sleeping inside a library frame), as the live record charges it."""
    events: list[tuple[str, str, float, float]] = []
    for step in range(4):
        t0 = step * 1000.0
        events += [
            ("user_annotation", f"stagefrontier.step#{step}", t0, 1000),
            ("user_annotation", FWD, t0 + 50, 600),
            ("user_annotation", wait_range_name(DATA, step + 1), t0 + 690, 300),
            ("python_function", "torch/utils/data/dataloader.py(630): __next__", t0 + 695, 290),
            ("python_function", "job.py(12): slow_sample", t0 + 700, 280),
            ("python_function", "<built-in function sleep>", t0 + 705, 270),
        ]
    path = thread_trace(tmp_path / "rank0.pt.trace.json.gz", events)
    reduced = reduce_kineto(path, (DATA, FWD, "step.other_cpu_wall"), step_source="annotation")
    assert reduced.step_ids == (0, 1, 2, 3)
    d = reduced.d * 1e6  # µs
    # Step 0's own batch was fetched before the trace: none. Steps 1-3: 300 µs each.
    assert d[:, 0, 0] == pytest.approx([0, 300, 300, 300])
    assert d[:, 0, 1] == pytest.approx([600] * 4)
    # Wall: 1000 - 300 (the next step's prefetch) + 300 (its own, from the step before).
    assert d[:, 0, 2] == pytest.approx([100, 100, 100, 100])
    times = stage_op_times(path, DATA, steps=[1, 2, 3])
    top = max(times.self_s, key=lambda k: times.self_s[k])
    assert top == "job.py(12): slow_sample › <built-in function sleep>"
    assert times.self_s[top] == pytest.approx(3 * 270e-6)


# --- one process, a real capture ----------------------------------------------------------------


@pytest.fixture
def store() -> Any:
    dist = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    return dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )


def slow_sample() -> None:
    time.sleep(0.03)


class Samples:
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> Any:
        import torch

        slow_sample()
        return torch.ones(8)


def _step(timer: Any, model: Any, batch: Any) -> None:
    with timer.step(), timer.stage(FWD):
        model(batch).sum().backward()


def _loop(timer: Any, path: str, steps: int) -> None:
    import torch
    from torch.utils.data import DataLoader

    from stagefrontier.integrations._timer import HookClock

    model = torch.nn.Linear(8, 8)
    data = Samples()
    if path == "iter":
        for i, batch in enumerate(timer.iter(DataLoader(data, batch_size=2))):
            if i == steps:
                break
            _step(timer, model, batch)
    elif path == "prefetch":  # timer.fetch at the end of the step before
        batch = timer.fetch(data.__getitem__, 0)
        for i in range(steps):
            with timer.step():
                with timer.stage(FWD):
                    model(batch).sum().backward()
                batch = timer.fetch(data.__getitem__, i)
    else:  # a framework's hooks: the wait runs from one step's end to the next one's start
        clock = HookClock(timer)
        clock.mark()
        for _ in range(steps):
            slow_sample()
            clock.begin_step(FWD)
            model(torch.ones(2, 8)).sum().backward()
            clock.end_step()


@pytest.mark.parametrize("path", ["iter", "prefetch", "hooks"])
def test_a_capture_traces_the_between_step_wait_and_the_op_diff_names_it(
    tmp_path: Path, store: Any, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    router = ProfilerRouter(steps=5, store=store, capture_timeout_s=30.0)
    timer = StageTimer(
        config=TimerConfig(
            stages=(DATA, FWD, "step.other_cpu_wall"),
            window=5,
            collection=CollectConfig(mode="local", out_dir=tmp_path),
            router=router,
        )
    )
    _loop(timer, path, 5)  # one window: the step time is measured
    router.request_capture([0], stage=DATA)
    _loop(timer, path, 80)
    timer.close()
    assert timer._next_item is next and "fetch" not in vars(timer)  # put back after the capture
    incident = read_incident(manual_incident(tmp_path))
    assert incident["captured"] and incident["confirmed"] is True, incident["reasons"]
    assert incident["trace_shares"][DATA] == pytest.approx(incident["live_shares"][DATA], abs=0.05)
    top = incident["op_diff"][0]
    assert "slow_sample" in top["name"] and "sleep" in top["name"], incident["op_diff"][:3]
    cost = incident["router_cpu_s"]
    assert set(cost["export"]) == {"0"} and cost["export"]["0"] > 0 and cost["reduction"] > 0
    line = summary_line(incident)
    assert "of CPU off the training threads (trace writers: rank 0 " in line, line
    # `stagefrontier analyze INCIDENT_DIR` reads the traces back as the live incident did: the
    # stages, the wait's among them, from incident.json (inferred from the ranges, the wait,
    # which has no range of its own, was left out and another stage came out on top), and the
    # captured steps alone (the trace also holds the step the profiler started in, whose
    # start-up cost, larger on a busy machine, moved the shares by up to 0.28).
    assert main(["analyze", str(manual_incident(tmp_path)), "--json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    first, last = incident["steps"]
    assert offline["stages"] == list(incident["trace_shares"]) and offline["top1"] == DATA
    assert offline["n_steps"] == last - first + 1
    for stage, share in incident["trace_shares"].items():  # rounded to 6 decimals
        assert offline["shares"][stage] == pytest.approx(share, abs=1e-6), stage


def test_a_capture_scheduled_after_the_last_step_says_training_ended_first(
    tmp_path: Path, store: Any
) -> None:
    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig

    router = ProfilerRouter(steps=3, store=store, capture_timeout_s=30.0)
    timer = StageTimer(
        config=TimerConfig(
            window=5, collection=CollectConfig(mode="local", out_dir=tmp_path), router=router
        )
    )
    _loop(timer, "prefetch", 5)
    router.request_capture([0])
    # Close once the router thread opened the incident (its request written: a capture
    # counted), never before: a closing router serves no new request. Its first step is
    # never reached. (A fixed half-second sleep let a busy machine close first.)
    coordinator = router._attached.runtime.coordinator  # type: ignore[union-attr]
    end = time.monotonic() + OPEN_DEADLINE_S
    while coordinator.captures < 1:
        assert time.monotonic() < end, "the router thread never opened the incident"
        time.sleep(0.01)
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert not incident["captured"]
    first = incident["steps"][0]
    assert f"not captured: training ended before step {first}" in incident["reasons"]
    assert "no named rank wrote a trace" not in " ".join(incident["reasons"])
