"""Every StageTimer argument of the wrong type or out of range fails at construction with a
TimerSettingError naming it: never later as a numpy error, a MemoryError or an overflow."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stagefrontier import CollectConfig, StageTimer, TimerConfig, TimerSettingError


# This test builds timers through StageTimer's flat keywords on purpose (the deprecated path,
# which must keep working for a release; tests/test_timer_config.py checks its warning).
@pytest.mark.filterwarnings("ignore:StageTimer's keywords are deprecated")
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"window": 1.5}, "window must be an integer"),
        ({"window": True}, "window must be an integer"),
        ({"window": 0}, r"window must be in \[1, 1000000\]"),
        ({"window": 10**12}, r"window must be in \[1, 1000000\]"),
        ({"collect_timeout_s": math.nan}, r"timeout_s must be in \(0, 86400\]"),
        ({"collect_timeout_s": -1.0}, r"timeout_s must be in \(0, 86400\]"),
        ({"collect_timeout_s": math.inf}, r"timeout_s must be in \(0, 86400\]"),
        ({"collect_timeout_s": "10"}, "timeout_s must be a number"),
        ({"queue_size": 2.5}, "queue_size must be an integer"),
        ({"queue_size": 10**9}, r"queue_size must be in \[1, 1024\]"),
        ({"cuda_event_fraction": math.nan}, r"cuda_event_fraction must be in \[0, 1\]"),
        ({"cuda_event_fraction": "0.5"}, "cuda_event_fraction must be a number"),
        ({"enabled": "no"}, "enabled must be True or False"),
        ({"strict": 1}, "strict must be True or False"),
        ({"annotate": None}, "annotate must be True or False"),
        ({"log": "yes"}, "log must be True or False"),
        ({"role": 3}, "role must be a string or None"),
        ({"event_factory": 3}, "event_factory must be callable"),
        ({"out_dir": 7}, "out_dir must be a non-empty path"),
        ({"out_dir": ""}, "out_dir must be a non-empty path"),
        ({"sinks": [object()]}, "has no write, close method"),
        ({"collector": object()}, "has no submit, close method"),
    ],
)
def test_a_bad_argument_is_refused_by_name(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    settings: dict[str, Any] = {"collect": "local", "out_dir": tmp_path, **arguments}
    with pytest.raises(TimerSettingError, match=message):
        StageTimer(**settings)


def test_numpy_scalars_are_accepted_and_stored_as_python_numbers(tmp_path: Path) -> None:
    collection = CollectConfig(mode="local", out_dir=tmp_path, timeout_s=np.float32(2.0))  # type: ignore[arg-type]
    timer = StageTimer(config=TimerConfig(window=np.int64(20), collection=collection))  # type: ignore[arg-type]
    assert type(timer.window) is int and timer.window == 20
    assert type(timer.collect_config.timeout_s) is float
    timer.close()
