"""Rank 0's analysis thread hands every analyzed window to its sinks, then to the consumers
registered with it: the profiler router's coordinator registers as one (it is not a sink of
the collector's list), and a consumer that fails is said in one line while the others go on."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from stagefrontier import CollectConfig, StageTimer, TimerConfig
from stagefrontier.window.merged import AnalyzedWindow


class _Recorder:
    """A sink or a consumer that notes what it was handed, in one shared list."""

    def __init__(self, name: str, seen: list[tuple[str, int]]) -> None:
        self.name = name
        self.seen = seen

    def write(self, window: AnalyzedWindow) -> None:
        self.seen.append((self.name, window.merged.reference.window))

    def take(self, window: AnalyzedWindow) -> None:
        self.seen.append((self.name, window.merged.reference.window))

    def close(self) -> None:
        return None


class _Broken:
    def take(self, window: AnalyzedWindow) -> None:
        raise RuntimeError("consumer broke")


def _train(timer: StageTimer, steps: int) -> None:
    for _ in range(steps):
        with timer.step(), timer.stage("model.fwd_loss_cpu_wall"):
            pass


def test_consumers_take_each_window_after_the_sinks_and_a_failing_one_is_said_once_a_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[tuple[str, int]] = []
    timer = StageTimer(
        config=TimerConfig(
            window=2,
            collection=CollectConfig("local", out_dir=tmp_path, sinks=[_Recorder("sink", seen)]),
        )
    )
    _train(timer, 1)  # the collector is built at the first step
    consumers = timer._collector.consumers
    consumers.register(_Broken())
    consumers.register(_Recorder("consumer", seen))
    with caplog.at_level(logging.WARNING, logger="stagefrontier"):
        _train(timer, 3)
        timer.close()
    assert seen == [("sink", 0), ("consumer", 0), ("sink", 1), ("consumer", 1)]
    said = [r for r in caplog.records if "handing a window to _Broken" in r.getMessage()]
    assert said and all(r.exc_info is None for r in said)
    assert "consumer broke" in said[0].getMessage()


def test_the_router_registers_its_coordinator_as_a_consumer_not_a_sink(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    from stagefrontier import ProfilerRouter

    store = dist.TCPStore(
        "127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    timer = StageTimer(
        config=TimerConfig(
            window=2,
            collection=CollectConfig("local", out_dir=tmp_path),
            router=ProfilerRouter(store=store),
        )
    )
    try:
        _train(timer, 4)
        runtime: Any = timer._router
        coordinator = runtime.coordinator
        collector = timer._collector
        assert coordinator is not None
        assert coordinator in collector.consumers._registered
        assert not any(sink is coordinator for sink in collector.sinks)
    finally:
        timer.close()
