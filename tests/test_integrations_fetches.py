"""HookClock.time_fetches: the data wait is the DataLoader's own fetches, not the whole time
between two steps (what the Hugging Face callback needs: the Trainer's token count gather after
the fetches waits for the slowest rank). One process, a real DataLoader, no collective."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.collect import LocalCollector
from stagefrontier.integrations._timer import HookClock
from stagefrontier.sinks import JsonlSink

torch_data = pytest.importorskip("torch.utils.data")

FETCH_S = 0.02
BETWEEN_S = 0.03
STEPS = 3


class _SlowSamples(torch_data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        time.sleep(FETCH_S)
        return i


def _timer(tmp_path: Path) -> StageTimer:
    return StageTimer(
        config=TimerConfig(window=STEPS, collection=CollectConfig(out_dir=tmp_path), strict=True),
        collector=LocalCollector(out_dir=tmp_path, sinks=[JsonlSink(tmp_path)]),
    )


def _data_stage_s(tmp_path: Path, loader: Any, time_fetches: bool) -> tuple[float, int, bool]:
    """Three steps whose wait is a fetch then a sleep: the window's data stage (seconds), the
    nanoseconds the test measured around its fetches, and whether the fetches were timed."""
    timer = _timer(tmp_path)
    clock = HookClock(timer)
    fetched_ns = 0
    with timer:
        timed = clock.time_fetches(loader) if time_fetches else False
        batches = iter(loader)
        clock.mark()
        for _ in range(STEPS):
            start = time.perf_counter_ns()
            next(batches)
            fetched_ns += time.perf_counter_ns() - start
            time.sleep(BETWEEN_S)  # a collective after the fetch, say
            clock.begin_step("model.fwd_loss_cpu_wall")
            clock.end_step()
    (line,) = (tmp_path / "windows.jsonl").read_text().splitlines()
    return float(json.loads(line)["advances"]["data.next_wait"]), fetched_ns, timed


def test_only_the_loaders_fetches_are_the_data_wait(tmp_path: Path) -> None:
    loader = torch_data.DataLoader(_SlowSamples(), batch_size=1)
    data_s, fetched_ns, timed = _data_stage_s(tmp_path, loader, time_fetches=True)
    assert timed
    assert data_s >= STEPS * FETCH_S  # every fetch sleeps that long
    # the fetches are timed inside the test's own measurement of them: the sleeps after them
    # are not in the data stage (1 us a step for the record's rounding)
    assert data_s <= fetched_ns / 1e9 + STEPS * 1e-6


def test_without_a_torch_dataloader_the_whole_gap_is_the_data_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stagefrontier")
    batches = [0] * STEPS  # any iterable: nothing to time inside, nothing changed
    data_s, _, timed = _data_stage_s(tmp_path, batches, time_fetches=True)
    assert not timed
    assert data_s >= STEPS * BETWEEN_S  # the sleeps after each "fetch" are charged
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class _SealedLoader:
    """Looks like a DataLoader but its iterator factory cannot be replaced."""

    num_workers = 0

    @property
    def _get_iterator(self) -> Any:
        return lambda: iter([0] * STEPS)

    def __iter__(self) -> Any:
        return self._get_iterator()


def test_a_loader_that_cannot_be_timed_is_one_line_and_the_gap_is_charged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stagefrontier")
    data_s, _, timed = _data_stage_s(tmp_path, _SealedLoader(), time_fetches=True)
    assert not timed
    assert data_s >= STEPS * BETWEEN_S
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("stagefrontier: timing the training DataLoader's fetches failed")
    assert "\n" not in warning
