"""The timer's configuration is one tree of frozen dataclasses (``TimerConfig``), and the flat
keywords of earlier releases build the same tree with a DeprecationWarning naming the new field.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest

from stagefrontier import (
    CollectConfig,
    Gates,
    ProfilerRouter,
    SamplingConfig,
    StageFrontierError,
    StageTimer,
    TimerConfig,
    TimerSettingError,
)
from stagefrontier.integrations import make_timer
from stagefrontier.record.config import DEPRECATED, config_from_keywords
from stagefrontier.sinks import CsvSink

STAGES = ("data.next_wait", "model.fwd_loss_cpu_wall")


def _config(tmp_path: Path, **fields: object) -> TimerConfig:
    collection = CollectConfig(mode="local", out_dir=tmp_path, log=False)
    settings: dict[str, Any] = {"stages": STAGES, "window": 3, "collection": collection}
    return TimerConfig(**{**settings, **fields})


def test_a_timer_built_from_its_config_warns_of_nothing_and_records(tmp_path: Path) -> None:
    config = _config(tmp_path, sampling=SamplingConfig(cuda_event_fraction=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        timer = StageTimer(config=config)
    assert timer.config is config and timer.collect_config is config.collection
    assert timer.stages == STAGES and timer.window == 3
    for _ in range(3):
        with timer.step():
            with timer.stage(STAGES[0]):
                pass
            with timer.stage(STAGES[1]):
                pass
    timer.close()
    assert (tmp_path / "windows.jsonl").read_text().count("\n") == 1


def test_every_part_of_the_tree_is_frozen(tmp_path: Path) -> None:
    config = _config(tmp_path, router=ProfilerRouter(steps=2))
    for part, name in (
        (config, "window"),
        (config.sampling, "cuda_event_fraction"),
        (config.collection, "out_dir"),
        (config.router, "steps"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, name, 1)
    longer = dataclasses.replace(config, window=7)
    assert longer.window == 7 and config.window == 3 and longer.collection is config.collection


def test_the_flat_keywords_build_the_same_tree_and_name_the_new_fields(tmp_path: Path) -> None:
    gates = Gates(share_dominance=0.5)
    keywords = {
        "window": 3,
        "collect": "local",
        "out_dir": tmp_path,
        "collect_timeout_s": 5.0,
        "gates": gates,
        "log": False,
        "cuda_event_fraction": 0.25,
        "strict": True,
    }
    with pytest.warns(DeprecationWarning) as caught:
        timer = StageTimer(list(STAGES), **keywords)  # type: ignore[arg-type]
    timer.close()
    assert len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    message = str(caught[0].message)
    for keyword in ("stages", *keywords):
        assert f"{keyword} -> TimerConfig.{DEPRECATED[keyword]}" in message
    collection = CollectConfig(
        mode="local", out_dir=tmp_path, timeout_s=5.0, gates=gates, log=False
    )
    assert timer.config == TimerConfig(
        stages=STAGES,
        window=3,
        collection=collection,
        sampling=SamplingConfig(cuda_event_fraction=0.25),
        strict=True,
    )
    assert config_from_keywords({"stages": None}).stages == TimerConfig().stages


def test_settings_given_both_ways_or_unknown_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StageFrontierError, match=r"not also as StageTimer keywords \(window\)"):
        StageTimer(config=_config(tmp_path), window=5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'windows'"):
        StageTimer(windows=5)
    with pytest.raises(TimerSettingError, match="config must be a TimerConfig"):
        StageTimer(config={"window": 5})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"window": 0}, r"window must be in \[1, 1000000\]"),
        ({"sampling": SamplingConfig}, "sampling must be a SamplingConfig"),
        ({"collection": "local"}, "collection must be a CollectConfig"),
        ({"router": "on"}, "router must be a ProfilerRouter"),
        ({"annotate": 1}, "annotate must be True or False"),
    ],
)
def test_a_bad_field_is_refused_by_name(
    tmp_path: Path, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(TimerSettingError, match=message):
        _config(tmp_path, **fields)


def test_the_callbacks_timer_builds_its_config_without_a_warning(tmp_path: Path) -> None:
    """``make_timer`` (what the framework callbacks call) takes the flat settings or a config,
    adds its sinks after the config's own and its router, and warns of nothing."""
    own, added = CsvSink(tmp_path / "own.csv"), CsvSink(tmp_path / "added.csv")
    router = ProfilerRouter(steps=2)
    base = dataclasses.replace(
        _config(tmp_path), collection=CollectConfig(mode="local", out_dir=tmp_path, sinks=(own,))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = make_timer(STAGES, sinks=[added], window=3, collect="local", out_dir=tmp_path)
        flat.close()
        grouped = make_timer(STAGES, sinks=[added], router=router, config=base)
        grouped.close()
    assert flat.config.collection.sinks == (added,) and flat.config.window == 3
    assert grouped.config.collection.sinks == (own, added)
    assert grouped.config.router is router and grouped.config.stages == STAGES
    with pytest.raises(StageFrontierError, match="not both"):
        make_timer(STAGES, config=base, window=3)
