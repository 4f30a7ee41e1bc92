"""Every ProfilerRouter argument and every request_capture argument is checked where it is given,
with one TimerSettingError naming it: never later, as a router thread that dies (``poll_s=nan``),
a ``close()`` that raises (``capture_timeout_s=inf``), an ``OverflowError`` in StageTimer
(``max_trace_mb=inf``) or a value taken silently (``steps=1.5``, ``with_stack="no"``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from stagefrontier import CollectConfig, ProfilerRouter, StageTimer, TimerConfig, TimerSettingError
from stagefrontier.route.requests import MAX_CAPTURE_STEPS


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("steps", "5"),
        ("steps", 1.5),
        ("steps", 0),
        ("steps", True),
        ("steps", MAX_CAPTURE_STEPS + 1),
        ("cooldown_windows", -1),
        ("cooldown_windows", 2.0),
        ("max_captures", 2.5),
        ("max_captures", -1),
        ("max_trace_mb", math.inf),
        ("max_trace_mb", math.nan),
        ("max_trace_mb", 0),
        ("max_trace_mb", "200"),
        ("poll_s", math.nan),
        ("poll_s", 0.0),
        ("poll_s", 1e-6),
        ("poll_s", 0.009),
        ("poll_s", math.inf),
        ("capture_timeout_s", math.inf),
        ("capture_timeout_s", math.nan),
        ("capture_timeout_s", -1.0),
        ("with_stack", "no"),
        ("with_stack", 1),
        ("record_ops", "yes"),
        ("min_share", 1.5),
        ("min_share", -0.1),
        ("noise_factor", math.nan),
        ("noise_factor", -1.0),
        ("gates", "strict"),
        ("gates", {"share_tie": 0.1}),
        ("store", 42),
        ("store", "127.0.0.1:29500"),
    ],
)
def test_a_wrong_router_argument_is_refused_naming_it(name: str, value: Any) -> None:
    with pytest.raises(TimerSettingError, match=rf"^ProfilerRouter {name} "):
        ProfilerRouter(**{name: value})


def test_the_defaults_and_edge_values_are_accepted() -> None:
    ProfilerRouter()
    ProfilerRouter(steps=MAX_CAPTURE_STEPS, max_captures=0, cooldown_windows=0)
    ProfilerRouter(capture_timeout_s=0, poll_s=0.01, max_trace_mb=0.5, with_stack=False)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([],), "ranks"),
        (([-1],), "ranks"),
        (((0, 1),), "ranks"),
        ((["0"],), "ranks"),
        (([0.0],), "ranks"),
        (([0], -3), "steps"),
        (([0], 0), "steps"),
        (([0], 2.5), "steps"),
        (([0], 10**6), "steps"),
        (([0], None, 7), "stage"),
    ],
)
def test_a_wrong_request_capture_argument_is_refused(
    tmp_path: Any, args: tuple[Any, ...], match: str
) -> None:
    router = ProfilerRouter()
    timer = StageTimer(
        config=TimerConfig(
            window=5,
            collection=CollectConfig(mode="local", out_dir=tmp_path, log=False),
            router=router,
        )
    )
    try:
        with pytest.raises(TimerSettingError, match=rf"^request_capture {match} "):
            router.request_capture(*args)
    finally:
        timer.close()


@pytest.mark.parametrize("steps", ["0", "1000000000"])
def test_stagefrontier_capture_refuses_steps_past_the_cap_in_one_line(
    steps: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--steps 1000000000`` was sent, and profiled the rest of the run."""
    from stagefrontier.cli import main

    code = main(["capture", "--store", "127.0.0.1:1", "--ranks", "0", "--steps", steps])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"stagefrontier: error: --steps must be 1..{MAX_CAPTURE_STEPS}: {steps}\n"
