"""Shared helpers for the recorder tests: a step's stages run in turn, a capturing collector and
readers for its outputs."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

import trace_support
from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.window.rank import PendingWindow, RankWindow

DATA, FWD, BWD, CALLBACKS, OPTIM, OTHER = trace_support.STAGES
TIMED = trace_support.TIMED


def run_stages(timer: StageTimer, seconds: Mapping[str, float]) -> None:
    """Enter each stage of ``seconds`` in turn, sleeping its time inside it (none for 0)."""
    for stage, sleep_s in seconds.items():
        with timer.stage(stage):
            if sleep_s:
                time.sleep(sleep_s)


def on_disk_and_captured(
    out_dir: Path, steps: int, step: Callable[[StageTimer], None]
) -> CaptureCollector:
    """Run ``step`` ``steps`` times on a timer that writes its window to ``out_dir``, then on one
    whose window is captured in memory (windows of ``steps``); returns the capturing collector."""
    collector = CaptureCollector()
    for timer in (
        StageTimer(config=TimerConfig(window=steps, collection=CollectConfig(out_dir=out_dir))),
        StageTimer(config=TimerConfig(window=steps), collector=collector),
    ):
        for _ in range(steps):
            step(timer)
        timer.close()
    return collector


def pause_as_listed(timer: StageTimer, step: int, paused: Collection[int]) -> None:
    """Before ``step``: pause the timer if the step is listed in ``paused``, else resume it."""
    if step in paused:
        timer.pause()
    else:
        timer.resume()


class CaptureCollector:
    """Keeps every submitted window in memory (R = 1), so tests can read raw nanoseconds."""

    rank = 0
    world_size = 1

    def __init__(self) -> None:
        self.windows: list[RankWindow] = []
        self.closed = 0

    def submit(self, window: PendingWindow) -> bool:
        self.windows.append(window.build())
        return True

    def close(self) -> None:
        self.closed += 1


def read_records(out_dir: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``out_dir/windows.jsonl``, one per window."""
    path = out_dir / "windows.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


RECORDS_WAIT_S = 300.0


def wait_for_records(out_dir: Path, count: int) -> None:
    """Wait until ``out_dir/windows.jsonl`` holds ``count`` whole records. The timer's analysis
    thread writes them; ``close`` waits for that thread a bounded time only (the local
    collector's 10 s ran out at a load average of 30) and leaves the rest to it, so a test that
    reads every window of a closed timer waits here for them."""
    path = out_dir / "windows.jsonl"
    deadline = time.monotonic() + RECORDS_WAIT_S
    while count and not (path.exists() and path.read_text(encoding="utf-8").count("\n") >= count):
        assert time.monotonic() < deadline, f"fewer than {count} records in {path}"
        time.sleep(0.05)


def column(window: RankWindow, stage: str) -> np.ndarray:
    """One stage's per-step durations in seconds."""
    return window.durations_ns[:, window.stages.index(stage)] * 1e-9


def wall(window: RankWindow) -> np.ndarray:
    return window.wall_ns * 1e-9


class StepClock:
    """Stands in for ``perf_counter_ns`` in the timer's contexts, so every step lasts exactly
    what the test advances it by."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def advance_s(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)
