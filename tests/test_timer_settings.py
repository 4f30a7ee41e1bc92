"""The timer's collection settings: ``CollectConfig`` and the flat keywords build the same thing,
custom gates reach the live analysis, and the collect timeout reaches the store connection."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

import stagefrontier as sf
from recorder_support import (
    BWD,
    CALLBACKS,
    DATA,
    FWD,
    OPTIM,
    CaptureCollector,
    StepClock,
    read_records,
)
from stagefrontier import CollectConfig, Gates, StageTimer, TimerConfig
from stagefrontier.record import contexts

deprecated_path = pytest.mark.filterwarnings("ignore:StageTimer's keywords are deprecated")
"""For the tests that build timers through StageTimer's flat keywords on purpose (the deprecated
path, which must keep working for a release; tests/test_timer_config.py checks its warning)."""


@deprecated_path
def test_collect_config_and_flat_keywords_build_the_same_config(tmp_path: Path) -> None:
    gates = Gates(share_dominance=0.3)
    flat = StageTimer(
        collect="local",
        out_dir=tmp_path,
        collect_timeout_s=3.0,
        queue_size=2,
        gates=gates,
        log=False,
    )
    config = CollectConfig(
        mode="local", out_dir=tmp_path, timeout_s=3.0, queue_size=2, gates=gates, log=False
    )
    flat.close()  # two open timers of one process may not write one out_dir
    grouped = StageTimer(collect=config)
    assert flat.collect_config == grouped.collect_config == config
    assert grouped.out_dir == str(tmp_path)
    grouped.close()
    assert StageTimer(enabled=False).collect_config == CollectConfig()


@deprecated_path
def test_a_setting_given_twice_or_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(sf.StageFrontierError, match="collect_timeout_s, queue_size in the"):
        StageTimer(collect=CollectConfig(), collect_timeout_s=3.0, queue_size=2)
    with pytest.raises(sf.StageFrontierError, match="unknown collect mode 'nccl'"):
        StageTimer(collect="nccl")
    with pytest.raises(sf.StageFrontierError, match="timeout"):
        CollectConfig(timeout_s=0)
    with pytest.raises(sf.StageFrontierError, match="queue_size"):
        StageTimer(queue_size=0)
    with pytest.raises(sf.StageFrontierError, match="Gates"):
        CollectConfig(gates={"share_dominance": 0.3})  # type: ignore[arg-type]
    with pytest.raises(sf.StageFrontierError, match="sinks and gates to the collector"):
        StageTimer(gates=Gates(), collector=CaptureCollector())


STAGE_MS = ((DATA, 35), (FWD, 25), (BWD, 20), (CALLBACKS, 20), (OPTIM, 0))
"""A steady step: the data stage holds 35% of it, above 0.3 and below the default 0.4."""


def test_custom_gates_change_the_live_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = StepClock()
    monkeypatch.setattr(contexts, "_now", clock)

    def run(name: str, gates: Gates | None = None) -> list[dict[str, object]]:
        collection = CollectConfig(mode="local", out_dir=tmp_path / name, gates=gates)
        timer = StageTimer(config=TimerConfig(window=5, collection=collection))
        for _ in range(10):
            with timer.step():
                for stage, ms in STAGE_MS:
                    with timer.stage(stage):
                        clock.ns += ms * 1_000_000
        timer.close()
        return read_records(tmp_path / name)

    default = run("default")
    custom = run("custom", gates=Gates(share_dominance=0.3))
    assert len(default) == len(custom) == 2
    for plain, gated in zip(default, custom, strict=True):
        assert plain["shares"] == gated["shares"]
        assert gated["shares"][DATA] == pytest.approx(0.35)  # type: ignore[index]
        assert plain["gates"]["share_dominance"] == 0.4  # type: ignore[index]
        assert gated["gates"]["share_dominance"] == 0.3  # type: ignore[index]
        # 35% is not dominant under the default gates: no verdict on the data stage ...
        assert "co_critical" not in plain["labels"]  # type: ignore[operator]
        assert any("share_dominance=0.4" in r for r in plain["reasons"]["direct_exposure"])  # type: ignore[index]
        # ... and is under share_dominance=0.3, with no direct gain: co-critical.
        assert "co_critical" in gated["labels"]  # type: ignore[operator]
        assert any(DATA in r for r in gated["reasons"]["co_critical"])  # type: ignore[index]


def test_collect_timeout_is_the_store_connections_timeout(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    from stagefrontier.collect import CollectorSettings, StoreCollector
    from stagefrontier.demo.launch import loopback_store

    server = loopback_store(1)
    collector = StoreCollector(CollectorSettings(1, 2, tmp_path, 1.5), store=server)
    try:
        connection = collector._connection()
        assert connection.underlying_store.timeout == timedelta(seconds=1.5)
        assert server.timeout == timedelta(seconds=60)  # the job's store is left as it was
    finally:
        collector.close()
