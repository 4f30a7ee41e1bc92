"""A pause that lands as a capture's first step begins (issue 37, item 2): the profiler already
runs its lead-in steps, the pause stops it before any step of the request was traced.

Before: the rank answered "captured" up to the step before the first, the incident read "steps
30-29", and writing it failed ("'steps' must be [first, last]", with a traceback): the folder
kept the traces but no ``incident.json``, ``.md`` or ``.html``. Now the incident is written,
not captured, saying why. A real capture on a real store.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")

from trace_support import manual_incident


def test_a_pause_at_the_captures_first_step_still_writes_the_incident(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import torch.distributed as dist

    from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig
    from stagefrontier.formats.incident import read_incident

    caplog.set_level(logging.WARNING, logger="stagefrontier")
    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    router = ProfilerRouter(steps=3, store=store)
    timer = StageTimer(
        config=TimerConfig(
            stages=["data.next_wait"],
            window=5,
            collection=CollectConfig("local", out_dir=tmp_path, regression=None, log=False),
            router=router,
        )
    )

    def step() -> None:
        with timer.step(), timer.stage("data.next_wait"):
            time.sleep(0.002)

    for _ in range(5):  # one window: the step time is known
        step()
    router.request_capture([0])
    capture = timer._router.capture  # type: ignore[union-attr]
    paused_at = None
    for _ in range(2000):
        request = capture._request
        lead_in = request is not None and capture._prof is not None  # the profiler runs
        if lead_in and timer._step_index == request.first_step:
            paused_at = request.first_step
            timer.pause()
            step()
            timer.resume()
            break
        step()
    assert paused_at is not None, "the capture never started"
    for _ in range(10):
        step()
    timer.close()
    incident = read_incident(manual_incident(tmp_path))
    assert not incident["captured"]
    assert f"rank 0 captured no step: its capture ended before step {paused_at} did" in " ".join(
        incident["reasons"]
    )
    assert "must be [first, last]" not in caplog.text
    assert not [r for r in caplog.records if r.exc_info]
